"""`sakura build` end to end on sakura-mini: store contents decode to the captured KV, the template
reference reproduces it on the "phone", and a rebuild rewrites nothing."""

from __future__ import annotations

import io
import os

import pytest
import torch

from sakura.store import Store
from sakura.store.build import build_store

LADDER = ["lossless", "uniform:bits=8", "layered:budgets=[1.0,2.0]"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    build_store(root, templates=["look-00"], ladder=LADDER, calibration=1, steps=1, log=lambda s: None)
    return root


def _snapshot(root):
    return {os.path.relpath(os.path.join(d, f), root): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, fs in os.walk(root) for f in fs if not f.startswith(".")}


def test_build_writes_a_valid_store_that_decodes(built):
    from safetensors.torch import load as st_load

    from sakura.codec import ShardId, decode_any
    from sakura.models import load_model

    st = Store(built)
    assert st.verify().ok
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    model = load_model("sakura-mini")
    assert tid == "look-00" and len(m.shards) == model.num_layers
    names = ["lossless", "uniform:bits=8", "layered:budgets=[1.0,2.0]#0", "layered:budgets=[1.0,2.0]#1"]
    assert [r.name for r in m.shards[0].renditions] == names
    lossless, q8, rung0, rung1 = m.shards[0].renditions
    assert lossless.distortion["expected"] == 0.0 and q8.distortion["expected"] > 0
    # layered rungs: byte prefixes of one object, cheaper and coarser first
    assert rung0.object == rung1.object and rung0.prefix is not None
    assert rung0.nbytes < rung1.nbytes <= rung1.object.bytes < q8.nbytes
    assert rung0.distortion["expected"] > rung1.distortion["expected"]
    # a rung decodes from its prefix alone, with the template's shared tables from the store
    from sakura.codec import CodecTables, get_codec
    meta = m.kv_layout
    tbl = m.table(rung0.tables[0])
    tables = CodecTables.from_bytes(st.get_object(tbl.object), ShardId(fp, meta["template_fingerprint"], -1))
    prefix = st.get_object(rung0.object)[: rung0.nbytes]
    dec0 = get_codec("layered").decode(prefix, ShardId(fp, meta["template_fingerprint"], 0), tables)
    assert tuple(dec0.key.shape) == (meta["tokens"], meta["heads"], meta["head_dim"])

    # phone side: compute the KV locally from the template reference in the store ...
    ref = st_load(st.get_object(m.template_ref.object))
    assert model.fingerprint() == fp
    local = model.extract_template_kv(ref["image"][None], int(meta["instruction"])).to(torch.float16)
    assert local.template_fingerprint == meta["template_fingerprint"]
    # ... and it equals the lossless rendition streamed from the store, bit for bit
    for s in m.shards:
        r = s.rendition("lossless")
        tables = None
        dec = decode_any(st.get_object(r.object), ShardId(fp, meta["template_fingerprint"], s.index), tables)
        assert torch.equal(dec.key, local.layers[s.index].key) and torch.equal(dec.value, local.layers[s.index].value)


def test_rebuild_is_idempotent(built):
    before = _snapshot(built)
    build_store(built, templates=["look-00"], ladder=LADDER, calibration=1, steps=1, log=lambda s: None)
    assert _snapshot(built) == before
