"""Issue 35 item 10, the runtime parts: a bad codec table costs one fetch, not one per shard and
retry; a fixed policy naming a rendition the store lacks computes locally and leaks no session."""

from __future__ import annotations

import dataclasses
import gc
import logging
import shutil

import pytest
import torch

from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.tasks import get_template, heldout_photos
from sakura.emulation.faults import hostile_in_thread
from sakura.models import load_model
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.live import DeviceProfile, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store, _locked, _write_index, atomic_write, put_object
from sakura.wire.store.layout import manifest_relpath

pytestmark = pytest.mark.timeout(300)
LADDER = ["lossless", "layered:budgets=[1.0,2.0]"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lstore")
    build_store(root, templates=["sticker-00"], ladder=LADDER, calibration=1, steps=1, log=lambda s: None)
    model = load_model("sakura-mini")
    tpl = get_template("sticker-00", model.cfg.image_size)
    photo = heldout_photos(model.cfg.image_size)[:1]
    return model, tpl, photo, root


def _edit(setup, url, m, policy):
    model, tpl, photo, _ = setup
    return streamed_edit(model, photo, base_url=url, template_id="sticker-00", template_image=tpl.image[None],
                         instruction=tpl.instruction, policy=policy, bandwidth=BandwidthEstimator(prior_bps=1e9),
                         rtt=RttEstimator(prior_s=0.001), steps=2, manifest=m, allow_fast_path=False,
                         profile=DeviceProfile(compute_s=0.002, local_s=0.002))


def test_bad_codec_table_is_fetched_once(setup, tmp_path):
    root = tmp_path / "s"
    shutil.copytree(setup[3], root)
    st = Store(root)
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    assert m.tables, "the layered rung needs a table"
    bad = put_object(root, b"\x00not a codec table" * 64)  # sha-consistent, undecodable
    m = dataclasses.replace(m, tables=tuple(dataclasses.replace(t, object=bad) for t in m.tables))
    atomic_write(root, manifest_relpath(fp, tid), m.to_bytes())
    with _locked(root):
        _write_index(root)
    name = next(r.name for r in m.shards[0].renditions if r.tables)
    with serve_in_thread(root) as up, hostile_in_thread(up, "record") as (url, srv):
        res = _edit(setup, url, m, FixedPolicy(name))
    table_gets = [q for q in srv.requests if q.path == "/" + bad.path]
    assert len(table_gets) == 1, len(table_gets)  # main: once per shard and retry
    assert all(r.source == "local" for r in res.records), [r.source for r in res.records]


def test_policy_with_a_missing_rung_computes_locally_without_leaking(setup, caplog):
    st = Store(setup[3])
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    with serve_in_thread(setup[3]) as url, caplog.at_level(logging.ERROR):
        res = _edit(setup, url, m, FixedPolicy("no-such-rung", name="raw-stream"))
        gc.collect()
    assert all(r.source == "local" for r in res.records)
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()], [r.getMessage() for r in caplog.records]
