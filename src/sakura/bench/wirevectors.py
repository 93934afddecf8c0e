"""Wire-format test vectors (docs/wire-format.md): a tiny store and loose objects that a native
client can decode and check itself against.

The KV is a closed formula (no random generator), so anyone can recompute the lossless input:
for layer l, token t, head h, channel d (T = 16 tokens on a 4 x 4 grid, H = 2, D = 4, float16)

    key[l, t, h, d]   = fp16( sin(0.37 t + 1.3 h + 0.71 d + l) * (1 + d / 4) )
    value[l, t, h, d] = fp16( cos(0.23 t - 0.9 h + 0.53 d + 2 l) * (2 - h) )

(float64 arithmetic, then round to nearest float16). What is written under `out`:

    store/                       a complete store (index.json, manifests/, objects/): every rendition
                                 kind `sakura build` writes (lossless, uniform, CacheGen with tables,
                                 the progressive ladder as byte prefixes of one object, with tables)
    header-dict-1.bin            the frozen zstd header dictionary (flag bit 1), as raw bytes
    objects/<name>.skkv          loose objects, one per codec and format version still read
                                 (including version-4 objects transcoded from version-5 ones)
    vectors.json                 for each object: how to decode it (identity, tables, prefix) and what
                                 it decodes to (sha256 of the little-endian key then value bytes, the
                                 keep mask, a few exact values)

Regenerating gives the same bytes (`tests/sakura/bench/test_wirevectors.py` checks both that and
that the committed vectors decode as recorded). Run: ``python -m sakura.bench.wirevectors``
(writes out/wire-vectors); ``--docs`` rewrites docs/wire-format/vectors.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any
import argparse

import numpy as np
import torch

from sakura.codec import CodecTables, ShardId, ShardKV, codec_from_spec, decode_any
from sakura.codec import bitstream as bs
from sakura.codec.base import parse_spec
from sakura.util.fsutil import atomic_write
from sakura.wire.store.store import RenditionInput, StoreWriter
from sakura.wire.store.template_ref import TEMPLATE_REF_MEDIA_TYPE, encode_template_images

MODEL = "vector-model"
TEMPLATE = "vector-template"
#: the template's fingerprint: what objects carry as their identity (a real build: the model's
#: `template_fingerprint` of the template image, recorded as the manifest's
#: kv_layout["template_fingerprint"] and recomputed by the phone), distinct from the template id
TEMPLATE_FP = hashlib.sha256(b"vector-template").hexdigest()
LAYERS, TOKENS, HEADS, HEAD_DIM = 2, 16, 2, 4
DOCS_DIR = Path("docs/wire-format/vectors")
DEFAULT_OUT = Path("out/wire-vectors")
#: the renditions of the store's shards: (rendition name, codec spec); tables for codecs that use them
STORE_LADDER = (("lossless", "lossless"), ("uniform4", "uniform:bits=4,key_group=4,value_group=4"),
                ("cachegen", "cachegen:level=3"),
                ("progressive", "progressive:budgets=[1.0,2.0,4.0],allocate=\"none\""))
#: loose objects (no tables: each carries what it needs): (file stem, codec spec, transcode to version 4)
LOOSE = (("lossless", "lossless", False), ("lossless-zstd", "lossless:zstd=true", False),
         ("uniform8", "uniform", False), ("uniform4", "uniform:bits=4,key_group=4,value_group=4", False),
         ("cachegen-v5", "cachegen:level=3", False), ("cachegen-v4", "cachegen:level=3", True),
         ("cachegen-delta", "cachegen:level=2,delta=true,group=4", False),
         ("progressive-v5", "progressive:budgets=[1.0,2.0,4.0],allocate=\"none\"", False),
         ("progressive-v4", "progressive:budgets=[1.0,2.0,4.0],allocate=\"none\"", True),
         ("sakura-nested", "sakura:budget=4.0", False),
         ("sakura-ecsq", "sakura:quantiser=\"ecsq\",transform=\"dct\",budget=3.0", False),
         ("layered-nested", "layered:budgets=[2.0,4.0]", False))


def layer_kv(layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The vectors' KV of `layer`: (key, value), each (TOKENS, HEADS, HEAD_DIM) float16 (the formula
    in the module docstring)."""
    t, h, d = np.meshgrid(np.arange(TOKENS), np.arange(HEADS), np.arange(HEAD_DIM), indexing="ij")
    key = np.sin(0.37 * t + 1.3 * h + 0.71 * d + layer) * (1 + d / 4)
    value = np.cos(0.23 * t - 0.9 * h + 0.53 * d + 2 * layer) * (2 - h)
    return torch.from_numpy(key.astype(np.float16)), torch.from_numpy(value.astype(np.float16))


