"""The CLI: every command has --help, and the demo runs end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sakura.cli.main import app

runner = CliRunner()


def test_help_lists_commands():
    res = subprocess.run([sys.executable, "-m", "sakura", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for cmd in ("demo", "build", "serve", "edit", "bench", "train", "info"):
        assert cmd in res.stdout


@pytest.mark.parametrize("cmd", ["demo", "build", "serve", "edit", "bench", "train", "info"])
def test_every_command_has_help(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_demo_end_to_end(tmp_path):
    from sakura.emulation import traces_root

    if traces_root() is None:
        pytest.skip("SAKURA_TRACES names no folder (unset, the bundled traces serve)")
    res = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["injected_kv_equals_in_sequence_torch_equal"] is True
    for f in summary["outputs"]:  # every file the demo says it writes (docs/demo.md lists the same)
        p = tmp_path / f.replace("<template>", "sticker-00").rstrip("/")
        assert p.is_dir() if f.endswith("/") else p.stat().st_size > 500, f
    listed = set((Path(__file__).parents[2] / "docs/demo.md").read_text().replace("`", " ").replace("|", " ").split())
    assert {f.replace("<template>", "sticker-00") for f in summary["outputs"]} <= listed, "docs/demo.md lists them"
    # the spread: every run of every live method, and the equal-quality ratio per run
    runs = summary["repeats"]
    assert runs >= 2 and all(len(v) == runs for m, v in summary["live_over_sim_runs"].items() if m != "oracle")
    assert len(summary["equal_quality_ratio_runs"]["cachegen-L3 / sakura"]) == runs
    # the oracle row is its ceiling, never above it
    oracle_row = next(line for line in (tmp_path / "demo.md").read_text().splitlines() if line.startswith("| oracle"))
    assert f"{summary['ceilings']['vs on-device']:.2f} (= ceiling" in oracle_row
    lat = summary["latency_phone_s"]
    # the workload's ceiling holds: nothing beats free, instant KV by more than timing noise
    assert lat["sakura"] >= lat["on-device"] / summary["ceilings"]["vs on-device"] * 0.9
    assert summary["psnr_vs_lossless_db"]["sakura"] > 25


def test_info_rejects_unknown_model():
    res = runner.invoke(app, ["info", "--model", "nope"])
    assert res.exit_code == 2
    assert "unknown model 'nope'" in res.output


def test_version():
    import sakura

    res = subprocess.run([sys.executable, "-m", "sakura", "--version"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"sakura-kv {sakura.__version__}", res


# Each bad argument answers before torch, numba or a model loads (issue 45: they took 4-27 s):
# the command runs in a child that reports, at exit, which heavy modules it had imported.
_REPORT_HEAVY = ("import atexit, sys; atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'numba', "
                 "'diffusers', 'numpy') if m in sys.modules), file=sys.stderr)); from sakura.cli.main import main; "
                 "main(sys.argv[1:])")


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)  # a PNG signature, then garbage
    (d / "a-file").write_text("not a store")
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 120, 40)).save(d / "good.png")
    return d


@pytest.mark.parametrize("args, says", [
    (["build", "{d}/store", "--template", "no-such-template"], "no template named 'no-such-template'"),
    (["build", "{d}/store", "--template", "look-09"], "no template named 'look-09'"),
    (["build", "{d}/store", "--model", "nope"], "unknown model 'nope'"),
    (["build", "{d}/store", "--model", "klein:/nonexistent@512"], "/nonexistent: not a local folder"),
    (["build", "{d}/store", "--model", "kontext:{d}/missing"], "missing: not a local folder"),
    (["build", "{d}/a-file"], "a-file: is a file, not a store folder"),
    (["build", "{d}/store", "--template", "mine={d}/photo.png", "--task", "look"], "not a readable image"),
    (["edit", "{d}/photo.png", "--server", "http://127.0.0.1:9", "--template", "x"], "not a readable image"),
    (["edit", "{d}/nothing.png", "--server", "http://127.0.0.1:9", "--template", "x"], "no such photo"),
    (["edit", "{d}/good.png", "--server", "http://127.0.0.1:9", "--model", "nope"], "unknown model 'nope'"),
    (["info", "--model", "klein:{d}/missing@64"], "missing: not a local folder"),
])
def test_bad_arguments_answer_before_anything_heavy_loads(bad_inputs, args, says):
    argv = [a.format(d=bad_inputs) for a in args]
    res = subprocess.run([sys.executable, "-c", _REPORT_HEAVY, *argv], capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and says in lines[0], lines
    assert lines[1] == "HEAVY []", lines  # nothing heavy was imported to say it


def test_library_names_known_to_the_cli_are_the_librarys():
    pytest.importorskip("skimage", reason="the library's templates are drawn from the [build] extra's photos")
    from sakura.cli.precheck import LIBRARY_TASKS, library_names
    from sakura.cloud.tasks import TASK_NAMES, template_library

    assert tuple(TASK_NAMES) == LIBRARY_TASKS
    assert sorted(library_names()) == sorted(t.name for t in template_library(16))


def test_demo_without_traces_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SAKURA_TRACES", str(tmp_path / "no-such-folder"))
    res = subprocess.run([sys.executable, "-m", "sakura", "demo", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "SAKURA_TRACES" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_an_unreachable_server_is_one_human_line():
    """No ConnectionKey(...) dump: the host, the port and why, in one line (rc 2)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "sakura", "templates", "--server", f"http://127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == (f"error: cannot list the templates of http://127.0.0.1:{port}: cannot connect to "
                                  f"127.0.0.1:{port} (Connection refused)"), res.stderr


def test_a_sticker_drawn_on_white_is_warned_about(tmp_path):
    """Issue 45: a yellow star on white built without a word, then every edit pasted the white
    square over the photo. The build now says what the sticker task expects (and still builds)."""
    from PIL import Image, ImageDraw

    from sakura.cli.precheck import STICKER_KEY_RGB8, sticker_image_warnings
    from sakura.cloud.tasks.edits import KEY

    assert STICKER_KEY_RGB8 == tuple(round(255 * c) for c in KEY)
    star = [(32, 4), (40, 26), (62, 26), (44, 40), (50, 62), (32, 48), (14, 62), (20, 40), (2, 26), (24, 26)]
    for name, ground in (("white", "white"), ("green", STICKER_KEY_RGB8), ("clear", (0, 0, 0, 0))):
        im = Image.new("RGBA", (64, 64), ground)
        ImageDraw.Draw(im).polygon(star, fill="yellow")
        im.save(tmp_path / f"{name}.png")
    (line,) = sticker_image_warnings([f"star={tmp_path / 'white.png'}"], "sticker")
    assert "key colour (pure green, #00ff00)" in line and "#ffffff" in line and "paste the whole image" in line
    assert sticker_image_warnings([f"star={tmp_path / 'green.png'}", f"s2={tmp_path / 'clear.png'}"], "sticker") == []
    assert sticker_image_warnings([f"star={tmp_path / 'white.png'}"], "look") == []
