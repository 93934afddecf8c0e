"""A store is recognised by its own marker; everything else is refused in one line with rc 2.

`sakura store verify /` once printed "OK: 0 objects" and exited 0: a mistyped path passed an
integrity check. These run the real CLI on real folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.wire.store import NotAStore, Store, StoreWriter, store_format
from sakura.wire.store.layout import STORE_MARKER, TMP_DIR
from sakura.wire.store.store import LEGACY_FORMAT_VERSION, STORE_FORMAT_VERSION, stale_temp_files
from sakura.wire.store.synthetic import make_synthetic_store


def _one_error_line(r) -> str:
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    return lines[0]


@pytest.mark.parametrize("cmd", [["store", "verify"], ["store", "stats"], ["store", "gc"], ["serve"]])
def test_not_a_store_is_refused_in_one_line(tmp_path, cmd):
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    lookalike = tmp_path / "lookalike"  # an index.json alone does not make a store
    lookalike.mkdir()
    (lookalike / "index.json").write_text('{"manifests": []}')
    cases = {"/": "is not a sakura store", str(empty): "is not a sakura store", str(a_file): "is a file, not a store",
             str(lookalike): "is not a sakura store", str(tmp_path / "nope"): "does not exist"}
    for path, says in cases.items():
        line = _one_error_line(CliRunner().invoke(app, cmd + [path]))
        assert says in line and line.startswith("error:"), (path, line)
    assert not (empty / STORE_MARKER).exists() and os.listdir(empty) == []  # refusing wrote nothing


def test_the_first_build_writes_the_marker(tmp_path):
    make_synthetic_store(tmp_path / "s", templates=1, layers=2)
    marker = json.loads((tmp_path / "s" / STORE_MARKER).read_text())
    assert marker == {"schema": "sakura.store", "format_version": STORE_FORMAT_VERSION}
    assert store_format(tmp_path / "s") == STORE_FORMAT_VERSION
    r = CliRunner().invoke(app, ["store", "verify", str(tmp_path / "s")])
    assert r.exit_code == 0 and r.output.startswith("OK"), r.output


def test_a_store_built_before_the_marker_is_recognised_then_migrated(tmp_path):
    root = tmp_path / "old"
    make_synthetic_store(root, templates=1, layers=2)
    (root / STORE_MARKER).unlink()  # what today's (pre-marker) code left on disk
    assert store_format(root) == LEGACY_FORMAT_VERSION
    r = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert r.exit_code == 0 and "built before the format marker" in r.output, r.output
    assert not (root / STORE_MARKER).exists()  # verify is read-only
    r = CliRunner().invoke(app, ["store", "gc", str(root)])
    assert r.exit_code == 0, r.output
    assert store_format(root) == STORE_FORMAT_VERSION  # gc (like the next build) migrated it


def test_a_newer_or_damaged_marker_is_refused(tmp_path):
    root = tmp_path / "s"
    make_synthetic_store(root, templates=1, layers=2)
    (root / STORE_MARKER).write_text(json.dumps({"schema": "sakura.store", "format_version": 99}))
    with pytest.raises(NotAStore, match="newer than this sakura reads"):
        Store(root)
    with pytest.raises(NotAStore, match="newer"):  # and a writer does not overwrite it
        StoreWriter(root, model_fingerprint="m", template_id="t")
    (root / STORE_MARKER).write_text("garbage")
    line = _one_error_line(CliRunner().invoke(app, ["store", "stats", str(root)]))
    assert "not a sakura store marker" in line


def test_verify_lists_stale_temporaries_and_the_next_writer_removes_them(tmp_path):
    root = tmp_path / "s"
    make_synthetic_store(root, templates=1, layers=2)
    (root / TMP_DIR).mkdir(exist_ok=True)
    (root / TMP_DIR / "abc.123.tmp").write_bytes(b"half an object from a SIGKILLed build")
    r = CliRunner().invoke(app, ["store", "verify", str(root)])
    assert r.exit_code == 0 and "1 temp file(s) left by an interrupted build" in r.output, r.output
    assert ".tmp/abc.123.tmp" in r.output
    w = StoreWriter(root, model_fingerprint="m", template_id="t")  # a build's start
    try:
        assert not (root / TMP_DIR / "abc.123.tmp").exists()
        # while it writes, its temp files are in use: neither verify nor another writer touches them
        (root / TMP_DIR / "live.tmp").write_bytes(b"in use")
        assert stale_temp_files(root) is None
        w2 = StoreWriter(root, model_fingerprint="m", template_id="t2")
        w2.close()
        assert (root / TMP_DIR / "live.tmp").exists()
        r = CliRunner().invoke(app, ["store", "verify", str(root)])
        assert "a build is writing to this store now" in r.output, r.output
    finally:
        w.close()
    assert stale_temp_files(root) == [".tmp/live.tmp"]


def test_a_killed_writers_lock_is_released(tmp_path):
    """A SIGKILLed writer holds nothing afterwards: the kernel drops its flock with the process."""
    root = tmp_path / "s"
    make_synthetic_store(root, templates=1, layers=2)
    code = ("import os, sys; from sakura.wire.store import StoreWriter; "
            f"w = StoreWriter({str(root)!r}, model_fingerprint='m', template_id='t'); "
            f"open({str(root / TMP_DIR / 'dead.tmp')!r}, 'wb').write(b'x'); os.kill(os.getpid(), 9)")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == -9
    assert stale_temp_files(root) == [".tmp/dead.tmp"]
