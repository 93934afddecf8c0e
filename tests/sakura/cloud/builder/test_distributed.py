"""`sakura build --executor ray` on a local 2-CPU Ray cluster: resumable (a current manifest is
skipped, objects of an interrupted build are reused), a worker killed mid-template loses no
committed work and the task is retried, and the store is byte-identical to a local build."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from sakura.wire.store import Store
from sakura.cloud.builder.distributed import build_templates, manifest_is_current

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install '.[cluster]')")

LADDER = ["uniform:bits=8"]  # cheap codec: the test is about orchestration, not encoding
OPTS = dict(ladder=LADDER, calibration=1, steps=1, progress=False, log=lambda s: None)
NAMES = ["look-00", "texture-00", "sticker-00"]


@pytest.fixture(scope="module")
def cluster():
    # address="local": our own cluster even if another one runs on this shared machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _tree(root):
    """relpath -> (bytes, mtime_ns; an object's inode) of every served file (not .tmp / .lock)."""
    out = {}
    for d, dirs, fs in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in fs:
            if not f.startswith("."):
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    rel, st = os.path.relpath(p, root), os.stat(p)
                    # an object's inode proves it was not rewritten; its mtime is refreshed on reuse
                    # (so gc sees it as young: issue 35 item 2)
                    out[rel] = (fh.read(), st.st_ino if rel.startswith("objects") else st.st_mtime_ns)
    return out


def _descends_from_me(pid: int) -> bool:
    """Only kill a Ray worker of the cluster this test started (its raylet is our child)."""
    me = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == me:
            return True
    return False


def _kill_first_build_task(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first worker that has been running `_build_one` (Ray names the process
    ray::_build_one) for over a second: past the skip check (milliseconds for a current template),
    i.e. while it imports the model and encodes."""
    deadline = time.monotonic() + 60
    first_seen: dict[int, float] = {}
    while not stop.is_set() and time.monotonic() < deadline:
        now = time.monotonic()
        busy = set()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if cmd.startswith(b"ray::_build_one") and _descends_from_me(int(d)):
                busy.add(int(d))
        first_seen = {p: first_seen.get(p, now) for p in busy}  # forget workers that went idle
        for pid, t in first_seen.items():
            if now - t >= 1.0:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.01)


def test_resumable_build_survives_a_killed_worker_and_matches_local(cluster, tmp_path):
    store = tmp_path / "ray"
    # 1. a committed template from an earlier run, and an interrupted one (objects, no manifest)
    first = build_templates(store, templates=NAMES[:2], executor="local", **OPTS)
    assert first.by_status("built") == NAMES[:2]
    fp = Store(store).manifest_keys()[0][0]
    interrupted = store / "manifests" / fp / "texture-00.json"
    interrupted.unlink()
    assert manifest_is_current(store, fp, "look-00", LADDER) and not manifest_is_current(store, fp, "texture-00", LADDER)
    assert not manifest_is_current(store, fp, "look-00", ["uniform:bits=4"])  # another ladder is not current
    before = _tree(store)

    # 2. the distributed build, with one worker SIGKILLed while it is building a template
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first_build_task, args=(stop, killed), daemon=True)
    killer.start()
    try:
        rep = build_templates(store, templates=NAMES, executor="ray", **OPTS)
    finally:
        stop.set()
        killer.join(5)
    assert killed, "no build task was seen running (nothing was killed)"
    assert rep.ok, rep.builds
    assert rep.by_status("skipped") == ["look-00"]
    assert sorted(rep.by_status("built")) == ["sticker-00", "texture-00"]
    assert all(b.worker and b.cpu_seconds > 0 for b in rep.builds if b.status == "built")
    after = _tree(store)
    # committed work untouched; the interrupted build's objects reused, not rewritten
    for rel, (data, mtime) in before.items():
        if rel != "index.json":
            assert after[rel] == (data, mtime), rel
    v = Store(store).verify()
    assert v.ok and v.orphans == [], (v.problems, v.orphans)

    # 3. same bytes as a local build of the same templates
    local = tmp_path / "local"
    build_templates(local, templates=NAMES, executor="local", **OPTS)
    assert {k: v[0] for k, v in _tree(local).items()} == {k: v[0] for k, v in after.items()}

    # 4. a rerun skips everything and writes nothing
    again = build_templates(store, templates=NAMES, executor="ray", **OPTS)
    assert again.by_status("skipped") == NAMES and _tree(store) == after


def test_a_failing_template_is_reported_and_the_rest_commit(cluster, tmp_path):
    with pytest.raises(ValueError):  # bad inputs fail in the driver, before any task
        build_templates(tmp_path, templates=["look-00"], executor="ray", **{**OPTS, "ladder": ["no-such-codec"]})
    with pytest.raises(ValueError, match="no template named"):
        build_templates(tmp_path, templates=["nope-00"], executor="ray", **OPTS)
    # a template whose commit fails inside its task (its manifest path is a directory)
    from sakura.models import load_model

    fp = load_model("sakura-mini").fingerprint()
    (tmp_path / "manifests" / fp / "sticker-00.json").mkdir(parents=True)
    rep = build_templates(tmp_path, templates=["look-00", "sticker-00"], executor="ray", **OPTS)
    assert not rep.ok
    assert rep.by_status("built") == ["look-00"] and rep.by_status("failed") == ["sticker-00"]
    assert "IsADirectoryError" in rep.builds[1].error
    assert Store(tmp_path).verify_manifest(fp, "look-00") == []
