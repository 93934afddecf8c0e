"""`BuildReport` tells the truth (issue 41): processes, threads, wall and CPU seconds per template,
calibration edits; an unchanged template is skipped (said so, under a second, nothing written),
`force` rebuilds, a changed setting rebuilds; `sakura build --json`; predicted figures marked."""

from __future__ import annotations

import json
import os

import pytest

from sakura.cloud.builder.api import build
from sakura.wire.store import Store

LADDER = ["uniform:bits=8", "progressive"]
KW = dict(ladder=LADDER, calibration=1, steps=2, workers=1, probe_workers=1, progress=False)


def _snapshot(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if not f.startswith("."):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = (os.stat(p).st_mtime_ns, os.stat(p).st_ino)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    lines: list[str] = []
    rep = build(root, ["look-00"], log=lines.append, **KW)
    return root, rep, lines


def test_report_fields(built):
    _root, rep, lines = built
    assert rep.ok and rep.executor == "local" and rep.processes == 1 and rep.threads == 1
    (b,) = rep.builds
    assert b.id == "look-00" and b.status == "built" and b.allocation == "model"
    assert b.seconds > 0 and b.cpu_seconds > 0 and rep.seconds >= b.seconds and rep.cpu_seconds > 0
    # one calibration photo here: its differentiable edit (1) + 8 backward passes (2 each) + 1
    # acceptance edit + one figure check (with the default two photos the probes go per photo:
    # 2 + 8 + 1 + 1 = 12, checked by `sakura bench build-speed`)
    assert b.calibration_edits == 1 + 2 * 8 + 1 + 1
    (check,) = b.figure_checks
    assert check["predicted_image_mse"] > 0 and check["measured_image_mse"] > 0
    assert len(b.ladder_trials) == 1
    assert any("calibration edits" in line for line in lines)
    j = rep.to_json()
    assert j["templates"][0]["id"] == "look-00" and j["templates"][0]["calibration_edits"] == b.calibration_edits
    assert json.loads(json.dumps(j)) == j


def test_predicted_figures_are_marked(built):
    root, _rep, _lines = built
    st = Store(root)
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    flags = [r.distortion.get("image_predicted") for s in m.shards for r in s.renditions]
    assert flags.count(None) == 1 and flags.count(1.0) == len(flags) - 1  # the one measured check
    assert all(s.quality_floor.get("predicted") is True for s in m.shards)
    assert m.kv_layout["build_key"]


def test_unchanged_template_is_skipped_and_force_rebuilds(built):
    root, _rep, _lines = built
    before = _snapshot(root)
    lines: list[str] = []
    rep = build(root, ["look-00"], log=lines.append, **KW)
    (b,) = rep.builds
    assert b.status == "skipped" and b.calibration_edits == 0 and b.seconds < 1.0
    # decided by the source key, before the model loads
    assert any("skipped (current" in line and "model not loaded" in line and "--force" in line for line in lines)
    assert _snapshot(root) == before
    # a changed setting is not current: rebuilt
    rep = build(root, ["look-00"], **{**KW, "steps": 1})
    assert rep.builds[0].status == "built"
    rep = build(root, ["look-00"], **{**KW, "steps": 1})
    assert rep.builds[0].status == "skipped"
    rep = build(root, ["look-00"], force=True, **{**KW, "steps": 1})
    assert rep.builds[0].status == "built" and rep.builds[0].calibration_edits > 0


def test_other_weight_files_load_the_model_and_the_build_key_decides(built, tmp_path):
    """The same weights under another path: not the recorded source, so the model loads; its
    fingerprint (the weights, hashed) is the same, so the build key finds the template current."""
    import shutil

    from sakura.models import MINI_WEIGHTS

    root, _rep, _lines = built
    build(root, ["look-00"], **KW)  # current again with KW's settings (the test before changed them)
    copy = tmp_path / "mini.safetensors"
    shutil.copyfile(MINI_WEIGHTS, copy)
    lines: list[str] = []
    before = _snapshot(root)
    rep = build(root, ["look-00"], model=f"sakura-mini:{copy}", log=lines.append, **KW)
    assert rep.builds[0].status == "skipped"
    assert any("skipped, unchanged" in line for line in lines) and not any("model not loaded" in x for x in lines)
    assert _snapshot(root) == before


def test_skip_of_an_unchanged_store_imports_no_torch(built):
    """`sakura build` on an unchanged store: the whole command without torch or the model."""
    import subprocess
    import sys

    root, _rep, _lines = built
    build(root, ["look-00"], **KW)
    code = ("import sys; from sakura.cli.main import app\n"
            f"sys.argv = ['sakura', 'build', {str(root)!r}, '--template', 'look-00', '--ladder', {LADDER[0]!r},"
            f" '--ladder', {LADDER[1]!r}, '--calibration', '1', '--steps', '2', '--workers', '1', '--quiet']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False", r.stdout
    assert "look-00: skipped (current" in r.stdout + r.stderr


def test_default_template_ids_are_the_librarys():
    from sakura.cloud.builder.incremental import DEFAULT_TEMPLATE_IDS
    from sakura.cloud.tasks import TASK_NAMES

    assert list(DEFAULT_TEMPLATE_IDS) == [f"{t}-00" for t in TASK_NAMES]


def test_cli_json(built):
    from typer.testing import CliRunner

    from sakura.cli.main import app

    root, _rep, _lines = built
    r = CliRunner().invoke(app, ["build", str(root), "--template", "look-00", "--ladder", LADDER[0], "--ladder",
                                 LADDER[1], "--calibration", "1", "--steps", "2", "--workers", "1", "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout[r.stdout.index("{"):])
    assert [t["id"] for t in j["templates"]] == ["look-00"]
    assert {"calibration_edits", "seconds", "cpu_seconds", "status"} <= set(j["templates"][0])
    assert {"processes", "threads", "seconds", "cpu_seconds"} <= set(j)