#: the big-layout vectors' shard: the same formula at T = 16 tokens (a 4 x 4 grid, 7 bands), H = 56
#: heads, D = 128: 114,688 coefficients per part, >= 16,384 per band, so the progressive coder
#: groups symbols (rung-0 quads with escapes, several refinement values per symbol)
BIG_HEADS, BIG_HEAD_DIM = 56, 128
#: (file stem, codec spec, with tables): the big layouts, self-contained and with a table object
#: (token scales, `weighting="importance"`, need tables: see docs/wire-format.md 4.8)
BIG = (("progressive-big", "progressive:budgets=[0.5,1.5,3.0],allocate=\"none\"", False),
       ("progressive-big-scaled", "progressive:budgets=[0.5,1.5,3.0],allocate=\"none\",weighting=\"importance\"",
        True))


def big_shard() -> ShardKV:
    """The big-layout vectors' layer 0: `layer_kv`'s formula over BIG_HEADS x BIG_HEAD_DIM, and the
    token importance w_t = 1 + (t mod 5) / 2 (what `weighting="importance"` turns into scales)."""
    t, h, d = np.meshgrid(np.arange(TOKENS), np.arange(BIG_HEADS), np.arange(BIG_HEAD_DIM), indexing="ij")
    key = np.sin(0.37 * t + 1.3 * h + 0.71 * d) * (1 + (d % 4) / 4)
    value = np.cos(0.23 * t - 0.9 * h + 0.53 * d) * (2 - (h % 2))
    imp = torch.from_numpy(1.0 + (np.arange(TOKENS) % 5) / 2.0).float()
    return ShardKV(torch.from_numpy(key.astype(np.float16)), torch.from_numpy(value.astype(np.float16)),
                   importance=imp, layer=0, num_layers=1)


def template_images() -> torch.Tensor:
    """Two 4 x 4 RGB reference images (R = 2): pixel values k/255, exact in the 8-bit PNG."""
    k = (np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4) * 37) % 256
    return torch.from_numpy(k.astype(np.float32) / np.float32(255.0))


def shards() -> list[ShardKV]:
    return [ShardKV(*layer_kv(l), layer=l, num_layers=LAYERS) for l in range(LAYERS)]


def decoded_record(key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor) -> dict[str, Any]:
    """What a decode must give: sha256 over the key's then the value's little-endian bytes in the
    shard's dtype, the keep mask, and a few values (float16 is exact in a JSON double)."""
    kb = key.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    vb = value.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    return {"sha256_key_value": hashlib.sha256(kb + vb).hexdigest(),
            "keep": [bool(x) for x in keep.tolist()],
            "key[0,0,:]": [float(x) for x in key[0, 0].float().tolist()],
            "value[-1,-1,:]": [float(x) for x in value[-1, -1].float().tolist()]}


def pack_object(version: int, kind: int, header: dict[str, Any], payload: bytes) -> bytes:
    """One object with a plain (uncompressed) JSON header, written the way docs/wire-format.md says,
    independently of `bitstream.Writer` (what a native writer would do)."""
    h = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    fixed = struct.pack("<4sHBBIQ", b"SKKV", version, kind, 0, len(h), len(payload))
    crc = zlib.crc32(payload, zlib.crc32(h, zlib.crc32(fixed)))
    return fixed + struct.pack("<I", crc) + h + payload


def to_version4(data: bytes, ident: ShardId) -> bytes:
    """A version-5 progressive or CacheGen object (all its rungs) rewritten as version 4: the full
    identity instead of the digest, no reconstruction offsets (the ladder must use the midpoint,
    1/2, everywhere), plain headers; payloads unchanged."""
    out = []
    for start, end in bs.split_objects(data):
        obj = bs.parse(data[start:end])
        h = dict(obj.header)
        if obj.kind == bs.KIND_SHARD:
            h["id"] = ident.to_json()
            for part in (h.get("prog") or {}).values():
                if any(o != 0.5 for o in part.pop("off")):
                    raise ValueError("only a ladder at the midpoint offsets has a version-4 form")
        else:   # a refinement names its parent by crc32 of the (rewritten) previous object
            h["parent_crc"] = zlib.crc32(out[-1])
        sections = h.pop("sections")
        h["sections"] = sections
        out.append(pack_object(4, obj.kind, h, bytes(obj.payload)))
    return b"".join(out)


