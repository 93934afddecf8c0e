"""What a cache server offers: `sakura templates --server URL`, and `sakura edit`'s list when
`--template` is missing or unknown.

Reads the server's `index.json` and each listed manifest (small JSON; the shards are not touched).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


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


async def _offered(server: str, model_fingerprint: str | None, timeout_s: float) -> list[OfferedTemplate]:
    from sakura.wire.client import TemplateClient

    async with TemplateClient(server, connect_timeout=timeout_s, read_timeout=timeout_s, max_retries=1) as c:
        keys = await c.manifest_keys()
        out = []
        for fp, tid in keys:
            if model_fingerprint is not None and fp != model_fingerprint:
                continue
            m = await c.get_manifest(fp, tid)
            lay = m.kv_layout
            instr = lay.get("instruction")
            cond = (f"prompt {instr!r}" if isinstance(instr, str) else f"instruction {instr}") if instr is not None else ""
            out.append(OfferedTemplate(
                template_id=tid, model=str(lay.get("model", "?")), model_fingerprint=fp,
                rungs=max(len(s.renditions) for s in m.shards), nbytes=sum(o.bytes for o in m.objects()),
                thumbnail=f"{server.rstrip('/')}/{m.template_ref.object.path}", conditioning=cond))
        return out


def list_templates(server: str, model_fingerprint: str | None = None, timeout_s: float = 5.0) -> list[OfferedTemplate]:
    """Every template `server` offers (for one model fingerprint, or all). Raises on a server that
    cannot be reached or whose index is malformed."""
    return asyncio.run(_offered(server, model_fingerprint, timeout_s))


def format_templates(items: list[OfferedTemplate]) -> str:
    """A table: id, model, rungs, bytes, thumbnail URL (one line each)."""
    if not items:
        return "(no templates)"
    w = max(len("id"), *(len(t.template_id) for t in items))
    wm = max(len("model"), *(len(f"{t.model} {t.model_fingerprint[:8]}") for t in items))
    lines = [f"{'id':{w}s}  {'model':{wm}s}  {'rungs':>5s}  {'bytes':>10s}  thumbnail"]
    for t in items:
        lines.append(f"{t.template_id:{w}s}  {t.model + ' ' + t.model_fingerprint[:8]:{wm}s}  {t.rungs:5d}  "
                     f"{t.nbytes:10d}  {t.thumbnail}" + (f"  ({t.conditioning})" if t.conditioning else ""))
    return "\n".join(lines)
