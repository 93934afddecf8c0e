"""The streaming runtime end to end on loopback: real store, real HTTP server, real client,
real codec, real model forward pass. Streamed lossless KV must give the bit-identical image."""

import asyncio
import contextlib
import threading

import pytest
import torch

from sakura.models import load_model
from sakura.runtime import BandwidthEstimator
from sakura.runtime.stream import CacheGenPolicy, DeviceProfile, FixedPolicy, MPCPolicy, profile_model, streamed_edit
from sakura.server import serve_in_thread
from sakura.store.build import build_store
from sakura.tasks import get_template, heldout_photos

LADDER = ["lossless", "uniform:bits=8", "layered:budgets=[1.0,2.0]"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    build_store(root, templates=["sticker-00"], ladder=LADDER, calibration=1, steps=1, log=lambda s: None)
    model = load_model("sakura-mini")
    tpl = get_template("sticker-00", model.cfg.image_size)
    photo = heldout_photos(model.cfg.image_size)[:1]
    with serve_in_thread(root) as url:
        yield model, tpl, photo, url


def _edit(setup, policy, **kw):
    model, tpl, photo, url = setup
    return streamed_edit(model, photo, base_url=url, template_id="sticker-00", template_image=tpl.image[None],
                         instruction=tpl.instruction, policy=policy, profile=profile_model(model, repeats=1),
                         steps=2, **kw)


def test_raw_stream_is_bit_exact(setup):
    model, tpl, photo, _ = setup
    res = _edit(setup, FixedPolicy("lossless"))
    local = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    want = model.edit(photo, template_kv=local, steps=2).image
    assert torch.equal(res.image, want)
    assert all(r.choice == "lossless" for r in res.records)
    assert res.bytes_fetched == sum(r.nbytes for r in res.records) > 0
    b = res.breakdown()
    assert b["latency_s"] >= b["stall_s"] >= 0


def test_all_local_equals_on_device_edit(setup):
    """A quality budget nothing meets (and a hopeless link) forces the local prefix everywhere."""
    model, tpl, photo, _ = setup
    res = _edit(setup, MPCPolicy(max_distortion=-1.0))
    assert all(r.choice == "local" for r in res.records)
    assert res.bytes_fetched == 0
    want = model.edit(photo, template=tpl.image[None], instruction=tpl.instruction, steps=2).image
    assert torch.equal(res.image, want)


def test_slow_estimate_prefers_local_fast_estimate_fetches(setup):
    slow = _edit(setup, MPCPolicy(), estimator=BandwidthEstimator(prior_bps=1e3))
    assert slow.records[0].choice == "local"
    fast = _edit(setup, MPCPolicy(), estimator=BandwidthEstimator(prior_bps=1e10))
    assert fast.records[-1].choice != "local"
    assert torch.isfinite(fast.image).all()


def test_cachegen_policy_picks_levels(setup):
    res = _edit(setup, CacheGenPolicy(levels=("uniform:bits=8", "layered:budgets=[1.0,2.0]#1",
                                              "layered:budgets=[1.0,2.0]#0"), target_s=10.0),
                estimator=BandwidthEstimator(prior_bps=1e9))
    assert all(r.choice == "uniform:bits=8" for r in res.records)


def test_unknown_template_fails_cleanly(setup):
    model, tpl, photo, url = setup
    with pytest.raises(RuntimeError, match="streaming failed"):
        streamed_edit(model, photo, base_url=url, template_id="look-05", template_image=tpl.image[None],
                      instruction=tpl.instruction, policy=FixedPolicy("lossless"),
                      profile=DeviceProfile(compute_s=0.001, local_s=0.001), steps=1, timeout_s=20)


class RecordingProxy:
    """A TCP relay on 127.0.0.1 that keeps every byte the phone sends towards the server."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.sent = bytearray()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()

    async def _pipe(self, r, w, record):
        try:
            while data := await r.read(65536):
                if record:
                    self.sent += data
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def _client(self, cr, cw):
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(cr, uw, True), self._pipe(ur, cw, False))

    def run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    @contextlib.contextmanager
    def running(self):
        th = threading.Thread(target=self.run, daemon=True)
        th.start()
        self.ready.wait(10)
        try:
            yield f"http://127.0.0.1:{self.port}"
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            th.join(10)


def test_privacy_nothing_of_the_photo_reaches_the_server(setup):
    model, tpl, _, url = setup
    # a marker photo: a recognisable byte pattern in every encoding we could plausibly leak
    marker = torch.full((1, 3, model.cfg.image_size, model.cfg.image_size), 0.123456789)
    proxy = RecordingProxy(int(url.rsplit(":", 1)[1]))
    with proxy.running() as purl:
        res = streamed_edit(model, marker, base_url=purl, template_id="sticker-00", template_image=tpl.image[None],
                            instruction=tpl.instruction, policy=FixedPolicy("lossless"),
                            profile=DeviceProfile(compute_s=0.001, local_s=0.001), steps=1)
    sent = bytes(proxy.sent)
    assert res.bytes_fetched > 0 and len(sent) > 0  # the phone did talk to the server
    raw = marker.numpy().tobytes()
    for pattern in (raw[:16], marker.half().numpy().tobytes()[:16], b"0.123456", b"0.12345679"):
        assert pattern not in sent
    # every request line is a GET of a public object, manifest or index
    lines = [l for l in sent.split(b"\r\n") if l.startswith((b"GET", b"HEAD", b"POST", b"PUT"))]
    assert lines and all(l.startswith(b"GET /") for l in lines)
    assert all(b"/objects/" in l or b"/manifests/" in l or b"/index.json" in l for l in lines)


def test_local_prefix_marked_while_compute_runs(setup):
    """Regression: marking shard i local after the compute stage already consumed shard i-1."""
    from sakura.runtime.stream import StreamedTemplateKV
    import time as _time

    model, tpl, photo, _ = setup
    src = StreamedTemplateKV(model, tpl.image[None], tpl.instruction, _time.perf_counter())
    src.mark_local(0)
    src.layer(0)           # computed: the slot now holds KV, not the LOCAL marker
    src.mark_local(1)      # must still be allowed
    assert src.layer(1).key.shape[0] == model.cfg.tokens_per_image
    src.put(2, src.layer(1))
    with pytest.raises(ValueError, match="earlier shard was fetched"):
        src.mark_local(3)
