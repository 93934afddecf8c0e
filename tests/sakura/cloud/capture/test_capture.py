"""Cloud-side measurements on the bundled model: image distortion of one shard's rendition, token
sensitivity (gradient, checked against finite differences), calibration photos."""

from __future__ import annotations

import math

import pytest
import torch

from sakura.cloud.capture import ShardDistortionProbe, calibration_photos, psnr_db, token_sensitivity
from sakura.models import LayerKV, TemplateKV, load_model
from sakura.cloud.tasks import get_template, heldout_photos


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model = load_model("sakura-mini")
    tpl = get_template("sticker-00", model.cfg.image_size)
    kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    return model, kv, calibration_photos(model.cfg.image_size, 2)


def test_calibration_photos_are_public_training_crops():
    a, b = calibration_photos(64, 3), calibration_photos(64, 3)
    assert a.shape == (3, 3, 64, 64) and torch.equal(a, b) and 0 <= float(a.min()) and float(a.max()) <= 1
    test = heldout_photos(64, n_per_source=2)
    assert not any(torch.equal(x, y) for x in a for y in test)
    with pytest.raises(ValueError):
        calibration_photos(64, 0)


def test_distortion_probe(setup):
    model, kv, calib = setup
    probe = ShardDistortionProbe(model, kv, calib, steps=2)
    assert probe.measure(2, kv.layers[2]) == {"image_mse": 0.0, "image_psnr_db": math.inf}
    noisy = LayerKV(kv.layers[2].key, (kv.layers[2].value.float() * 1.2).half())
    m = probe.measure(2, noisy)
    assert 0 < m["image_mse"] < 0.1 and m["image_psnr_db"] == pytest.approx(psnr_db(m["image_mse"]))
    # a larger perturbation of the same shard moves the image more
    worse = LayerKV(kv.layers[2].key, (kv.layers[2].value.float() * 1.6).half())
    assert probe.image_mse(2, worse) > m["image_mse"]


def test_token_sensitivity_matches_finite_differences(setup):
    model, kv, calib = setup
    s = token_sensitivity(model, kv, calib, steps=2, probes=16)
    assert s.shape == (kv.num_layers, 2, kv.num_tokens) and bool((s >= 0).all())
    ref = model.edit(calib, template_kv=kv, steps=2).image.double()
    g = torch.Generator().manual_seed(0)
    layer, tok = 3, int(torch.argmax(s[3, 1]))
    v = kv.layers[layer].value.float()
    sigma = 0.02 * float(v.abs().mean())
    mses = []
    for _ in range(6):
        v2 = v.clone()
        v2[tok] += sigma * torch.randn(v[tok].shape, generator=g)
        layers = list(kv.layers)
        layers[layer] = LayerKV(kv.layers[layer].key, v2)
        img = model.edit(calib, template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint,
                                                       kv.layout), steps=2).image.double()
        mses.append(float((img - ref).pow(2).mean()))
    measured = sum(mses) / len(mses)
    predicted = float(s[layer, 1, tok]) * sigma ** 2
    assert 0.4 < measured / predicted < 2.5, (measured, predicted)
    # the most sensitive token matters more than the least sensitive one of the same layer
    assert float(s[layer, 1].max()) > 3 * float(s[layer, 1].min())


def test_layer_sensitivity_through_the_probe_equals_whole_edits(tiny_mini):
    """The build hands `layer_sensitivity` the probe's one-layer edits (first-step prefix) and its
    reference image: the same sensitivities, to the last bit, as whole edits."""
    from sakura.cloud.capture import layer_sensitivity

    g = torch.Generator().manual_seed(8)
    kv = tiny_mini.extract_template_kv(torch.rand(1, 3, 16, 16, generator=g)).to(torch.float16)
    photos = torch.rand(2, 3, 16, 16, generator=g)
    layers = [(l.key, l.value) for l in kv.layers]

    def edit(ls):
        return tiny_mini.edit(photos, template_kv=TemplateKV([LayerKV(k, v) for k, v in ls], kv.model_fingerprint,
                                                             kv.template_fingerprint, kv.layout), steps=2).image

    probe = ShardDistortionProbe(tiny_mini, kv, photos, steps=2)
    whole = layer_sensitivity(layers, edit)
    fast = layer_sensitivity(layers, edit, reference=probe.reference_image,
                             edit_one=lambda i, kv_: probe.edit_replacing(i, LayerKV(*kv_)))
    assert fast == whole and all(k > 0 and v > 0 for k, v in whole)
