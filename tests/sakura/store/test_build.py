"""`sakura build` end to end on sakura-mini: store contents decode to the captured KV, the template
reference reproduces it on the "phone", and a rebuild rewrites nothing."""

from __future__ import annotations

import io
import os

import pytest
import torch

from sakura.store import Store
from sakura.store.build import build_store


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    build_store(root, templates=["look-00"], ladder=["lossless", "uniform:bits=8", "sakura:budget=1.0"],
                calibration=1, steps=1, log=lambda s: None)
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
    m = st.load_manifest(fp, tid)
    assert tid == "look-00" and len(m.shards) == 8
    assert [r.name for r in m.shards[0].renditions] == ["lossless", "uniform:bits=8", "sakura:budget=1.0"]
    assert m.shards[0].renditions[0].distortion["expected"] == 0.0
    assert m.shards[0].renditions[1].distortion["expected"] > 0
    assert m.shards[0].renditions[2].object.bytes < m.shards[0].renditions[1].object.bytes

    # phone side: compute the KV locally from the template reference in the store ...
    ref = st_load(st.read_object(m.template_ref.object))
    meta = m.kv_layout
    model = load_model("sakura-mini")
    assert model.fingerprint() == fp
    local = model.extract_template_kv(ref["image"][None], int(meta["instruction"])).to(torch.float16)
    assert local.template_fingerprint == meta["template_fingerprint"]
    # ... and it equals the lossless rendition streamed from the store, bit for bit
    for s in m.shards:
        r = s.rendition("lossless")
        tables = None
        dec = decode_any(st.read_object(r.object), ShardId(fp, meta["template_fingerprint"], s.index), tables)
        assert torch.equal(dec.key, local.layers[s.index].key) and torch.equal(dec.value, local.layers[s.index].value)


def test_rebuild_is_idempotent(built):
    before = _snapshot(built)
    build_store(built, templates=["look-00"], ladder=["lossless", "uniform:bits=8", "sakura:budget=1.0"],
                calibration=1, steps=1, log=lambda s: None)
    assert _snapshot(built) == before
