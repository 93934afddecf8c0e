"""The native decoder's fuzz corpus replayed under AddressSanitizer + UndefinedBehaviorSanitizer:
the wire-format vectors as case files (the fuzzer's seeds), the inputs earlier fuzz runs kept
(native/fuzz/corpus/) and the regression inputs of fixed findings (native/fuzz/regressions/), each
run once by the libFuzzer target (`sakura bench fuzz` runs the fuzzer itself; a short run here).
Skips where clang (with libFuzzer) or make is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("clang") is None or shutil.which("make") is None,
                                reason="no clang / make for the sanitizer build (apt-get install clang; .ci/run does)")


@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory):
    """The sanitizer build of the fuzz target, once for the module -> its build folder."""
    from sakura.bench import native_fuzz as NF

    build = tmp_path_factory.mktemp("fuzz") / "build"
    try:
        NF.build(build)
    except RuntimeError as e:
        if "fuzzer" in str(e) and "not found" in str(e):
            pytest.skip(f"clang without libFuzzer: {e}")
        raise
    return build


def test_corpus_replays_clean_under_asan_and_ubsan(tmp_path, fuzz_build):
    from sakura.bench import native_fuzz as NF

    binary = NF.build(fuzz_build)   # (built: make has nothing to do)
    seeds = NF.seed_corpus(tmp_path / "seeds")
    dirs = [tmp_path / "seeds"] + [d for d in (NF.CORPUS, NF.REGRESSIONS) if d.is_dir() and any(d.iterdir())]
    res = NF.replay(binary, dirs)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error" not in out, out[-4000:]
    assert "INITED" in out, out[-2000:]   # every input of the corpus ran once


def test_a_truncated_and_a_flipped_case_end_in_status_codes(tmp_path):
    """The case runner's own contract, on the C runner (no sanitizers needed): every prefix of a
    case and byte flips give a status line, never a crash."""
    from sakura.bench.wirevectors import DOCS_DIR, native_cases

    res = subprocess.run(["make", "-C", str(ROOT / "native"), f"BUILD={tmp_path / 'b'}"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    case = next(f for f in native_cases(ROOT / DOCS_DIR, tmp_path / "cases") if "progressive-v5-1" in f.name)
    data = case.read_bytes()
    bad = []
    for i, cut in enumerate(range(0, len(data), max(1, len(data) // 40))):
        f = tmp_path / f"cut{i}.case"
        f.write_bytes(data[:cut])
        bad.append(f)
    for i in range(40):
        b = bytearray(data)
        b[(i * 7919) % len(b)] ^= 1 << (i % 8)
        f = tmp_path / f"flip{i}.case"
        f.write_bytes(bytes(b))
        bad.append(f)
    out = subprocess.run([str(tmp_path / "b" / "skn_vectors"), *map(str, bad)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode in (0, 1), out.stderr[-2000:]      # 1: some cases failed (as they should), no signal
    assert out.stdout.count("\n") >= len(bad) + 1 and f"{len(bad)} cases" in out.stdout


def test_a_short_fuzz_run_reports_executions_findings_and_corpus(tmp_path, fuzz_build):
    """`sakura bench fuzz`'s run, 300 executions: it counts them, finds nothing, and the corpus it
    reports holds at least the seeds."""
    from typer.testing import CliRunner

    from sakura.bench import native_fuzz as NF
    from sakura.cli.main import app

    rep = NF.run(300, tmp_path / "out", build_dir=fuzz_build, log=lambda _m: None)
    assert rep["executions"] >= 300, rep
    assert rep["findings"] == [] and rep["exit_code"] == 0, rep
    assert rep["corpus_after"] >= 1 and rep["seed_inputs"] >= 1, rep
    assert (tmp_path / "out" / "fuzz.json").is_file()
    res = CliRunner().invoke(app, ["bench", "fuzz", "--help"])
    assert res.exit_code == 0 and "--runs" in res.output, res.output
