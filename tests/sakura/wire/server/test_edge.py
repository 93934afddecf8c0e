"""A caching edge (stock nginx: proxy_cache + slice) in front of an origin (`sakura serve` or an
origin nginx), all on 127.0.0.1: the origin sees each object slice once however many phones
fetch it, Range answers through the cache are exact, ETags pass through, and a corrupt origin
object reaches the phone but is rejected by its sha256 check."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import shutil

import aiohttp
import pytest

from sakura.wire.client import FetchError, IntegrityError, TemplateClient
from sakura.wire.server import run_edge, run_nginx, serve_in_thread
from sakura.wire.server.accesslog import OriginLog
from sakura.wire.store import RenditionInput, Store, StoreWriter
from sakura.wire.store.synthetic import make_synthetic_store

FP = "synthetic-model"
SLICE = 128 * 1024  # small slices so the 256 KiB fp16 objects span two


def run(coro, timeout=90):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _need_nginx():
    if shutil.which("nginx") is None and not any(os.path.exists(p) for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")):
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light; .ci/run installs it)")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("edgestore")
    # objects: fp16 256 KiB (2 slices), int8 128 KiB (1), mix 48 KiB (1), table 4 KiB, ref ~1 KiB
    make_synthetic_store(root, templates=2, layers=3, tokens=256, width=256, model_fingerprint=FP)
    with StoreWriter(root, model_fingerprint=FP, template_id="lay") as w:  # a 3-rung layered shard
        w.set_template_ref(b"ref", media_type="x/y")
        data = hashlib.sha256(b"seed").digest() * 9375  # 300 000 bytes, 3 slices
        w.add_shard(layer=0, tokens=(0, 8), fp16_bytes=400_000, renditions=[
            RenditionInput(f"layered#{i}", "layered", data, prefix_bytes=n) for i, n in enumerate((50_000, 120_000, 300_000))])
    return root


class Origin:
    def __init__(self, url, log):
        self.url, self.log = url, log


def _start_origin(kind, root, tmp_path_factory):
    """Context manager yielding an Origin (url + request log) of the given kind."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        if kind == "sakura":
            log = OriginLog.sakura()
            try:
                with serve_in_thread(root) as url:
                    yield Origin(url, log)
            finally:
                log.close()
        else:
            pre = tmp_path_factory.mktemp("origin-nginx")
            with run_nginx(root, pre) as url:
                yield Origin(url, OriginLog.nginx(pre))
    return cm()


@pytest.fixture(params=["sakura", "nginx"])
def origin(request, store, tmp_path_factory):
    _need_nginx()
    with _start_origin(request.param, store, tmp_path_factory) as o:
        yield o


@pytest.fixture
def edge(origin, tmp_path):
    with run_edge(origin.url, tmp_path / "edge", slice_bytes=SLICE) as url:
        yield url


def _slices(nbytes):
    return max(1, math.ceil(nbytes / SLICE))


async def _phone(url, template):
    """One phone: manifest, then every object of the template, sha256-checked by the client."""
    async with TemplateClient(url, max_connections=4) as c:
        m = await c.get_manifest(FP, template)
        got = {o.sha256: await c.get_object(o) for o in m.objects()}
        return m, got


def test_second_phone_is_served_by_the_edge(store, origin, edge):
    m, got = run(_phone(edge, "tpl-000"))
    objs = m.objects()
    assert len(objs) == 3 * 3 + 2  # 3 shards x 3 renditions + table + template ref
    want = {o.sha256[:12]: _slices(o.bytes) for o in objs}
    origin.log.wait_for_object_requests(sum(want.values()))
    first = origin.log.object_requests()
    # the origin saw each object exactly once per cache slice (fp16: 2 slices, the rest 1)
    assert first == want
    run(_phone(edge, "tpl-000"))  # a second phone, same template
    assert origin.log.object_requests() == first  # nothing new reached the origin
    assert all(len(got[o.sha256]) == o.bytes for o in objs)


def test_32_concurrent_phones_one_origin_request_per_slice(store, origin, edge):
    async def crowd():
        return await asyncio.gather(*[_phone(edge, "tpl-001") for _ in range(32)], return_exceptions=True)

    results = run(crowd())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    m = results[0][0]
    for _, got in results:  # every phone got verified bytes of every object
        assert {k: len(v) for k, v in got.items()} == {o.sha256: o.bytes for o in m.objects()}
    # proxy_cache_lock: concurrent misses of a slice wait for the first fetch
    want = {o.sha256[:12]: _slices(o.bytes) for o in m.objects()}
    origin.log.wait_for_object_requests(sum(want.values()))
    assert origin.log.object_requests() == want


