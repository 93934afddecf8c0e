"""The phone-side client against real servers on 127.0.0.1: ours (aiohttp) and stock nginx."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
import shutil

import numpy as np
import pytest
from aiohttp import web

from sakura.wire.client import Chunk, FetchError, IntegrityError, NotFound, TemplateClient
from sakura.wire.client.client import SENT_HEADERS, USER_AGENT
from sakura.emulation import Link, PacingProxy, Trace
from sakura.wire.server import make_app, run_nginx, serve_in_thread
from sakura.wire.store import ManifestError, Store
from sakura.wire.store.layout import INDEX_URL, MANIFEST_URL_RE, OBJECT_URL_RE
from sakura.wire.store.synthetic import make_synthetic_store

from .conftest import FP, run

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cstore")
    # fp16 renditions: 2*256*256*2 = 256 KiB each
    make_synthetic_store(root, templates=2, layers=3, tokens=256, width=256, model_fingerprint=FP)
    return root


@pytest.fixture(scope="module")
def nginx(store, tmp_path_factory):
    try:
        ctx = run_nginx(store, tmp_path_factory.mktemp("nginx"))
        url = ctx.__enter__()
    except FileNotFoundError as e:
        pytest.skip(f"{e}; .ci/run installs it")
    try:
        yield url
    finally:
        ctx.__exit__(None, None, None)


@pytest.fixture(params=["aiohttp", "nginx"])
def server(request):
    return request.getfixturevalue("ours" if request.param == "aiohttp" else "nginx")


def _upstream(url):
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def test_fetch_everything_with_connection_reuse(server, store):
    async def go():
        async with PacingProxy(_upstream(server), Link(None)) as px:
            async with TemplateClient(px.url, max_connections=1) as c:
                keys = await c.manifest_keys()
                assert keys == Store(store).manifest_keys()
                for fp, tid in keys:
                    m = await c.get_manifest(fp, tid)
                    assert m.to_bytes() == Store(store).get_manifest(fp, tid).to_bytes()
                    for ref in m.objects():
                        seen: list[Chunk] = []
                        res = await c.fetch_object(ref, on_chunk=seen.append)
                        assert res.data == (store / ref.path).read_bytes()
                        assert sum(ch.nbytes for ch in seen) == ref.bytes and res.chunks == seen
                        assert all(ch.t_start <= ch.t_end for ch in seen)
                        assert all(a.t_end <= b.t_start + 1e-9 for a, b in zip(seen, seen[1:]))
                        assert res.t_request <= res.t_first_byte <= res.t_done
                        assert res.resumes == 0 and res.restarts == 0
            return px.stats.accepted
    # every request of the whole session went over one TCP connection
    assert run(go()) == 1


def test_resume_after_dropped_connections(server, store):
    m = Store(store).get_manifest(FP, "tpl-000")
    ref = m.shards[0].rendition("fp16").object  # 256 KiB

    async def go():
        async with PacingProxy(_upstream(server), Link(None), cut_after_bytes=60_000) as px:
            async with TemplateClient(px.url, max_retries=10) as c:
                res = await c.fetch_object(ref)
            return res, px.stats.cut
    res, cut = run(go())
    assert hashlib.sha256(res.data).hexdigest() == ref.sha256
    assert res.resumes >= 4 and res.restarts == 0 and cut == res.resumes
    assert sum(ch.nbytes for ch in res.chunks) == ref.bytes  # nothing fetched twice


def test_gives_up_after_max_retries(ours, store):
    ref = Store(store).get_manifest(FP, "tpl-000").shards[0].rendition("fp16").object

    async def go():
        async with PacingProxy(_upstream(ours), Link(None), cut_after_bytes=30_000) as px:
            async with TemplateClient(px.url, max_retries=2) as c:
                await c.fetch_object(ref)
    with pytest.raises(FetchError, match="gave up after 3 attempts"):
        run(go())


def test_one_retry_policy_for_manifests_and_objects(store, monkeypatch):
    """Manifests and objects retry under the same RetryPolicy: the same number of attempts and
    the same pauses (recorded, not timed) against a port nobody listens on."""
    import socket

    from sakura.wire.client import RetryPolicy

    assert [RetryPolicy().delay_s(n) for n in range(1, 7)] == [0.04, 0.08, 0.16, 0.32, 0.64, 1.0]
    ref = Store(store).get_manifest(FP, "tpl-000").shards[0].rendition("fp16").object
    with socket.socket() as sock:  # a free port, closed again: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def record(s, *a, **k):
        pauses.append(s)
        await real_sleep(0)

    monkeypatch.setattr("sakura.wire.client.client.asyncio.sleep", record)

    async def go(call):
        async with TemplateClient(f"http://127.0.0.1:{port}", max_retries=3) as c:
            await call(c)
    for call in (lambda c: c.manifest_keys(), lambda c: c.fetch_object(ref)):
        pauses.clear()
        with pytest.raises(FetchError, match="gave up after 4 attempts"):
            run(go(call))
        assert pauses == [0.04, 0.08, 0.16]


def test_integrity_error_on_corrupt_server_copy(store, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    ref = Store(bad).get_manifest(FP, "tpl-000").shards[1].rendition("int8").object
    p = bad / ref.path
    data = bytearray(p.read_bytes())
    data[1234] ^= 1
    p.write_bytes(bytes(data))

    async def go(url):
        async with TemplateClient(url) as c:
            await c.fetch_object(ref)
    with serve_in_thread(bad, verify_objects=False) as url:  # ours refuses them itself (test_object_names.py)
        with pytest.raises(IntegrityError, match="hash to"):
            run(go(url))


def test_not_found_and_bad_manifest(ours, tmp_path):
    bad = tmp_path / "badm"
    make_synthetic_store(bad, templates=1, layers=1, model_fingerprint=FP)
    mp = bad / "manifests" / FP / "tpl-000.json"
    from sakura.wire.store.manifest import manifest_tree

    tree = manifest_tree(mp.read_bytes())
    mp.write_text(json.dumps({**tree, "schema_version": 99}))

    async def go(url):
        async with TemplateClient(url) as c:
            with pytest.raises(NotFound):
                await c.get_manifest(FP, "no-such-template")
            with pytest.raises(ValueError, match="template id"):
                await c.get_manifest(FP, "../../etc/passwd")
            with pytest.raises(ManifestError, match="schema_version"):
                await c.get_manifest(FP, "tpl-000")
    with serve_in_thread(bad) as url:
        run(go(url))


def test_read_timeout_on_stalled_server():
    attempts = []

    async def go():
        async def stall(r, w):
            attempts.append(await r.read(1000))
            await asyncio.Event().wait()  # never answers: only the read timeout can end the request
        srv = await asyncio.start_server(stall, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with TemplateClient(url, read_timeout=0.3, max_retries=1) as c:
                with pytest.raises(FetchError, match="gave up"):
                    await c.get_manifest(FP, "tpl-000")
        finally:
            srv.close()
    run(go())  # (run's 60 s guard turns a missing timeout into a failure, not a hang)
    assert len(attempts) == 2  # the first try and its one retry, each ended by the read timeout


def test_cancel_abandoned_fetch_closes_connection(ours, store):
    """A fetch over a 1 Mbit/s link is abandoned after 0.3 s: the task ends within a few event-loop turns, the
    connection is closed (the proxy sees it go), and the client keeps working."""
    m = Store(store).get_manifest(FP, "tpl-000")
    big = m.shards[0].rendition("fp16").object      # 256 KiB: ~2 s at 1 Mbit/s
    small = m.template_ref.object

    async def go():
        link = Link(Trace("1mbit", edges=np.array([0.0, 1000.0]), rate=np.array([125_000.0])))
        async with PacingProxy(_upstream(ours), link) as px:
            async with TemplateClient(px.url) as c:
                task = asyncio.create_task(c.fetch_object(big))
                await asyncio.sleep(0.3)
                task.cancel()
                # promptly = within a few event-loop turns (counted, not timed): the transfer would
                # need ~1.7 s more of the link
                turns = 0
                while not task.done() and turns < 100:
                    await asyncio.sleep(0)
                    turns += 1
                with pytest.raises(asyncio.CancelledError):
                    await task
                for _ in range(50):
                    if px.stats.active == 0:
                        break
                    await asyncio.sleep(0.01)
                closed = px.stats.active == 0
                res = await c.fetch_object(small)  # client still usable
                assert res.nbytes == small.bytes
                return turns, closed, px.stats.down_bytes
    turns, closed, down = run(go())
    assert turns < 100 and closed
    assert down < 200_000  # the rest of the abandoned object was never sent


def test_chunk_timing_measures_the_link(ours, store, loop_lag):
    """Chunk reports give the bandwidth estimator the link's rate (8 Mbit/s here) within 10%, and
    late by no more than the event loop itself ran late (a loaded machine)."""
    ref = Store(store).get_manifest(FP, "tpl-001").shards[2].rendition("fp16").object

    async def go():
        link = Link(Trace("8mbit", edges=np.array([0.0, 1000.0]), rate=np.array([1_000_000.0])))
        async with loop_lag() as lag, PacingProxy(_upstream(ours), link) as px:
            async with TemplateClient(px.url) as c:
                res = await c.fetch_object(ref)
        return res, lag
    res, lag = run(go())
    ch = res.chunks[1:]  # the first chunk includes the request's own latency
    took, want = ch[-1].t_end - ch[0].t_start, sum(c.nbytes for c in ch) / 1_000_000
    late = lag.between(ch[0].t_start, ch[-1].t_end)
    assert 0.9 * want < took < 1.1 * want + late, (took, want, late)


def test_client_only_ever_requests_public_objects(store):
    """Privacy by construction: record every request the server receives during a full session."""
    seen = []

    @web.middleware
    async def record(request, handler):
        seen.append((request.method, request.rel_url.raw_path, request.rel_url.raw_query_string,
                     dict(request.headers), await request.read()))
        return await handler(request)

    async def go():
        app = make_app(store)
        app.middlewares.append(record)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = "http://%s:%d" % runner.addresses[0][:2]
        try:
            async with PacingProxy(_upstream(url), Link(None), cut_after_bytes=100_000) as px:
                async with TemplateClient(px.url) as c:
                    for fp, tid in await c.manifest_keys():
                        m = await c.get_manifest(fp, tid)
                        for ref in m.objects():
                            await c.fetch_object(ref)
        finally:
            await runner.cleanup()
    run(go())
    assert len(seen) > 10
    for method, path, query, headers, body in seen:
        assert method == "GET"
        assert OBJECT_URL_RE.fullmatch(path) or MANIFEST_URL_RE.fullmatch(path) or path == INDEX_URL, path
        assert query == "" and body == b""
        assert set(headers) <= SENT_HEADERS | {"Connection"}, headers
        assert headers["User-Agent"] == USER_AGENT
        assert "Cookie" not in headers
        if "Range" in headers:
            assert re.fullmatch(r"bytes=\d+-(\d+)?", headers["Range"])
    # and the API has no way to send anything else: public coroutines take ids/ObjectRefs only
    public = {n for n, _ in inspect.getmembers(TemplateClient, inspect.iscoroutinefunction) if not n.startswith("_")}
    assert public == {"manifest_keys", "get_manifest", "get_object", "get_rendition",  # the store API
                      "fetch_object", "fetch_rendition",  # timed forms
                      "open_connections",  # TCP handshakes only (takes a count, sends no request)
                      "close"}
    with pytest.raises(TypeError, match="ObjectRef"):
        run(TemplateClient("http://127.0.0.1:1").fetch_object("objects/../../secret"))
    with pytest.raises(TypeError, match="ObjectRef"):
        run(TemplateClient("http://127.0.0.1:1").get_object("objects/../../secret"))
    with pytest.raises(TypeError, match="Rendition"):
        run(TemplateClient("http://127.0.0.1:1").fetch_rendition({"object": "../../secret"}))
    with pytest.raises(ValueError, match="query"):
        TemplateClient("http://127.0.0.1:1/?photo=1")


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    """A store whose one shard has a 3-rung layered rendition: prefixes of one 300 kB object."""
    import os as _os

    from sakura.wire.store import RenditionInput, StoreWriter

    root = tmp_path_factory.mktemp("layered")
    data = _os.urandom(300_000)
    with StoreWriter(root, model_fingerprint=FP, template_id="lay") as w:
        w.set_template_ref(b"ref", media_type="x/y")
        w.add_shard(layer=0, tokens=(0, 8), fp16_bytes=400_000, renditions=[
            RenditionInput(f"layered#{i}", "layered", data, prefix_bytes=n) for i, n in enumerate((50_000, 120_000, 300_000))])
    return root, data


@pytest.fixture(params=["aiohttp", "nginx"])
def layered_server(request, layered, tmp_path_factory):
    root, data = layered
    if request.param == "aiohttp":
        with serve_in_thread(root) as url:
            yield url, data
    else:
        try:
            ctx = run_nginx(root, tmp_path_factory.mktemp("nginx-l"))
            url = ctx.__enter__()
        except FileNotFoundError as e:
            pytest.skip(f"{e}; .ci/run installs it")
        try:
            yield url, data
        finally:
            ctx.__exit__(None, None, None)


def test_layered_rungs_fetch_and_upgrade_with_ranges(layered_server):
    url, data = layered_server

    async def go():
        async with PacingProxy(_upstream(url), Link(None), cut_after_bytes=40_000) as px:
            async with TemplateClient(px.url, max_retries=20) as c:
                m = await c.get_manifest(FP, "lay")
                r0, r1, r2 = m.shards[0].renditions
                a = await c.fetch_rendition(r0)                 # bytes 0-49999 only
                b = await c.fetch_rendition(r1, have=a.data)    # upgrade: 50000-119999 only
                full = await c.fetch_rendition(r2, have=b.data)
                with pytest.raises(IntegrityError, match="wrong `have`"):
                    await c.fetch_rendition(r1, have=b"x" * 10)
                with pytest.raises(ValueError, match="longer"):
                    await c.fetch_rendition(r0, have=b.data)
                return a, b, full
    a, b, full = run(go())
    assert a.data == data[:50_000] and b.data == data[:120_000] and full.data == data
    assert sum(ch.nbytes for ch in a.chunks) == 50_000
    assert sum(ch.nbytes for ch in b.chunks) == 70_000      # only the missing tail moved
    assert sum(ch.nbytes for ch in full.chunks) == 180_000
    assert a.resumes >= 1 and full.resumes >= 3              # resumed within bounded ranges too


def test_restarts_when_server_ignores_range(store):
    """A server that ignores Range (always 200, whole body): after a drop the client starts over
    and still delivers verified bytes."""
    ref = Store(store).get_manifest(FP, "tpl-000").shards[0].rendition("fp16").object
    body = (store / ref.path).read_bytes()

    async def whole(request):
        return web.Response(body=body, content_type="application/octet-stream")

    async def go():
        app = web.Application()
        app.router.add_get("/{tail:.*}", whole)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        try:
            async with PacingProxy((host, port), Link(None), cut_after_bytes=100_000, cut_limit=1) as px:
                async with TemplateClient(px.url) as c:
                    return await c.fetch_object(ref)
        finally:
            await runner.cleanup()
    res = run(go())
    assert res.data == body and res.restarts == 1 and res.resumes == 0


def test_resume_after_mid_body_stall(store):
    """The server stalls half-way through the body: the read timeout fires, the client resumes
    with Range from the byte it had, and the result verifies."""
    ref = Store(store).get_manifest(FP, "tpl-000").shards[0].rendition("int8").object
    body = (store / ref.path).read_bytes()
    seen_ranges = []

    async def handler(r, w):
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                rng = re.search(rb"(?i)range: bytes=(\d+)-", head)
                seen_ranges.append(int(rng.group(1)) if rng else None)
                if rng is None:  # first request: half the body, then silence
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: \"e\"\r\n\r\n" % len(body))
                    w.write(body[: len(body) // 2])
                    await w.drain()
                    await asyncio.Event().wait()  # silence for good: only the read timeout ends it
                else:
                    a = int(rng.group(1))
                    w.write(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\nContent-Range: bytes %d-%d/%d\r\n"
                            b"ETag: \"e\"\r\n\r\n" % (len(body) - a, a, len(body) - 1, len(body)))
                    w.write(body[a:])
                    await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def go():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with TemplateClient(url, read_timeout=0.3, max_retries=3) as c:
                return await c.fetch_object(ref)
        finally:
            srv.close()
    res = run(go())
    assert res.data == body and res.resumes == 1
    assert seen_ranges[:2] == [None, len(body) // 2]  # resumed exactly where it stopped


def test_manifest_over_a_slow_link_arrives_whole(tmp_path):
    """A manifest of several kB over a 200 kbit/s link arrives in ~1500-byte pieces, and the client
    must wait for all of them (a regression: it once parsed the first piece). Version 2 manifests
    are under 1 kB here, so the store holds this one as an older store would, in version 1 text."""
    from sakura.wire.store.manifest import encode_manifest_tree

    root = tmp_path / "v1"
    make_synthetic_store(root, templates=2, layers=3, tokens=256, width=256, model_fingerprint=FP)
    p = Store(root).manifest_path(FP, "tpl-000")
    want = Store(root).get_manifest(FP, "tpl-000")
    p.write_bytes(encode_manifest_tree(want.to_json(version=1)))
    assert p.stat().st_size > 3000

    async def go(url):
        link = Link(Trace("200kbit", edges=np.array([0.0, 1000.0]), rate=np.array([25_000.0])), burst_bytes=0)
        async with PacingProxy(_upstream(url), link) as px:
            async with TemplateClient(px.url) as c:
                return await c.get_manifest(FP, "tpl-000"), await c.manifest_keys()
    with serve_in_thread(root) as url:
        m, keys = run(go(url))
    assert m.schema_version == 1 and m.shards == want.shards and m.to_bytes() == want.to_bytes()
    assert len(keys) == 2
