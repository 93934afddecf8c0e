"""What a cache server offers: `sakura templates --server URL`, and `sakura edit`'s list when
`--template` is missing or unknown.

`sakura templates` reads the server's `index.json` and the listed manifests (small JSON; the
shards are not touched) within one overall deadline, skipping (and naming) entries it cannot
read. `sakura edit` reads only the one manifest it needs (`offered_manifest`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import time

from sakura.util.text import clean


@dataclass(frozen=True)
class OfferedTemplate:
    """One (model, template) a server offers.

    rungs: renditions per shard (the most any shard has); nbytes: everything the template costs
    on the server, each object once (ladder, tables, template reference); thumbnail: URL of the
    template reference image (a PNG: R reference images side by side).
    """

    template_id: str
    model: str
    model_fingerprint: str
    rungs: int
    nbytes: int
    thumbnail: str
    conditioning: str = ""


#: Manifests `sakura templates` reads at once (an index may list ~150k entries: the listing's
#: overall deadline, not their number, bounds the wait).
LIST_CONCURRENCY = 8
#: Seconds a whole listing may take (entries not read by then are skipped, named).
LIST_DEADLINE_S = 10.0


class TemplateListing(list):
    """The templates a server offers (a list of `OfferedTemplate`), plus ``skipped``: one line per
    listed entry that could not be read (``id: why``, sanitised), including those the overall
    deadline left unread."""

    def __init__(self, items=(), skipped=()):
        super().__init__(items)
        self.skipped: list[str] = list(skipped)


class TemplateNotOffered(ValueError):
    """`sakura edit` without ``--template``, or with one the server says it does not have: the
    message lists what the server offers for this model (one line, then the table)."""


def _offer(server: str, fp: str, tid: str, m) -> OfferedTemplate:
    lay = m.kv_layout
    instr = lay.get("instruction")
    cond = (f"prompt {instr!r}" if isinstance(instr, str) else f"instruction {instr}") if instr is not None else ""
    return OfferedTemplate(
        template_id=tid, model=str(lay.get("model", "?")), model_fingerprint=fp,
        rungs=max(len(s.renditions) for s in m.shards), nbytes=sum(o.bytes for o in m.objects()),
        thumbnail=f"{server.rstrip('/')}/{m.template_ref.object.path}", conditioning=cond)


async def offered_templates(client, server: str, model_fingerprint: str | None, deadline_s: float) -> TemplateListing:
    """Read the index, then the listed manifests (``LIST_CONCURRENCY`` at a time), all within one
    overall ``deadline_s``; an unreadable manifest (stale entry, corrupt, slow) is skipped and named."""
    t_end = time.monotonic() + deadline_s
    keys = await client.manifest_keys(deadline_s=deadline_s)
    keys = [(fp, tid) for fp, tid in keys if model_fingerprint is None or fp == model_fingerprint]
    results: dict[tuple[str, str], OfferedTemplate | str] = {}
    sem = asyncio.Semaphore(LIST_CONCURRENCY)

    async def one(fp: str, tid: str) -> None:
        async with sem:
            left = t_end - time.monotonic()
            if left <= 0:
                return
            try:
                results[(fp, tid)] = _offer(server, fp, tid, await client.get_manifest(fp, tid, deadline_s=left))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one bad entry must not hide the rest
                results[(fp, tid)] = " ".join(str(e).split()) or type(e).__name__

    tasks = [asyncio.ensure_future(one(fp, tid)) for fp, tid in keys]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, t_end - time.monotonic()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    out = TemplateListing()
    for fp, tid in keys:
        r = results.get((fp, tid))
        label = tid if model_fingerprint is not None else f"{fp[:8]}/{tid}"
        if isinstance(r, OfferedTemplate):
            out.append(r)
        else:
            out.skipped.append(clean(f"{label}: " + (r if r is not None else f"not read within the listing's "
                                                                             f"{deadline_s:.0f} s deadline"), 160))
    return out


async def list_templates_async(server: str, model_fingerprint: str | None = None, *, deadline_s: float = LIST_DEADLINE_S,
                               timeout_s: float = 5.0) -> TemplateListing:
    """`list_templates` on the running loop."""
    from sakura.wire.client import TemplateClient  # lazy: aiohttp, pydantic; off --help and argument errors

    async with TemplateClient(server, connect_timeout=min(timeout_s, deadline_s), read_timeout=timeout_s,
                              max_retries=1, max_connections=LIST_CONCURRENCY) as c:
        return await offered_templates(c, server, model_fingerprint, deadline_s)


def list_templates(server: str, model_fingerprint: str | None = None, timeout_s: float = 5.0, *,
                   deadline_s: float = LIST_DEADLINE_S) -> TemplateListing:
    """Every template `server` offers (for one model fingerprint, or all), read within one overall
    ``deadline_s``: entries that cannot be read in time (or at all) are in ``.skipped``, named.
    Raises on a server that cannot be reached or whose index is malformed or too slow."""
    return asyncio.run(list_templates_async(server, model_fingerprint, deadline_s=deadline_s, timeout_s=timeout_s))


async def offered_manifest(client, model_fingerprint: str, template_id: str | None, model_name: str, *,
                           deadline_s: float):
    """The manifest of the one template an edit needs, looked up by id within ``deadline_s``
    (never the whole index: an index may list ~150k entries). ``template_id`` None, or a 404 for
    it, raises `TemplateNotOffered` listing what the server offers for this model (a listing under
    the same deadline). Other failures (unreachable, slow, corrupt) propagate for the caller's
    fallback."""
    from sakura.wire.client import NotFound  # lazy: aiohttp, pydantic; off --help and argument errors

    server = client.base_url
    if template_id is not None:
        try:
            return await client.get_manifest(model_fingerprint, template_id, deadline_s=deadline_s)
        except NotFound:
            head = f"{server} offers no template {clean(template_id, 80)!r} for {clean(model_name, 80)}"
    else:
        head = "--template is required"
    try:
        offered = await offered_templates(client, server, model_fingerprint, deadline_s)
    except Exception as e:
        raise TemplateNotOffered(f"{head}, and {server} cannot list its templates "
                                 f"({clean(' '.join(str(e).split()) or type(e).__name__, 120)})") from None
    raise TemplateNotOffered(f"{head}; it offers {len(offered)} for this model:\n{format_templates(offered)}")


def format_templates(items: list[OfferedTemplate]) -> str:
    """A table: id, model, rungs, bytes, thumbnail URL (one line each), then one line per skipped
    entry. Every string from the server goes through `sakura.util.text.clean`."""
    skipped = getattr(items, "skipped", [])
    lines = []
    if not items:
        lines.append("(no templates)")
    else:
        rows = [(clean(t.template_id, 128), clean(f"{t.model} {t.model_fingerprint[:8]}", 80), t.rungs, t.nbytes,
                 clean(t.thumbnail, 200), clean(t.conditioning, 120)) for t in items]
        w = max(len("id"), *(len(r[0]) for r in rows))
        wm = max(len("model"), *(len(r[1]) for r in rows))
        lines.append(f"{'id':{w}s}  {'model':{wm}s}  {'rungs':>5s}  {'bytes':>10s}  thumbnail")
        for tid, model, rungs, nbytes, thumb, cond in rows:
            lines.append(f"{tid:{w}s}  {model:{wm}s}  {rungs:5d}  {nbytes:10d}  {thumb}" + (f"  ({cond})" if cond else ""))
    lines += [f"skipped {line}" for line in skipped]
    return "\n".join(lines)