def test_ranges_through_the_cache_are_exact_and_etags_pass_through(store, origin, edge):
    st = Store(store)
    m = st.get_manifest(FP, "tpl-000")
    big = m.shards[0].rendition("fp16").object  # 262144 bytes: slices [0, 131072) and [131072, 262144)
    data = st.get_object(big)
    n = big.bytes
    cases = {"bytes=0-99": (0, 99), "bytes=131000-131200": (131000, 131200),  # crosses the slice edge
             "bytes=200000-": (200000, n - 1), "bytes=-5000": (n - 5000, n - 1), f"bytes=0-{n + 10}": (0, n - 1),
             "bytes=131072-131072": (131072, 131072)}

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.head(f"{origin.url}/{big.path}") as r:  # HEAD: not counted as a fetch
                origin_etag = r.headers["ETag"]
            for rng, (a, b) in cases.items():
                async with s.get(f"{edge}/{big.path}", headers={"Range": rng}) as r:
                    body = await r.read()
                    assert r.status == 206, (rng, r.status)
                    assert r.headers["Content-Range"] == f"bytes {a}-{b}/{n}", rng
                    assert body == data[a:b + 1], rng
                    assert r.headers["ETag"] == origin_etag
            async with s.get(f"{edge}/{big.path}") as r:  # whole object, assembled from cached slices
                body = await r.read()
                assert r.status == 200 and r.headers["ETag"] == origin_etag
                assert r.headers["X-Cache-Status"] == "HIT"
                assert hashlib.sha256(body).hexdigest() == big.sha256
            async with s.get(f"{edge}/{big.path}", headers={"Range": f"bytes={n}-"}) as r:
                assert r.status == 416  # (asks the origin for the slice past the end: not cacheable)
            async with s.get(f"{edge}/.tmp/x") as r:  # nothing outside the public paths is proxied
                assert r.status == 404
            async with s.post(f"{edge}/{big.path}", data=b"photo") as r:
                assert r.status in (403, 405)
        return origin_etag

    etag = run(go())
    if origin.log._nginx_log is None:  # sakura serve: the ETag is the sha256, also through the edge
        assert etag == f'"{big.sha256}"'
    # the origin was asked for each slice once, not once per Range (+ the one past-the-end 416)
    assert origin.log.object_requests(ok_only=True)[big.sha256[:12]] == 2
    assert origin.log.object_requests()[big.sha256[:12]] == 3

    async def rungs():  # the client's rung + upgrade path through the edge: verified prefixes
        async with TemplateClient(edge) as c:
            r0, r1, r2 = (await c.get_manifest(FP, "lay")).shards[0].renditions
            a = await c.fetch_rendition(r0)
            b = await c.fetch_rendition(r1, have=a.data)
            full = await c.get_rendition(r2, have=b.data)
            return a, b, full

    a, b, full = run(rungs())
    assert sum(ch.nbytes for ch in a.chunks) == 50_000 and sum(ch.nbytes for ch in b.chunks) == 70_000
    assert full == Store(store).get_object(Store(store).get_manifest(FP, "lay").shards[0].renditions[2].object)


@pytest.mark.parametrize("kind", ["sakura", "nginx"])
def test_corrupt_origin_object_never_reaches_a_phone(tmp_path, tmp_path_factory, kind):
    """A flipped bit on the origin's disk. Behind stock nginx the edge caches the bad bytes and the
    phone refuses them by hash; `sakura serve` refuses them itself (500, no-store), so the edge
    caches nothing and asks the origin again."""
    _need_nginx()
    root = tmp_path / "store"
    make_synthetic_store(root, templates=1, layers=2, tokens=64, width=64, model_fingerprint=FP)
    ref = Store(root).get_manifest(FP, "tpl-000").shards[1].rendition("int8").object
    p = Store(root).object_path(ref)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit on the origin's disk
    p.write_bytes(bytes(raw))
    refused = IntegrityError if kind == "nginx" else FetchError

    async def two_phones(url):
        out = []
        for _ in range(2):  # the second is served the cached (corrupt) copy by an edge that cached it
            async with TemplateClient(url, max_retries=1) as c:
                m = await c.get_manifest(FP, "tpl-000")
                with pytest.raises(refused):
                    await c.get_object(ref)
                out.append(await c.get_object(m.template_ref.object))  # the rest still verifies
        return out

    with _start_origin(kind, root, tmp_path_factory) as o, run_edge(o.url, tmp_path / "edge", slice_bytes=SLICE) as edge:
        refs = run(two_phones(edge))
        asked = o.log.object_requests()[ref.sha256[:12]]
    # nginx: the edge cached the bad bytes once; sakura: nothing cached, every phone's request reached the origin
    assert asked == 1 if kind == "nginx" else asked >= 2
    assert all(len(r) > 0 for r in refs)  # ...and the phone never used them


def test_edge_config_cli_prints_a_config_nginx_accepts(tmp_path):
    import subprocess

    from typer.testing import CliRunner

    from sakura.cli.main import app

    r = CliRunner().invoke(app, ["store", "edge-config", "http://127.0.0.1:8080", "--prefix", str(tmp_path), "--port", "18081"])
    assert r.exit_code == 0, r.output
    assert "slice 1048576;" in r.output and "proxy_cache_lock on;" in r.output and "server 127.0.0.1:8080;" in r.output
    assert CliRunner().invoke(app, ["store", "edge-config", "ftp://x"]).exit_code == 2
    _need_nginx()
    conf = tmp_path / "nginx.conf"
    conf.write_text(r.output)
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    t = subprocess.run([exe, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
                       capture_output=True, text=True, timeout=30)
    assert t.returncode == 0, t.stderr


def test_manifests_are_micro_cached_and_a_rebuild_shows_after_the_ttl(tmp_path, tmp_path_factory):
    _need_nginx()
    import time

    root = tmp_path / "store"
    make_synthetic_store(root, templates=1, layers=2, tokens=8, width=8, model_fingerprint=FP)

    def manifest_requests(log):
        return sum(1 for r in log.requests() if r.kind == "manifest")

    async def get(url):
        async with TemplateClient(url) as c:
            return await c.get_manifest(FP, "tpl-000")

    with _start_origin("sakura", root, tmp_path_factory) as o, \
            run_edge(o.url, tmp_path / "edge", manifest_ttl_s=1) as edge:
        first = run(get(edge))
        assert run(get(edge)).to_bytes() == first.to_bytes()
        assert manifest_requests(o.log) == 1  # the second phone was answered from the micro-cache
        make_synthetic_store(root, templates=1, layers=3, tokens=8, width=8, model_fingerprint=FP)  # rebuild
        time.sleep(2.2)  # past the TTL (nginx counts whole seconds: stale for at most TTL + 1 s)
        new = run(get(edge))
        assert len(new.shards) == 3 and len(first.shards) == 2
        assert manifest_requests(o.log) == 2
