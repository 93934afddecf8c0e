"""Fuzz libsakura_decode: its libFuzzer target under AddressSanitizer + UndefinedBehaviorSanitizer
(native/fuzz/skn_fuzz.c, built with clang by `make -C native fuzz`) for a stated number of
executions, from the saved corpus (native/fuzz/corpus: the wire-format vectors as case files, and
what earlier runs kept), and report the executions run, the findings (crash / leak / UB inputs
libFuzzer wrote) and the corpus size.

    sakura bench fuzz --runs 200000 [--out out/fuzz] [--save]
    (or python -m sakura.bench.native_fuzz, same options)

`--save` merges the inputs that found new coverage into native/fuzz/corpus (libFuzzer's
-merge=1: only those that add coverage), which CI replays under the sanitizers
(tests/sakura/codec/test_native_fuzz.py). A finding is fixed with its input added to
native/fuzz/regressions/ (replayed the same way).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable
import argparse
from sakura.bench.wirevectors import DOCS_DIR, native_cases
from sakura.bench.harness import get_logger

_LOG = get_logger(__name__)

ROOT = Path(__file__).resolve().parents[3]
NATIVE = ROOT / "native"
CORPUS = NATIVE / "fuzz" / "corpus"
REGRESSIONS = NATIVE / "fuzz" / "regressions"
MAX_LEN = 1 << 17          # bytes per input (the big-layout seeds are ~40-100 KB)
SEED_MAX_BYTES = MAX_LEN   # vector cases larger than this are not seeds
CORPUS_BYTES = 400_000     # the saved corpus keeps the smallest merged inputs up to this many bytes


def build(build_dir: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Build the fuzz target (clang, ASan + UBSan + libFuzzer) -> its path."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    build_dir = build_dir or NATIVE / "build"
    if shutil.which("clang") is None or shutil.which("make") is None:
        raise RuntimeError("the fuzz target needs clang and make (apt-get install clang)")
    res = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={build_dir}", "fuzz"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the fuzz target failed:\n{res.stderr[-3000:]}")
    return Path(build_dir) / "fuzz" / "skn_fuzz"


def seed_corpus(out: Path) -> list[Path]:
    """The wire-format vectors as case files (`wirevectors.native_cases`), those up to MAX_LEN."""
    files = native_cases(ROOT / DOCS_DIR, out)
    keep = [f for f in files if f.stat().st_size <= SEED_MAX_BYTES]
    for f in files:
        if f not in keep:
            f.unlink()
    return keep


def replay(binary: Path, dirs: list[Path], timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run every input of `dirs` once under the sanitizers (libFuzzer's -runs=0)."""
    return subprocess.run([str(binary), "-runs=0", f"-max_len={MAX_LEN}", *map(str, dirs)],
                          capture_output=True, text=True, timeout=timeout)


def run(runs: int, out: Path, save: bool = False, seed: int = 1, log: Callable[[str], None] | None = None,
        build_dir: Path | None = None) -> dict:
    """Fuzz `runs` executions from the saved corpus and the vectors -> the report (also out/fuzz.json):
    executions, findings (file names under out/findings), seed inputs, corpus after, coverage."""
    log = log or _LOG.info  # the module's logger unless the caller gives a sink
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    binary = build(build_dir, log=log)
    with tempfile.TemporaryDirectory(prefix="skn-fuzz-") as tmp:
        work = Path(tmp) / "corpus"
        work.mkdir()
        for d in (CORPUS, REGRESSIONS):
            if d.is_dir():
                for f in d.iterdir():
                    shutil.copy(f, work / f.name)
        seeds = seed_corpus(Path(tmp) / "seeds")
        artifacts = out / "findings"
        artifacts.mkdir(exist_ok=True)
        before = len(list(work.iterdir())) + len(seeds)
        t0 = time.perf_counter()
        res = subprocess.run([str(binary), f"-runs={runs}", f"-seed={seed}", f"-max_len={MAX_LEN}",
                              "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(work), str(Path(tmp) / "seeds")],
                             capture_output=True, text=True)
        wall = time.perf_counter() - t0
        text = res.stderr + res.stdout
        (out / "fuzz.log").write_text(text)
        done = re.findall(r"Done (\d+) runs", text)
        stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", text))
        cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)/", text)
        findings = sorted(p.name for p in artifacts.iterdir())
        corpus_after = len(list(work.iterdir()))
        if save:
            CORPUS.mkdir(parents=True, exist_ok=True)
            merged = Path(tmp) / "merged"
            merged.mkdir()
            subprocess.run([str(binary), "-merge=1", f"-max_len={MAX_LEN}", str(merged), str(CORPUS), str(work),
                            str(Path(tmp) / "seeds")], capture_output=True, text=True)
            for f in CORPUS.iterdir():
                f.unlink()
            # the seeds are the vectors (regenerated for every replay): only what fuzzing added is saved
            seed_bytes = {f.read_bytes() for f in (Path(tmp) / "seeds").iterdir()}
            total = 0
            for f in sorted(merged.iterdir(), key=lambda f: (f.stat().st_size, f.name)):
                if f.read_bytes() not in seed_bytes and total + f.stat().st_size <= CORPUS_BYTES:
                    total += f.stat().st_size
                    shutil.copy(f, CORPUS / f.name)
    report = {"executions": int(stats.get("number_of_executed_units", done[-1] if done else 0)),
              "runs_asked": runs, "seconds": round(wall, 1),
              "execs_per_s": round(int(stats.get("number_of_executed_units", 0)) / wall, 1) if wall else None,
              "exit_code": res.returncode, "findings": findings, "seed_inputs": before,
              "corpus_after": corpus_after, "coverage_edges": int(cov[-1][0]) if cov else None,
              "features": int(cov[-1][1]) if cov else None,
              "saved_corpus_files": len(list(CORPUS.iterdir())) if CORPUS.is_dir() else 0,
              "sanitizers": "address,undefined (libFuzzer, clang)", "max_len": MAX_LEN}
    (out / "fuzz.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"fuzz: {report['executions']:,} executions in {wall:.0f} s ({report['execs_per_s']}/s), "
        f"{len(findings)} findings{': ' + ', '.join(findings) if findings else ''}, corpus {before} -> "
        f"{corpus_after} inputs, {report['coverage_edges']} coverage edges; saved corpus "
        f"{report['saved_corpus_files']} files")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sakura.bench.native_fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100_000, help="executions (default 100,000)")
    ap.add_argument("--out", type=Path, default=Path("out/fuzz"), help="folder for fuzz.json, fuzz.log, findings/")
    ap.add_argument("--save", action="store_true", help="merge new coverage into native/fuzz/corpus")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rep = run(a.runs, a.out, save=a.save, seed=a.seed)
    return 1 if rep["findings"] or rep["exit_code"] not in (0,) else 0


if __name__ == "__main__":
    raise SystemExit(main())
