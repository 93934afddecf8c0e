"""`sakura bench startup`: how long the command takes to answer a bad argument, in the process's
own CPU time (user + system, from ``wait4``: what the command cost, whatever else the machine was
doing) beside its wall time, for this checkout and a baseline checkout side by side.

Each case runs ``python -m sakura ...`` in a child process with ``PYTHONPATH`` set to one ``src``
folder; the rounds alternate baseline and current, case by case, so load drifts hit both alike.
The cases are issue 45's: a bad template name, an unknown model, a missing model folder, a file
given as the store, a bad photo; and `--help` for reference.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from sakura.bench.harness import get_logger, markdown_table, publish, terminal_table

log = get_logger(__name__)

#: (case, argv with {d} for the scratch folder)
CASES = (
    ("--help", ["--help"]),
    ("bad template name", ["build", "{d}/store", "--template", "no-such-template"]),
    ("unknown model", ["build", "{d}/store", "--model", "no-such-model"]),
    ("missing model folder", ["build", "{d}/store", "--model", "klein:{d}/nonexistent@512"]),
    ("file given as the store", ["build", "{d}/photo.png"]),
    ("bad photo", ["edit", "{d}/bad.png", "--server", "http://127.0.0.1:9", "--template", "x"]),
)


def _scratch() -> Path:
    d = Path(tempfile.mkdtemp(prefix="sakura-startup-"))
    Image.new("RGB", (64, 64), (200, 100, 50)).save(d / "photo.png")
    (d / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    return d


def run_once(src: Path, argv: list[str], cwd: Path) -> dict:
    """One ``python -m sakura argv`` with ``src`` first on the path: exit status, CPU s, wall s, last line."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sakura", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode(errors="replace")  # noqa: the child writes little; read it all
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = (out.strip().splitlines() or [""])[-1]
    return {"rc": proc.returncode, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "said": last[:160]}


def run(out: Path | None, *, baseline_src: Path | None, rounds: int = 3) -> dict:
    """Every case `rounds` times for this checkout (and the baseline, alternating); medians."""
    here = Path(__file__).resolve().parents[2]
    trees = {"now": here} | ({"baseline": Path(baseline_src).resolve()} if baseline_src else {})
    d = _scratch()
    runs: dict[str, dict[str, list[dict]]] = {case: {t: [] for t in trees} for case, _ in CASES}
    for r in range(rounds):
        for case, argv in CASES:
            for tree in (list(trees)[::-1] if r % 2 else list(trees)):  # alternate who goes first
                runs[case][tree].append(run_once(trees[tree], [a.format(d=d) for a in argv], d))
        log.info("round %d/%d done", r + 1, rounds)
    med = {case: {t: {"cpu_s": statistics.median(x["cpu_s"] for x in v), "wall_s": statistics.median(x["wall_s"] for x in v),
                      "rc": v[-1]["rc"], "said": v[-1]["said"]} for t, v in by.items()} for case, by in runs.items()}
    head = ["case", "rc", "CPU s", "wall s"] + (["CPU s baseline", "wall s baseline", "baseline said"] if baseline_src else []) \
        + ["says"]
    rows = []
    for case, _ in CASES:
        now = med[case]["now"]
        row = [case, now["rc"], f"{now['cpu_s']:.2f}", f"{now['wall_s']:.2f}"]
        if baseline_src:
            b = med[case]["baseline"]
            row += [f"{b['cpu_s']:.2f}", f"{b['wall_s']:.2f}", b["said"][:60]]
        rows.append(row + [now["said"][:80]])
    result = {"rounds": rounds, "baseline_src": str(baseline_src) if baseline_src else None, "python": sys.version.split()[0],
              "cpu_count": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0], "medians": med, "runs": runs}
    md = markdown_table(head, rows, align="lrrr" + ("rrl" if baseline_src else "") + "l")
    log.info("%s", terminal_table(head, rows, align="lrrr" + ("rrl" if baseline_src else "") + "l"))
    return publish(out, "startup", result, f"# Start-up: bad arguments answered\n\n{md}\n")