def _decode_checked(data: bytes, ident: ShardId, tables: CodecTables | None) -> dict[str, Any]:
    d = decode_any(data, ident, tables)
    return decoded_record(d.key, d.value, d.keep)


def _ident_json(ident: ShardId) -> dict[str, Any]:
    return {**ident.to_json(), "digest": ident.digest()}


def generate(out: Path) -> dict[str, Any]:
    """Write the vectors under `out` (replacing what was there); returns vectors.json's content."""
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "objects").mkdir(parents=True)
    sh = shards()
    ident = lambda i: ShardId(MODEL, TEMPLATE_FP, i)  # noqa: E731
    table_ident = ShardId(MODEL, TEMPLATE_FP, -1)
    entries: list[dict[str, Any]] = []

    # the store: what `sakura build` writes, at toy size
    with StoreWriter(out / "store", model_fingerprint=MODEL, template_id=TEMPLATE) as w:
        w.set_template_ref(encode_template_images(template_images()), media_type=TEMPLATE_REF_MEDIA_TYPE)
        encoded: list[list[RenditionInput]] = [[] for _ in sh]
        for rname, spec in STORE_LADDER:
            codec = codec_from_spec(spec)
            tables = codec.fit_tables(sh) if codec.uses_tables else None
            tnames: tuple[str, ...] = ()
            if tables is not None:
                tdata = tables.to_bytes(table_ident)
                w.add_table(rname, codec=codec.name, data=tdata, params=parse_spec(spec)[1])  # as `sakura build`
                tnames = (rname,)
                entries.append({"name": f"store table {rname}", "path": _objpath(tdata), "kind": "tables",
                                "identity": _ident_json(table_ident), "fingerprint": tables.fingerprint})
            for i, s in enumerate(sh):
                data = codec.encode(s, ident(i), tables)
                ends = codec.level_ends(data) if codec.supports_layers else [None]
                for rung, end in enumerate(ends):
                    piece = data if end is None else data[:end]
                    name = rname if end is None else f"{rname}#{rung}"
                    encoded[i].append(RenditionInput(name=name, codec=codec.name, data=data,
                                                     params=codec.params if tables is None else {},
                                                     prefix_bytes=end, tables=tnames))
                    entries.append({"name": f"store shard {i} {name}", "path": _objpath(data), "prefix_bytes": end,
                                    "codec": codec.name, "version": bs.parse(data, whole=False).version,
                                    "identity": _ident_json(ident(i)),
                                    "tables": None if tables is None else _objpath(tables.to_bytes(table_ident)),
                                    "decoded": _decode_checked(piece, ident(i), tables)})
        for i, s in enumerate(sh):
            w.add_shard(layer=i, tokens=(0, TOKENS), fp16_bytes=s.fp16_bytes, renditions=encoded[i])
        w.set_kv_layout({"layers": LAYERS, "tokens": TOKENS, "heads": HEADS, "head_dim": HEAD_DIM,
                         "dtype": "float16", "template_fingerprint": TEMPLATE_FP})

    for private in (".lock", ".tmp", ".writers.lock"):   # the writers' locks and temp folder: never served, not vectors
        q = out / "store" / private
        shutil.rmtree(q) if q.is_dir() else q.unlink(missing_ok=True)

    # loose objects, shard 0 only, each self-contained (no tables)
    for stem, spec, v4 in LOOSE:
        codec = codec_from_spec(spec)
        data = codec.encode(sh[0], ident(0), None)
        if v4:
            data = to_version4(data, ident(0))
        path = f"objects/{stem}.skkv"
        (out / path).write_bytes(data)
        rec: dict[str, Any] = {"name": stem, "path": path, "codec": codec.name, "spec": spec,
                               "version": bs.parse(data, whole=False).version, "identity": _ident_json(ident(0)),
                               "tables": None, "decoded": _decode_checked(data, ident(0), None)}
        if codec.supports_layers:
            rec["rungs"] = [{"prefix_bytes": e, "decoded": _decode_checked(data[:e], ident(0), None)}
                            for e in codec.level_ends(data)]
        entries.append(rec)

    # the big progressive layouts (quads, escapes, grouped refinements; token scales with tables)
    big = big_shard()
    for stem, spec, with_tables in BIG:
        codec = codec_from_spec(spec)
        tables = codec.fit_tables([big]) if with_tables else None
        data = codec.encode(big, ident(0), tables)
        path = f"objects/{stem}.skkv"
        (out / path).write_bytes(data)
        tpath = None
        if tables is not None:
            tpath = f"objects/{stem}.tables.skkv"
            (out / tpath).write_bytes(tables.to_bytes(table_ident))
        entries.append({"name": stem, "path": path, "codec": codec.name, "spec": spec,
                        "shape": [TOKENS, BIG_HEADS, BIG_HEAD_DIM],
                        "version": bs.parse(data, whole=False).version, "identity": _ident_json(ident(0)),
                        "tables": tpath, "decoded": _decode_checked(data, ident(0), tables),
                        "rungs": [{"prefix_bytes": e, "decoded": _decode_checked(data[:e], ident(0), tables)}
                                  for e in codec.level_ends(data)]})

    (out / "header-dict-1.bin").write_bytes(bs.HEADER_DICT_1)   # flag bit 1's zstd raw-content dictionary
    doc = {"schema": "sakura.wire-vectors", "schema_version": 1,
           "header_dict_1": {"path": "header-dict-1.bin", "bytes": len(bs.HEADER_DICT_1),
                             "sha256": hashlib.sha256(bs.HEADER_DICT_1).hexdigest()},
           "kv": {"layers": LAYERS, "tokens": TOKENS, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "float16",
                  "key": "fp16(sin(0.37 t + 1.3 h + 0.71 d + l) * (1 + d / 4))",
                  "value": "fp16(cos(0.23 t - 0.9 h + 0.53 d + 2 l) * (2 - h))",
                  "input": [decoded_record(s.key, s.value, torch.ones(TOKENS, dtype=torch.bool)) for s in sh]},
           "store": {"root": "store", "model_fingerprint": MODEL, "template_id": TEMPLATE,
                     "template_fingerprint": TEMPLATE_FP,
                     "template_ref_pixels_sha256": hashlib.sha256(
                         (template_images().permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8).tobytes()
                     ).hexdigest()},
           "objects": entries}
    atomic_write(out / "vectors.json", (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode())
    return doc


def _objpath(data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    return f"store/objects/{sha[:2]}/{sha}"


def _vector_entry(root: Path, e: dict) -> tuple[bytes, ShardId, CodecTables | None, list[tuple[int | None, dict]]]:
    """One listed object of vectors.json: its bytes, identity, tables and [(prefix end or None,
    recorded digest)] for the whole object and each rung."""
    data = (root / e["path"]).read_bytes()
    ident = ShardId(e["identity"]["model"], e["identity"]["template"], e["identity"]["shard"])
    tables = None
    if e["tables"] is not None:
        tables = CodecTables.from_bytes((root / e["tables"]).read_bytes(), ShardId(ident.model, ident.template, -1))
    cuts = [(e.get("prefix_bytes"), e["decoded"])] + [(r["prefix_bytes"], r["decoded"]) for r in e.get("rungs", [])]
    return data, ident, tables, cuts


def check(root: Path) -> list[str]:
    """Decode every object listed in `root`/vectors.json with this build; the problems found
    (empty when every object decodes to what is recorded)."""
    root = Path(root)
    doc = json.loads((root / "vectors.json").read_text())
    problems = []
    for e in doc["objects"]:
        if e.get("kind") == "tables":
            continue
        data, ident, tables, pieces = _vector_entry(root, e)
        for end, want in pieces:
            got = _decode_checked(data if end is None else data[:end], ident, tables)
            if got != want:
                problems.append(f"{e['name']} (prefix {end}): decodes to {got['sha256_key_value'][:12]}…, "
                                f"recorded {want['sha256_key_value'][:12]}…")
    return problems


def _case_prog(pieces: list[bytes], tables: CodecTables | None) -> bytes:
    """A progressive ladder's rungs (whole objects) as one native case body (native/tests/skn_case.h)."""
    base = bs.parse(pieces[0])
    h = base.header
    T, H, D = (int(x) for x in h["shape"])
    levels = int(h["levels"])
    out = [struct.pack("<4i", T, H, D, levels)]
    for kv in ("k", "v"):
        e = h["prog"][kv]
        planes = list(e["planes"]) + [0] * (16 - levels)
        off = list(e.get("off") or []) + [0.0] * (16 - len(e.get("off") or []))
        out.append(struct.pack("<d5i16i16d", float(e["step"]), int(e["m0"]), int(e["grid"]),
                               int(np.dtype(e["mean"]).str == "<f4"), int(bool(e.get("scaled", False))),
                               int(e.get("off") is not None), *planes, *off))
    layer = int(h.get("layer", 0))
    out.append(struct.pack("<I", int(tables is not None)))
    if tables is not None:
        for kv in ("k", "v"):
            mu = tables.arrays.get(f"L{layer}.{kv}.mean")
            out.append(struct.pack("<I", int(mu is not None)))
            if mu is not None:
                out.append(np.ascontiguousarray(mu, "<f4").tobytes())
            for slot in range(17):
                name = "e0q" if slot == 0 else f"e{slot - 1}"
                a = tables.arrays.get(f"L{layer}.{kv}.{name}")
                a = np.zeros((0, 0), np.uint8) if a is None else np.ascontiguousarray(a, np.uint8)
                out.append(struct.pack("<2I", *a.shape) + a.tobytes())
    out.append(struct.pack("<I", len(pieces)))
    for piece in pieces:
        o = bs.parse(piece)
        own = list(o.header.get("own") or [])
        p = o.section("p").tobytes()
        out.append(struct.pack(f"<I{len(own)}iI", len(own), *own, len(p)) + p)
    return b"".join(out)


def _case_cachegen(data: bytes, tables: CodecTables | None) -> bytes:
    o = bs.parse(data)
    h = o.header
    T, H, D = (int(x) for x in h["shape"])
    C, layer = H * D, int(h.get("layer", 0))
    out = [struct.pack("<2i", T, C)]
    for kv, bins in (("k", int(h["key_bins"])), ("v", int(h["value_bins"]))):
        hist = tables.get(f"L{layer}.{kv}.b{bins}") if tables is not None else o.section(f"hist.{kv}")
        w, pc = o.section(f"rans.{kv}"), o.section(f"pieces.{kv}")
        out.append(struct.pack("<i", bins) + np.asarray(o.section(f"{kv}_amax"), "<f4").tobytes()
                   + np.ascontiguousarray(hist, "<u4").tobytes() + struct.pack("<I", w.size) + w.astype("<u2").tobytes()
                   + struct.pack("<I", pc.size) + pc.astype("<u4").tobytes())
    return b"".join(out)


def _case_lossless(data: bytes) -> bytes:
    o = bs.parse(data)
    n = int(np.prod(o.header["shape"]))
    planes = bool(o.header["params"].get("zstd"))
    return struct.pack("<Ii", n, int(planes)) + b"".join(o.section(nm).astype("<u2" if not planes else "|u1").tobytes()
                                                        for nm in ("key", "value"))


def native_cases(root: Path, out: Path) -> list[Path]:
    """The vectors under `root` that libsakura_decode decodes (progressive, every rung; CacheGen but
    its delta variant; lossless), as case files for its C runner and fuzz seeds
    (native/tests/skn_case.h): the container already parsed (the app's part), the expected digest
    as recorded. Returns the files written."""
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = json.loads((root / "vectors.json").read_text())
    files = []
    for e in doc["objects"]:
        if e.get("kind") == "tables" or e["codec"] not in ("progressive", "cachegen", "lossless"):
            continue
        if "delta=true" in e.get("spec", ""):
            continue
        data, _ident, tables, cuts = _vector_entry(root, e)
        if bs.parse(data, whole=False).header.get("dtype") != "float16":
            continue
        for k, (end, want) in enumerate(cuts):
            piece = data if end is None else data[:end]
            if e["codec"] == "progressive":
                kind, body = 1, _case_prog([bytes(piece[a:b]) for a, b in bs.split_objects(piece)], tables)
            elif e["codec"] == "cachegen":
                kind, body = 2, _case_cachegen(piece, tables)
            else:
                kind, body = 3, _case_lossless(piece)
            f = out / f"{e['name'].replace(' ', '_').replace('#', '-')}-{k}.case"
            f.write_bytes(b"SKNC" + struct.pack("<I", kind) + bytes.fromhex(want["sha256_key_value"]) + body)
            files.append(f)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sakura.bench.wirevectors", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT})")
    ap.add_argument("--docs", action="store_true", help=f"rewrite the published vectors, {DOCS_DIR}")
    ap.add_argument("--check", type=Path, default=None, metavar="DIR", help="decode the vectors in DIR and compare")
    ap.add_argument("--native-cases", type=Path, default=None, metavar="DIR",
                    help="write the vectors (of --check's folder, default the docs') as libsakura_decode case files")
    a = ap.parse_args(argv)
    if a.native_cases is not None:
        files = native_cases(a.check or DOCS_DIR, a.native_cases)
        print(f"wrote {len(files)} cases to {a.native_cases}")
        return 0
    if a.check is not None:
        problems = check(a.check)
        for p in problems:
            print(p)
        print(f"{'FAIL' if problems else 'ok'}: {a.check}")
        return 1 if problems else 0
    out = a.out or (DOCS_DIR if a.docs else DEFAULT_OUT)
    doc = generate(out)
    print(f"wrote {len(doc['objects'])} vectors to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
