"""The client against hostile servers on 127.0.0.1 (`sakura.emulation.faults.HostileServer`): every
fetch ends, with a typed error, in bounded time and memory. Bounds asserted are generous ("it
did not hang": the hang used to be infinite); the deadlines themselves are counted, not timed."""

from __future__ import annotations

import asyncio

import pytest

from sakura.wire.client import DeadlineExceeded, IntegrityError, RedirectRefused, TemplateClient
from sakura.wire.client.client import FetchError
from sakura.emulation.faults import hostile_in_thread
from sakura.wire.store import Store
from sakura.wire.store.layout import manifest_relpath
from sakura.wire.store.synthetic import make_synthetic_store

from .conftest import FP, run

pytestmark = pytest.mark.timeout(120)
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hstore")
    make_synthetic_store(root, templates=1, layers=2, tokens=64, width=64, model_fingerprint=FP)
    return root


@pytest.fixture(scope="module")
def manifest(store):
    return Store(store).get_manifest(FP, "tpl-000")


def _client(url, **kw):
    return TemplateClient(url, connect_timeout=1.0, read_timeout=3.0, max_retries=2, **kw)


def test_deadline_formula_is_bounded():
    c = TemplateClient("http://127.0.0.1:1", connect_timeout=1, read_timeout=2, min_rate_bps=1000, max_deadline_s=50)
    assert c.deadline_for(0) == 3.0
    assert c.deadline_for(10_000) == 13.0
    assert c.deadline_for(10**12) == 50.0


@pytest.mark.timeout(60)  # a hang guard for the harness; what the test checks is the typed error and the count
def test_dripping_manifest_ends_at_its_deadline(ours):
    # one byte every 0.5 s: each read arrives well inside read_timeout, so only an overall deadline ends it
    with hostile_in_thread(ours, "drip", drip_s=0.5) as (url, srv):
        async def go():
            async with _client(url) as c:
                await c.get_manifest(FP, "tpl-000", deadline_s=2.0)
        with pytest.raises(DeadlineExceeded, match="deadline"):
            run(go())
        assert len(srv.requests) == 1  # a deadline is not retried


@pytest.mark.timeout(60)
def test_object_stalled_after_headers_ends_at_its_deadline(ours, manifest):
    ref = manifest.shards[0].renditions[0].object
    with hostile_in_thread(ours, "stall-body") as (url, _):
        async def go():
            async with _client(url) as c:
                await c.fetch_object(ref, deadline_s=1.5)
        with pytest.raises(DeadlineExceeded):  # the overall deadline, not the 3 s read timeout's retries
            run(go())


def test_default_deadline_applies_without_one_given(ours, manifest):
    ref = manifest.shards[0].renditions[0].object
    with hostile_in_thread(ours, "drip", drip_s=0.3) as (url, _):
        async def go():
            async with TemplateClient(url, connect_timeout=0.5, read_timeout=1.0, max_retries=5,
                                      min_rate_bps=1e9, max_deadline_s=60) as c:
                assert c.deadline_for(ref.bytes) < 2.0
                await c.fetch_object(ref)
        with pytest.raises(DeadlineExceeded):
            run(go())


def test_redirect_to_another_origin_is_refused_and_never_followed(ours, manifest):
    with hostile_in_thread(ours, "record") as (far, rec), hostile_in_thread(ours, "redirect", redirect_to=far) as (url, _):
        async def go():
            async with _client(url) as c:
                with pytest.raises(RedirectRefused, match="redirect to http://127.0.0.1"):
                    await c.get_manifest(FP, "tpl-000")
                with pytest.raises(RedirectRefused):
                    await c.fetch_object(manifest.shards[0].renditions[0].object)
                with pytest.raises(FetchError):
                    await c.manifest_keys()
        run(go())
        assert rec.requests == []  # nothing reached the origin the user never configured


def test_wrong_object_is_an_integrity_error(ours, manifest):
    a, b = manifest.shards[0].renditions[0].object, manifest.shards[1].renditions[0].object
    with hostile_in_thread(ours, "wrong-object", wrong_path="/" + b.path) as (url, _):
        async def go():
            async with _client(url) as c:
                await c.fetch_object(a)
        with pytest.raises(IntegrityError):
            run(go())


def test_huge_declared_object_is_read_only_to_its_declared_size(ours, manifest):
    # the manifest is rewritten to declare a 1.5 GB template reference; the client reads what
    # the caller asks for (the edit path refuses the size first: test_edit_hostile.py); here a
    # manifest-sized cap: the body is abandoned at the declared size plus one chunk, never buffered
    with hostile_in_thread(ours, "huge", huge_bytes=50_000_000) as (url, srv):
        async def go():
            async with _client(url) as c:
                m = await c.get_manifest(FP, "tpl-000")
                assert m.template_ref.object.bytes == 50_000_000
                from sakura.wire.store.manifest import ObjectRef

                small = ObjectRef(m.template_ref.object.sha256, manifest.template_ref.object.bytes)
                await c.fetch_object(small)  # asks for the true size: gets zeros, then more than asked
        with pytest.raises(IntegrityError):
            run(go())
        assert srv.huge_sha is not None


def test_manifest_declared_over_the_limit_is_refused_before_reading(store, tmp_path):
    from aiohttp import web

    from sakura.wire.store.manifest import MAX_MANIFEST_BYTES

    async def big(request):
        resp = web.StreamResponse(headers={"Content-Length": str(MAX_MANIFEST_BYTES * 100)})
        await resp.prepare(request)
        await resp.write(b"{" * 1024)
        await asyncio.sleep(30)
        return resp

    async def go():
        app = web.Application()
        app.router.add_get("/{tail:.*}", big)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with _client(f"http://127.0.0.1:{port}") as c:
                with pytest.raises(FetchError, match="over the manifest limit"):
                    await c.get_manifest(FP, "tpl-000")
        finally:
            await runner.cleanup()
    run(go())


def test_manifest_path_of_record_mode_is_transparent(ours):
    with hostile_in_thread(ours, "record") as (url, rec):
        async def go():
            async with _client(url) as c:
                return await c.get_manifest(FP, "tpl-000")
        m = run(go())
        assert m.template_id == "tpl-000"
        assert [r.path for r in rec.requests] == ["/" + manifest_relpath(FP, "tpl-000")]
