"""flux2-mini through the whole pipeline, unchanged code paths: `build_store` (capture, importance
probe, codec ladder, manifest) -> real HTTP server on loopback -> the streaming runtime into the
model. A store holds sakura-mini and flux2-mini templates side by side (manifests per model
fingerprint). Streamed lossless KV gives the bit-identical image."""

import pytest
import torch

from sakura.models import load_model
from sakura.models.flux2mini import save_flux2_mini_weights
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator, SakuraPolicy
from sakura.phone.live import profile_model, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.cloud.builder.pipeline import build_store
from sakura.cloud.tasks import get_template, heldout_photos


@pytest.fixture(scope="module")
def served(tmp_path_factory, make_tiny_flux2):
    root = tmp_path_factory.mktemp("store")
    weights = save_flux2_mini_weights(make_tiny_flux2(seed=4), root.parent / "flux2-tiny.safetensors")
    name = f"flux2-mini:{weights}"
    ladder = ["lossless", "uniform:bits=8"]
    build_store(root, model_name=name, templates=["sticker-00"], ladder=ladder, calibration=1, steps=1,
                log=lambda s: None)
    build_store(root, model_name="sakura-mini", templates=["sticker-00"], ladder=ladder, calibration=1, steps=1,
                log=lambda s: None)
    model = load_model(name)
    with serve_in_thread(root) as url:
        yield model, root, url


def _edit(served, policy, **kw):
    model, _, url = served
    tpl = get_template("sticker-00", model.cfg.image_size)
    photo = heldout_photos(model.cfg.image_size)[:1]
    res = streamed_edit(model, photo, base_url=url, template_id="sticker-00", template_image=tpl.image[None],
                        instruction=tpl.instruction, policy=policy, profile=profile_model(model, repeats=1), steps=2,
                        **kw)
    return res, tpl, photo


def test_streamed_lossless_kv_is_bit_exact(served):
    model = served[0]
    res, tpl, photo = _edit(served, FixedPolicy("lossless"))
    local = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    assert torch.equal(res.image, model.edit(photo, template_kv=local, steps=2).image)
    assert res.choices() == ["lossless"] * model.num_layers and res.bytes_fetched > 0


def test_streamed_all_local_equals_on_device_edit(served):
    model = served[0]
    # a link too slow to help: the plan fetches nothing and the edit takes the on-device path
    res, tpl, photo = _edit(served, SakuraPolicy(), bandwidth=BandwidthEstimator(prior_bps=1e2),
                            rtt=RttEstimator(prior_s=0.5))
    assert res.path == "on-device" and all(r.source == "local" for r in res.records) and res.bytes_fetched == 0
    want = model.edit(photo, template=tpl.image[None], instruction=tpl.instruction, steps=2).image
    assert torch.equal(res.image, want)


def test_store_holds_both_models_side_by_side(served):
    model, root, _ = served
    mini = load_model("sakura-mini")
    assert mini.fingerprint() != model.fingerprint()
    from sakura.wire.store.layout import manifest_relpath

    for m in (model, mini):
        assert (root / manifest_relpath(m.fingerprint(), "sticker-00")).is_file()
