"""Privacy through the real `sakura edit` path: two different photos, a recording relay on
127.0.0.1 between the phone and the server. What crosses the wire must not depend on the photo:
identical requests (method, path, Range, every header) and no photo-derived bytes, raw or
compressed. Covers the gallery refresh, the default policy and a policy that fetches every shard."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from skimage import io as skio
from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.emulation.faults import hostile_in_thread
from sakura.wire.server import serve_in_thread
from sakura.cloud.builder.pipeline import build_store

pytestmark = pytest.mark.timeout(300)
runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pstore")
    build_store(root, templates=["sticker-00"], ladder=["lossless", "progressive"], calibration=1, steps=1,
                log=lambda s: None)
    return root


@pytest.fixture
def pinned_profile(monkeypatch):
    """The planner's device rates, fixed: `profile_model` measures this machine's timing, which
    varies from run to run and would make the plan (so the requests) differ for reasons that have
    nothing to do with the photo. Everything else is the real edit path."""
    import sakura.phone.live as live

    real = live.profile_model
    box = {}

    def fixed(model, repeats=3):
        if "p" not in box:
            box["p"] = real(model, repeats=1)
        return box["p"]

    monkeypatch.setattr(live, "profile_model", fixed)


def _photos(tmp_path):
    rng = np.random.default_rng(7)
    a = (rng.random((80, 96, 3)) * 255).astype("uint8")
    yy, xx = np.mgrid[0:80, 0:96]
    b = np.stack([(xx * 2) % 256, (yy * 3) % 256, ((xx + yy) * 5) % 256], -1).astype("uint8")
    paths = []
    for name, px in (("a.png", a), ("b.png", b)):
        p = tmp_path / name
        skio.imsave(str(p), px, check_contrast=False)
        paths.append((p, px))
    return paths


def _needles(path, px) -> list[bytes]:
    """Byte strings any leak of the photo would contain: slices of its file, its pixels as uint8
    and float32 (what the model sees), and those compressed."""
    from sakura.phone.photo import load_photo

    raw = path.read_bytes()
    f32 = load_photo(path, 64).numpy().astype("<f4").tobytes()
    blobs = [raw, px.tobytes(), f32, zlib.compress(px.tobytes()), zlib.compress(f32)]
    out = []
    for b in blobs:
        step = max(1, len(b) // 24)
        out += [b[i:i + 12] for i in range(0, len(b) - 12, step)]
    # a 12-byte slice of all zeros / one value could appear in any binary by chance: skip those
    return [n for n in out if len(set(n)) > 3]


def _sequence(requests):
    return [(r.method, r.path, r.headers) for r in requests]


@pytest.mark.parametrize("policy", ["sakura", "raw-stream"])
def test_two_photos_make_identical_requests(store, tmp_path, pinned_profile, policy):
    (pa, pxa), (pb, pxb) = _photos(tmp_path)
    seqs, traffic = [], []
    with serve_in_thread(store) as url, hostile_in_thread(url, "record") as (relay, rec):
        # one relay for both photos, so the Host header (its port) is the same
        for i, photo in enumerate((pa, pb)):
            start = len(rec.requests)
            res = runner.invoke(app, ["edit", str(photo), "--server", relay, "--template", "sticker-00",
                                      "--out", str(tmp_path / f"out{i}.png"), "--steps", "2", "--policy", policy,
                                      "--gallery", str(tmp_path / f"gallery{i}")])  # fresh gallery: refresh fetches
            assert res.exit_code == 0, res.output
            reqs = rec.requests[start:]
            seqs.append(reqs)
            traffic.append(b"".join(r.raw for r in reqs))
    a, b = seqs
    assert a and len(a) >= 2  # at least the gallery refresh: manifest + template reference
    # the gallery refresh comes first and in order; shard requests run concurrently on several
    # connections, so their interleaving is the scheduler's, not the photo's: compared as multisets
    assert _sequence(a[:2]) == _sequence(b[:2])
    assert sorted(_sequence(a), key=repr) == sorted(_sequence(b), key=repr)
    if policy == "raw-stream":
        assert sum(r.path.startswith("/objects/") for r in a) >= 1 + 6  # template ref + every shard
    names = {k.lower() for r in a + b for k, _ in r.headers}
    assert names <= {"host", "user-agent", "accept", "accept-encoding", "range", "if-range", "if-none-match"}
    assert all(r.method in ("GET", "HEAD") for r in a + b)
    for path, px in ((pa, pxa), (pb, pxb)):
        needles = _needles(path, px)
        assert len(needles) > 50
        for t in traffic:
            assert not any(n in t for n in needles)
