"""Incremental builds: which templates are current, decided before the model loads.

Two keys, both recorded in a manifest's ``kv_layout``:

- ``build_key`` (`build_key`): sha256 of the model's fingerprint (its weights, hashed), the
  template's 8-bit pixels and instruction, and every setting that changes the manifest. It needs
  the loaded model (the fingerprint, the template image at the model's size): the authority.
- ``source_key`` (`source_key`): sha256 of what the build was *asked* for, computable without
  torch or the model: the model spec and the identity of its weight files (path, size, mtime,
  inode: `model_source`), each template's name or its image files' sha256 and task / prompt, the
  same settings, and sakura's version. A rerun whose templates all find a verified manifest with
  their source key is finished before the model is imported (`skip_before_load`: well under a
  second for the bundled templates, where loading took 3-9 s).

Why the weight files' stat and not their hash: hashing Klein-4B's ~8 GB of weights takes longer
than the load it would save, and a rewritten file gets a new mtime (a copied one a new inode).
A source key that does not match only costs the model load: the `build_key` then decides, with
the real fingerprint. A spec naming a plugin model (no known files) has no source key: its
rerun loads the model and checks the build key.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sakura import __version__
from sakura.cloud.builder.defaults import DEFAULT_TEMPLATE_IDS
from sakura.cloud.builder.ladder import skipped_floor_rungs
from sakura.cloud.builder.template import FIGURE_CHECKS
from sakura.models import FLUX2_MINI_WEIGHTS, MINI_WEIGHTS
from sakura.models.registry import _BUNDLED, ModelSpecError, _lookup
from sakura.wire.store.store import Store, StoreError



def request_settings(*, ladder: Sequence[str], calibration: int, steps: int, seed: int, base_psnr_db: float | None,
                     allocation: str, sketch_probes: int | None, allocation_photos: int | None) -> dict[str, Any]:
    """Every build setting that changes a manifest, as both keys hash it."""
    return {"ladder": [s.strip() for s in ladder], "calibration": int(calibration), "steps": steps, "seed": seed,
            "base_psnr_db": base_psnr_db, "allocation": allocation, "sketch_probes": sketch_probes,
            "allocation_photos": allocation_photos, "figure_checks": FIGURE_CHECKS}


def build_key(model_fp: str, settings: dict[str, Any], images, instruction) -> str:
    """sha256 of what a template's build depends on: the model's fingerprint, the template's 8-bit
    pixels (``images`` (R, 3, S, S) in [0, 1]) and instruction, and `request_settings` (with the
    allocation that ran: "probes" for a model without a differentiable edit)."""
    px = (images.detach().float().clamp(0, 1).numpy() * 255).round().astype(np.uint8)
    d = {"model": model_fp, "pixels": hashlib.sha256(px.tobytes()).hexdigest(), "shape": list(px.shape),
         "instruction": str(instruction), **settings}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino]


def model_source(model_name: str) -> dict[str, Any] | None:
    """The identity of a bundled model spec's weights without loading them: the spec and each
    weight file's (path, size, mtime_ns, inode); None for a plugin's model (unknown files) or a
    spec whose files are not there (the load reports that)."""
    name, _, arg = model_name.strip().partition(":")
    try:
        if name not in _BUNDLED or _lookup(name).target != _BUNDLED[name]:
            return None
    except ModelSpecError:
        return None
    if name in ("sakura-mini", "flux2-mini"):
        path = Path(arg) if arg else (MINI_WEIGHTS if name == "sakura-mini" else FLUX2_MINI_WEIGHTS)
        if path.is_file():
            return {"spec": name, "files": [_file_identity(path)]}
        return None if arg else {"spec": name, "files": "seeded random init"}
    head, _, size = arg.rpartition("@")
    folder = Path(head if size.isdigit() else arg)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {"spec": model_name.strip(), "files": [[str(p.relative_to(folder)), *_file_identity(p)[1:]] for p in files]}


def template_source(template: Any) -> dict[str, Any] | None:
    """A template as requested: a library name, or a `TemplateSpec`'s image files' sha256, task and
    prompt (None if a file cannot be read: the build reports it)."""
    if isinstance(template, str):
        return {"library": template}
    try:
        images = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in template.images]
    except OSError:
        return None
    return {"id": template.id, "images": images, "task": template.task, "prompt": template.prompt}


def source_key(model_src: dict | None, template_src: dict | None, settings: dict[str, Any]) -> str | None:
    """sha256 of (model source, template source, settings, sakura's version); None when either
    source is unknown."""
    if model_src is None or template_src is None:
        return None
    d = {"model": model_src, "template": template_src, "settings": settings, "sakura": __version__}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def source_keys(model_name: str, templates: Sequence[Any] | None, settings: dict[str, Any]) -> dict[str, str]:
    """{template id: its source key} for every requested template that has one."""
    msrc = model_source(model_name)
    out = {}
    for t in templates or DEFAULT_TEMPLATE_IDS:
        key = source_key(msrc, template_source(t), settings)
        if key is not None:
            out[t if isinstance(t, str) else t.id] = key
    return out


def current_manifest(store: str | os.PathLike[str], template_id: str, key: str | None) -> Path | None:
    """The manifest of `template_id` (any model fingerprint) that records source key `key` and
    verifies (every object re-hashed: `Store.verify_manifest`); None if there is none. The ladder's
    renditions need no check of their own: the ladder is in the key."""
    if key is None:
        return None
    for path in sorted((Path(store) / "manifests").glob(f"*/{template_id}.json")):
        try:
            st = Store(store)
            recorded = st.get_manifest(path.parent.name, template_id).kv_layout.get("source_key")
        except (StoreError, KeyError, ValueError, OSError):  # not a store (yet), a damaged manifest
            continue
        if recorded == key and not st.verify_manifest(path.parent.name, template_id):
            return path
    return None


def skip_before_load(store: str | os.PathLike[str], keys: dict[str, str], ids: Sequence[str],
                     log: Callable[[str], None]) -> dict[str, tuple[Path, float, float]] | None:
    """If every template in `ids` is current by its source key: {id: (manifest, wall s, CPU s of
    its check)}, one line logged each; else None (nothing logged: the build loads the model)."""
    found = {}
    for tid in ids:
        t0, c0 = time.perf_counter(), time.process_time()
        path = current_manifest(store, tid, keys.get(tid))
        if path is None:
            return None
        found[tid] = (path, time.perf_counter() - t0, time.process_time() - c0)
    for tid, (_p, wall, _c) in found.items():
        log(f"{tid}: skipped (current: template, settings and model files as built; {wall:.2f} s to check, "
            f"model not loaded; --force rebuilds)")
    return found


def expected_rendition_bases(ladder: Sequence[str]) -> set[str]:
    """Rendition names a ladder produces, without a layered codec's ``#rung`` suffix."""
    return {s.strip() for s in ladder}


def manifest_is_current(store: str | os.PathLike[str], model_fingerprint: str, template_id: str,
                        ladder: Sequence[str]) -> bool:
    """True if ``template_id``'s manifest for this model exists, offers exactly ``ladder`` on
    every shard, and every object it references verifies (size, sha256, rung prefixes)."""
    try:
        st = Store(store)
        if st.verify_manifest(model_fingerprint, template_id):
            return False
        m = st.get_manifest(model_fingerprint, template_id)
    except (StoreError, KeyError, ValueError):
        return False
    want = expected_rendition_bases(ladder) - _skipped_floor_rungs(m, ladder)
    return bool(m.shards) and all({r.name.split("#", 1)[0] for r in s.renditions} == want for s in m.shards)


def _skipped_floor_rungs(m: Any, ladder: Sequence[str]) -> set[str]:
    """The floor rungs this manifest's build left out by rule (`ladder.skipped_floor_rungs`),
    judged from the budgets its plain ``progressive`` entry was calibrated to (its table's params)."""
    if "progressive" not in {s.strip() for s in ladder}:
        return set()
    try:
        params = m.table("progressive").params
    except KeyError:
        return set()  # no plain progressive entry on record: every floor rung must be there
    budgets = params.get("budgets")
    if not budgets:  # not calibrated: the codec's defaults (only then the codecs, and torch, are imported)
        from sakura.codec import get_codec  # lazy: torch; a rerun's skip check decides without it

        budgets = get_codec("progressive").params["budgets"]
    lowest = min(budgets)
    return skipped_floor_rungs(ladder, lowest)
