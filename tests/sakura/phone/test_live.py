"""The live runtime end to end on loopback: real store, HTTP server, client, codec, model forward
pass, and faults injected for real. Streamed lossless KV must give the bit-identical image, and
no fault may stop an edit from completing with the on-device image."""

import asyncio
import contextlib
import threading
import time

import pytest
import torch

from sakura.emulation.faults import fault_proxy_in_thread
from sakura.emulation.pacer import pacer_in_thread
from sakura.emulation.traces import constant_trace
from sakura.models import load_model
from sakura.phone import (BandwidthEstimator, FixedPolicy, MeetInMiddlePolicy, RttEstimator, SakuraPolicy)
from sakura.phone.driver import ShardStatus
from sakura.phone.live import DeviceProfile, Emulation, profile_model, shard_specs, streamed_edit
from sakura.phone.sim import simulate_edit
from sakura.wire.server import serve_in_thread
from sakura.cloud.builder.pipeline import build_store
from sakura.wire.store.store import Store
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.cloud.tasks.quality import psnr_per_image

LADDER = ["lossless", "layered:budgets=[1.0,2.0]"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("store")
    build_store(root, templates=["sticker-00"], ladder=LADDER, calibration=1, steps=1, log=lambda s: None)
    model = load_model("sakura-mini")
    tpl = get_template("sticker-00", model.cfg.image_size)
    photo = heldout_photos(model.cfg.image_size)[:1]
    st = Store(root)
    (fp, tid), = st.manifest_keys()
    with serve_in_thread(root) as url:
        yield model, tpl, photo, url, st.get_manifest(fp, tid), root


def _edit(setup, policy, *, url=None, manifest=True, bw=1e9, rtt=0.001, **kw):
    model, tpl, photo, base, m, _ = setup
    kw.setdefault("profile", DeviceProfile(compute_s=0.002, local_s=0.002))
    return streamed_edit(model, photo, base_url=url or base, template_id="sticker-00", template_image=tpl.image[None],
                         instruction=tpl.instruction, policy=policy, bandwidth=BandwidthEstimator(prior_bps=bw),
                         rtt=RttEstimator(prior_s=rtt), steps=2, manifest=m if manifest else None, **kw)


def _on_device(setup):
    model, tpl, photo, *_ = setup
    return model.edit(photo, template=tpl.image[None], instruction=tpl.instruction, steps=2).image


def _lossless_kv_edit(setup):
    model, tpl, photo, *_ = setup
    kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    return model.edit(photo, template_kv=kv, steps=2).image


def test_raw_stream_is_bit_exact(setup):
    model, tpl, photo, *_ = setup
    res = _edit(setup, FixedPolicy("lossless"))
    local = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    assert torch.equal(res.image, model.edit(photo, template_kv=local, steps=2).image)
    assert res.choices() == ["lossless"] * 6 and res.path == "streamed"
    assert res.bytes_fetched == sum(r.nbytes for r in res.records) > 0


def test_all_local_plan_takes_the_on_device_path(setup):
    """A hopeless link: the first plan fetches nothing, so the edit is the plain on-device one."""
    res = _edit(setup, SakuraPolicy(), bw=1e2, rtt=0.5)
    assert res.path == "on-device" and res.bytes_fetched == 0
    assert torch.equal(res.image, _on_device(setup))


def test_fast_link_streams_within_the_quality_floor(setup):
    m = setup[4]
    if not all("image_mse" in r.distortion for s in m.shards for r in s.renditions):
        pytest.skip("this build records no image distortions")
    res = _edit(setup, SakuraPolicy(), profile=DeviceProfile(compute_s=0.002, local_s=0.05))
    assert res.path == "streamed" and res.bytes_fetched > 0 and res.quality_known
    assert any(c != "local" for c in res.choices())
    for r, shard in zip(res.records, m.shards):
        if r.source != "local" and shard.quality_floor:
            assert shard.rendition(r.source).distortion["image_mse"] <= shard.quality_floor["image_mse"] * (1 + 1e-9)
    # the implied PSNR is what the edit gets, to within the first-order model (errors add)
    got = psnr_per_image(res.image, _lossless_kv_edit(setup)).item()
    assert abs(got - res.implied_psnr_db) < 3 or (got > 45 and res.implied_psnr_db > 45)


@pytest.mark.timeout(300)  # a hang guard for the harness (a cold numba cache compiles first); the records say what bounded the edit
@pytest.mark.parametrize("fault", ["unreachable", "manifest-500", "shards-500", "reset-always", "stall", "corrupt"])
def test_every_fault_ends_with_the_on_device_image(setup, fault, tmp_path):
    model, tpl, photo, url, m, root = setup
    want = _on_device(setup)
    kw = dict(emulate=Emulation(renditions=("lossless",)), allow_fast_path=False, profile=DeviceProfile(compute_s=0.002, local_s=0.05))
    if fault == "unreachable":
        res = _edit(setup, SakuraPolicy(), url="http://127.0.0.1:9", manifest=False, **kw)
    elif fault == "manifest-500":
        with fault_proxy_in_thread(url, "http500") as (purl, _):
            res = _edit(setup, SakuraPolicy(), url=purl, manifest=False, **kw)
    elif fault == "shards-500":
        with fault_proxy_in_thread(url, "http500") as (purl, _):
            res = _edit(setup, SakuraPolicy(), url=purl, **kw)
    elif fault == "reset-always":
        with fault_proxy_in_thread(url, "reset-always", after_bytes=1500) as (purl, px):
            res = _edit(setup, SakuraPolicy(), url=purl, **kw)
        assert px.triggered > 0
    elif fault == "stall":
        with fault_proxy_in_thread(url, "stall", after_bytes=20_000) as (purl, px):
            res = _edit(setup, SakuraPolicy(), url=purl, **kw)
        assert px.triggered > 0
    else:
        import shutil

        bad = tmp_path / "store"
        shutil.copytree(root, bad)
        obj = Store(bad).object_path(m.shards[2].renditions[0].object)
        data = bytearray(obj.read_bytes())
        data[100] ^= 0xFF
        obj.chmod(0o644)
        obj.write_bytes(bytes(data))
        with serve_in_thread(bad, verify_objects=False) as burl:  # the phone's own check (ours refuses them)
            # a policy that fetches every shard: SakuraPolicy may plan layer 2 local by timing (its
            # loss bound), and then the corrupt object is never requested (flaky 1 in ~10)
            res = _edit(setup, FixedPolicy("lossless"), url=burl, **kw)
        # our server hashes an object before serving it and answers 500 for one whose bytes do
        # not match its name (so the corrupt bytes never reach the phone); a server that serves
        # them anyway (a stock CDN) meets the client's own check: IntegrityError (wire/client tests)
        assert res.records[2].source == "local"
        assert any("shard 2 fetch failed" in e and ("HTTP 500" in e or "IntegrityError" in e) for e in res.events)
        assert all(r.source == "lossless" for r in res.records if r.index != 2)
    # the right image: on-device's up to the fp16 rounding of stored KV (~80 dB)
    assert psnr_per_image(res.image, want).item() > 60
    if fault in ("unreachable", "manifest-500"):
        assert res.path == "on-device" and torch.equal(res.image, want)
    if fault != "reset-always":
        assert res.events, "the report must say what happened"
    if fault == "stall":
        # bounded by the driver's deadlines from the estimates, not by the client's per-object deadline:
        # every stalled shard was given up at a deadline (cancelled, computed locally), none failed
        not_by_deadline = [(r.index, r.status, r.note) for r in res.records
                           if not (r.status == ShardStatus.CANCELLED and r.note in ("deadline", "late"))]
        assert not not_by_deadline and all(r.source == "local" for r in res.records)


def test_link_does_not_idle_between_shards(setup):
    """Through the pacer at 100 Mbit/s with a 40 ms RTT, requests are issued ahead: each goes out
    while the previous shard is still arriving (serial requests would idle 5 RTTs here)."""
    _, _, _, url, *_ = setup
    with pacer_in_thread(url, constant_trace(100), 0.0, 0.040) as purl:
        res = _edit(setup, FixedPolicy("lossless"), url=purl, bw=100e6 / 8, rtt=0.04)
    assert res.choices() == ["lossless"] * 6
    # Issued ahead, by order not by the clock: every shard's request went out before the previous
    # shard's last byte arrived (serial requests go out after it, and idle one RTT per shard).
    # How long the link idles is a figure of `sakura bench link`, not a bound here.
    recs = sorted(res.records, key=lambda r: r.t_request)
    assert all(b.t_request < a.fetch_end for a, b in zip(recs, recs[1:])), [(r.t_request, r.fetch_end) for r in recs]


def test_only_the_shards_cross_the_link(setup):
    """The downlink carries the shards (and one response head each): the fetch stage's spare
    connections are handshakes, not requests (it warmed them with the index, whose answers went
    ahead of the first shard), and tables the phone holds (`Emulation.tables`) are not fetched.
    On the dilated LTE trace those bytes made the one streamed shard miss its deadline live."""
    from sakura.emulation.pacer import pacing_proxy_in_thread

    model, tpl, photo, url, m, root = setup
    name = next(r.name for r in m.shards[0].renditions if r.tables)   # a rendition that needs a table
    tables = {t.name: Store(root).get_object(t.object) for t in m.tables}
    shard_bytes = sum(s.rendition(name).nbytes for s in m.shards)
    got = {}
    for held in (None, tables):
        with pacing_proxy_in_thread(url, constant_trace(100), 0.0, 0.002) as px:
            res = _edit(setup, FixedPolicy(name), url=px.url, bw=100e6 / 8, rtt=0.002,
                        emulate=Emulation(renditions=(name,), tables=held), allow_fast_path=False)
            assert res.choices() == [name] * 6, res.events
            got["held" if held else "fetched"] = (px.stats.down_bytes, px.stats.accepted, res.tables_bytes)
    down, accepted, tables_bytes = got["held"]
    head = 400  # one HTTP response head (status, length, range, etag, cache headers), generously
    assert tables_bytes == 0 and shard_bytes <= down <= shard_bytes + len(m.shards) * head, got
    assert accepted >= 3, got  # the spare connections were opened (handshakes only)
    down_f, _, tables_f = got["fetched"]
    assert tables_f == sum(len(b) for b in tables.values() if b) and down_f >= down + tables_f, got


class SlowDevice:
    """sakura-mini with a phone's per-layer times added (sleeps): template layers take `local_s`
    more, each forward layer `compute_s` more, so decisions are clear-cut on a loaded CPU."""

    def __init__(self, model, local_s, compute_s, pre_s=0.0):
        self.m, self.local_s, self.compute_s, self.pre_s = model, local_s, compute_s, pre_s
        self.num_layers, self.cfg = model.num_layers, model.cfg

    def __getattr__(self, name):
        return getattr(self.m, name)

    def template_layers(self, *a):
        for kv in self.m.template_layers(*a):
            time.sleep(self.local_s)
            yield kv

    def edit(self, photo, template_kv=None, **kw):
        if template_kv is None:
            return self.m.edit(photo, **kw)
        dev = self
        time.sleep(self.pre_s)  # text encoder + VAE encode before the first layer (fetching runs)

        class Slow:
            model_fingerprint, template_fingerprint = template_kv.model_fingerprint, template_kv.template_fingerprint
            num_layers = template_kv.num_layers

            def layer(self, i):
                if i > 0:
                    time.sleep(dev.compute_s)  # layer i-1's forward compute
                return template_kv.layer(i)

        return self.m.edit(photo, template_kv=Slow(), **kw)


#: Why the live-vs-sim test failed about 1 run in 20 at 100 Mbit/s (and 4 in 6 at load 9): layer 0
#: waited for its shard until the wait rule's deadline (the expected arrival + 2 RTTs, 120 ms), but
#: the live first request also pays a TCP handshake through the 40 ms pacer, which the simulator
#: does not model, so it arrived at ~190 ms on a loaded machine and live computed layer 0 while the
#: simulator used the shard. At layer 0 nothing can be hedged (the local generator is not behind).
#: The fix: the device spends LIVE_SIM_PRE_S on the text encoder and VAE encode before layer 0, as a
#: phone does, so the first shards are here before the forward pass needs them; later layers no
#: longer sit on a threshold either (a shard late past its deadline is hedged, ADVANCE, and still
#: used when it arrives, as in the simulator). A 50 % loss bound keeps the slack far from the waits.
LIVE_SIM_BOUND = 0.5
LIVE_SIM_PRE_S = 0.4


@pytest.mark.parametrize("mbps", [0.1, 100])
def test_live_and_simulated_runs_take_the_same_decisions(setup, mbps):
    model, tpl, photo, url, m, _ = setup
    slow = SlowDevice(model, local_s=0.20, compute_s=0.03, pre_s=LIVE_SIM_PRE_S)
    prof = DeviceProfile(compute_s=0.03 + 0.003, local_s=0.20 + 0.003, decode_workers=2, pre_s=LIVE_SIM_PRE_S)
    kw = dict(bw=mbps * 1e6 / 8, rtt=0.04, emulate=Emulation(renditions=("lossless",)), allow_fast_path=False, profile=prof)
    with pacer_in_thread(url, constant_trace(mbps), 0.0, 0.040) as purl:
        live = streamed_edit(slow, photo, base_url=purl, template_id="sticker-00", template_image=tpl.image[None],
                             instruction=tpl.instruction, policy=SakuraPolicy(loss_bound=LIVE_SIM_BOUND), manifest=m,
                             steps=1,
                             bandwidth=BandwidthEstimator(prior_bps=kw["bw"]), rtt=RttEstimator(prior_s=0.04),
                             emulate=kw["emulate"], allow_fast_path=False, profile=prof)
    from dataclasses import replace

    specs = [replace(s, routes=tuple(r for r in s.routes if r.name == "lossless")) for s in shard_specs(m, prof)]
    from sakura.phone import ConstantLink

    sim = simulate_edit(specs, SakuraPolicy(loss_bound=LIVE_SIM_BOUND), link=ConstantLink(mbps * 1e6 / 8), rtt_s=0.04,
                        bandwidth=BandwidthEstimator(prior_bps=kw["bw"]), rtt=RttEstimator(prior_s=0.04), decode_workers=2,
                        compute_start_s=LIVE_SIM_PRE_S)
    timeline = [(r.index, r.source, round(r.t_request, 3), round(r.fetch_end, 3), round(r.decode_end, 3),
                 round(r.needed, 3), r.note) for r in live.records]
    assert live.choices() == [r.source for r in sim.records], (live.events, timeline)
    assert [r.index for r in live.records if r.route] == [j for j, _ in sim.requests]
    # the two links are clear-cut: all local (a probe for the last layer is requested and not used
    # in time), or all fetched
    ch = live.choices()
    assert set(ch) == ({"lossless"} if mbps == 100 else {"local"})


def test_meet_in_the_middle_live(setup):
    res = _edit(setup, MeetInMiddlePolicy(), profile=DeviceProfile(compute_s=0.002, local_s=0.05))
    s = res.choices()
    assert s[-1] != "local"
    first = next((i for i, c in enumerate(s) if c != "local"), len(s))
    assert all(c != "local" for c in s[first:])


class RecordingProxy:
    """A TCP relay on 127.0.0.1 that keeps every byte the phone sends towards the server. On exit it
    closes its listening socket and every stream, and awaits its relay tasks, before its loop stops
    and closes: a stream left to the garbage collector after the loop closed warned "Event loop is
    closed" in whichever later test the collection happened to run."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.sent = bytearray()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.writers: set[asyncio.StreamWriter] = set()

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
        self.writers.add(cw)
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers.add(uw)
        await asyncio.gather(self._pipe(cr, uw, True), self._pipe(ur, cw, False))

    async def _close(self):
        self.server.close()
        for w in self.writers:
            w.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in relays:
            t.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        for w in self.writers:
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
        await self.server.wait_closed()

    def run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self._close())
        finally:
            self.loop.close()

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
            assert self.loop.is_closed(), "the proxy's loop did not shut down"


def test_privacy_nothing_of_the_photo_reaches_the_server(setup):
    model, tpl, _, url, *_ = setup
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


def test_profile_model_measures_positive_times(setup):
    prof = profile_model(setup[0], repeats=1)
    assert prof.compute_s > 0 and prof.local_s > 0 and prof.decode_workers >= 1


def test_emulated_split_decode_ends_where_the_simulator_says():
    """`Emulation.decode_split`: a padded decode that shares idle workers ends as the simulator's
    (x split until the next shard arrives, alone after)."""
    from sakura.phone.live import split_decode_end

    assert split_decode_end(10.0, 0.04, 1.0, None) == 10.04
    assert split_decode_end(10.0, 0.04, 2.0, None) == 10.02
    assert split_decode_end(10.0, 0.04, 2.0, 10.05) == 10.02          # the next shard came after it ended
    assert abs(split_decode_end(10.0, 0.04, 2.0, 10.01) - 10.03) < 1e-12  # 0.02 of work in 0.01 s, 0.02 alone
    for start, dec, split, nxt in ((0.0, 1.0, 1.41, 0.3), (1.0, 0.5, 1.41, 1.1), (2.0, 0.2, 1.87, None)):
        # the simulator's lines (sim.simulate_edit): end = start + dec / split; past t_next, the rest alone
        end = start + dec / split
        if nxt is not None and end > nxt:
            end = nxt + dec - (nxt - start) * split
        assert abs(split_decode_end(start, dec, split, nxt) - end) < 1e-12


def test_an_editor_keeps_one_http_session_for_its_life(setup, tmp_path):
    """An `Editor` fetches through one HTTP session on one event loop for its whole life: the
    gallery refreshes and every shard of two edits go through it (one aiohttp session made), the
    second edit opens no connection of its own (the server, behind a counting proxy on 127.0.0.1,
    accepts none: the first edit's are kept alive), no edit starts a loop thread, and `close` ends
    the session and its thread."""
    from sakura.emulation.pacer import pacing_proxy_in_thread
    from sakura.phone.editor import Editor

    model, tpl, photo, url, m, _ = setup

    def sakura_threads():
        return sorted(t.name for t in threading.enumerate()
                      if t.name.startswith("sakura-") and not t.name.startswith("sakura-decode"))

    with pacing_proxy_in_thread(url, None, 0.0, 0.0) as px:
        before = sakura_threads()
        editor = Editor(px.url, model=model, gallery=tmp_path / "gallery", policy="raw-stream", prior_mbps=1000.0)
        first = editor.edit(photo, "sticker-00", steps=2)
        after_first = px.stats.accepted
        during = sakura_threads()
        second = editor.edit(photo, "sticker-00", steps=2)
        after_second = px.stats.accepted
        link = editor.link
        assert link.client.sessions_opened == 1
        for res in (first, second):
            assert res.streamed.path == "streamed" and all(r.source == "lossless" for r in res.streamed.records)
        assert torch.equal(first.image, second.image)
        assert 1 <= after_first <= 8, after_first
        assert after_second == after_first, (after_first, after_second)
        assert sorted(during) == sorted(before + ["sakura-editor"]), (before, during)
        assert sakura_threads() == during   # the second edit started none either
        editor.close()
        assert link.closed and sakura_threads() == before
