"""The build's sensitivity model (issue 41): image MSE predicted from a KV error by a sketch of the
calibration edits' Gauss-Newton matrix, checked against measured edits on the bundled tiny model;
its coefficient-domain form equal to the token-domain one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.cloud.capture import kv_sensitivity as KS
from sakura.cloud.capture import PredictedDistortion, ShardDistortionProbe, calibration_photos, measure_kv_sensitivity
from sakura.cloud.tasks import get_template
from sakura.codec import ShardKV
from sakura.codec.progressive import ladder as P
from sakura.models import LayerKV, load_model
from sakura.models.kv import TemplateKV


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model = load_model("sakura-mini")
    tpl = get_template("look-00", model.cfg.image_size)
    kv = model.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    calib = calibration_photos(model.cfg.image_size, 2)
    sens = measure_kv_sensitivity(model, kv, calib, steps=4, seed=0, probes=8)
    return model, kv, calib, sens


def _variants(kv, n_layers=(0, 2, 5)):
    """Decoded parts of the progressive quantiser at several steps and offsets (the allocation's own
    candidates): [(layer, "k"/"v", decoded (T, H, D) fp16)]."""
    shards = [ShardKV(l.key, l.value, layer=i, num_layers=kv.num_layers) for i, l in enumerate(kv.layers)]
    fine, _sens, means, _tv, _sdt = P._step_grids(shards, "dct", False, "none", 1.0)
    out = []
    for (layer, part), pts in sorted(fine.items()):
        if layer not in n_layers:
            continue
        s = shards[layer]
        mu, c, _band, _energy, sc = means[(layer, part)]
        for gi in (4, 8, 12):
            for off in (0.5, 0.75):
                make = P._part_maker(s, c, pts[gi][0], P._grid(s.shape[0], "dct"), mu, sc, off)
                out.append((layer, part, make))
    return out


def test_predicted_image_mse_tracks_measured_edits(setup):
    """Stated bound: over 36 quantised parts (3 layers x K/V x 3 steps x 2 offsets, image MSEs
    spanning orders of magnitude), the log10 of the predicted MSE correlates with the measured one
    at >= 0.95 and the median error is within 2.5 dB (measured: 0.99, ~0.5 dB)."""
    model, kv, calib, sens = setup
    probe = ShardDistortionProbe(model, kv, calib, steps=4, seed=0, reference_image=sens.reference_image)
    meas, pred = [], []
    for layer, part, make in _variants(kv):
        dec = make()
        lossless = kv.layers[layer]
        rep = LayerKV(dec, lossless.value) if part == "k" else LayerKV(lossless.key, dec)
        meas.append(probe.image_mse(layer, rep))
        pred.append(PredictedDistortion(sens, layer, lossless.key, lossless.value)(part, dec))
    lm, lp = np.log10(np.array(meas)), np.log10(np.array(pred))
    assert np.ptp(lm) > 1.5  # the check spans a real range
    assert np.corrcoef(lm, lp)[0, 1] >= 0.95
    assert abs(10 * np.median(lp - lm)) <= 2.5


def test_allocation_predictions_error_bound(setup, monkeypatch):
    """Stated bound for what the allocation uses (`coefficient_mse`: the sketch by heads, blended
    1/4 with its diagonal, 8 per-photo probes): over the 36 quantised parts, the dB error against
    one-part edits has a spread <= 2.25 dB and no part is predicted more than 5 dB below the
    median error (an optimistic outlier is what the allocation starves a part by). Measured: 1.75
    dB and -3.8 dB; the full sketch at the same blend 2.48 dB and -7.8 dB, asserted worse."""
    model, kv, calib, sens = setup
    probe = ShardDistortionProbe(model, kv, calib, steps=4, seed=0, reference_image=sens.reference_image)
    monkeypatch.setattr(KS, "DIAGONAL_BLEND", 0.25)
    meas, pred = [], {True: [], False: []}
    for layer, part, make in _variants(kv):
        lossless = kv.layers[layer]
        dec = make()
        meas.append(probe.image_mse(layer, LayerKV(dec, lossless.value) if part == "k" else LayerKV(lossless.key, dec)))
        d = PredictedDistortion(sens, layer, lossless.key, lossless.value)
        err, transform = make.coefficient_error()
        for heads in pred:
            monkeypatch.setattr(KS, "HEAD_BLOCKS", heads)
            pred[heads].append(d.coefficient_mse(part, err, transform))
    db = {h: 10 * np.log10(np.array(p)) - 10 * np.log10(np.array(meas)) for h, p in pred.items()}
    assert np.std(db[True]) <= 2.25
    assert np.min(db[True] - np.median(db[True])) >= -5.0
    assert np.std(db[True]) < np.std(db[False])


def test_reference_image_is_the_lossless_edit(setup):
    model, kv, calib, sens = setup
    want = model.edit(calib, template_kv=kv, steps=4, seed=0).image.double()
    assert torch.allclose(sens.reference_image, want, atol=1e-6)
    # per photo (the default): both photos' forwards (1 edit), 8 backward passes of one photo
    # each (1 edit each), the reference edit of both photos (1)
    assert sens.calibration_edits == 2 + 8 and sens.backward_edits == 8 and sens.probes == 8


class _LinearEdit:
    """A model whose edit is linear in the template KV, photo by photo (image_i = A_i kv, the
    noise drawn per batch as the real models do): its Gauss-Newton matrix is known exactly."""

    def __init__(self, tokens=6, width=4, pixels=12, photos=2, heads=1):
        g = torch.Generator().manual_seed(3)
        self.A = torch.randn(photos, pixels, 2 * tokens * heads * width, generator=g, dtype=torch.float64)
        self.A[1] *= 0.7  # the photos weigh differently
        self.shape = (tokens, heads, width)

    def differentiable_edit(self, photo, *, template_kv, steps, seed):
        from types import SimpleNamespace

        idx = photo[:, 0, 0, 0].long()  # which photo (its first pixel)
        x = torch.cat([template_kv.layers[0].key.reshape(-1), template_kv.layers[0].value.reshape(-1)]).double()
        noise = torch.randn(photo.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return SimpleNamespace(image=torch.stack([self.A[i] @ x + noise[j] for j, i in enumerate(idx)]))

    def edit(self, photo, **kw):
        with torch.no_grad():
            return self.differentiable_edit(photo, **kw)

    def exact_mse(self, e):  # (mean over every photo's pixels) ||A e||^2
        return float(sum((self.A[i] @ e).pow(2).sum() for i in range(self.A.shape[0])) / self.A[:, :, 0].numel())


def test_per_photo_probes_are_unbiased_with_less_variance_at_the_same_cost():
    """The estimator itself, on a linear model whose H is known: per photo and joint sketches are
    both unbiased for e^T H e; at equal backward compute (per photo 2P one-photo passes, joint P
    two-photo passes) the per-photo spread is lower (the joint probe's cross-photo term is noise)."""
    m = _LinearEdit()
    t, _h, w = m.shape
    key = torch.zeros(m.shape, dtype=torch.float16)
    kv = TemplateKV([LayerKV(key, key.clone())], "m", "t", None)
    photos = torch.arange(2, dtype=torch.float32).reshape(2, 1, 1, 1).expand(2, 3, 2, 2).contiguous()
    e = torch.randn(2 * t * w, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ek, ev = e[: t * w].reshape(m.shape), e[t * w:].reshape(m.shape)
    want = m.exact_mse(e)
    ests = {True: [], False: []}
    for seed in range(200):
        for per_photo, probes in ((True, 4), (False, 2)):  # 4 edits of backward compute either way
            s = measure_kv_sensitivity(m, kv, photos, probes=probes, probe_seed=seed, per_photo=per_photo)
            assert s.backward_edits == 4
            ests[per_photo].append(s.layer_mse(0, ek, ev))
    for per_photo, xs in ests.items():
        assert abs(np.mean(xs) - want) < 4 * np.std(xs) / np.sqrt(len(xs)), per_photo  # 4 standard errors
    assert np.std(ests[True]) < 0.85 * np.std(ests[False])
    big = measure_kv_sensitivity(m, kv, photos, probes=4000)
    assert big.layer_mse(0, ek, ev) == pytest.approx(want, rel=0.1)
    assert torch.equal(big.reference_image, m.edit(photos, template_kv=kv, steps=4, seed=0).image)


def test_head_blocks_are_unbiased_for_the_heads_own_terms_with_less_spread(monkeypatch):
    """The allocation's estimator (`HEAD_BLOCKS`) on a linear model with 4 heads: averaged over
    probe draws it equals the exact sum of each head's own quadratic form (the cross-head terms,
    zero in expectation for independent errors, left out), and its spread over draws is below the
    full sketch's (its noise averages over the heads)."""
    monkeypatch.setattr(KS, "DIAGONAL_BLEND", 0.0)
    m = _LinearEdit(tokens=4, width=3, pixels=40, heads=4)
    t, h, w = m.shape
    key = torch.zeros(m.shape, dtype=torch.float16)
    kv = TemplateKV([LayerKV(key, key.clone())], "m", "t", None)
    photos = torch.arange(2, dtype=torch.float32).reshape(2, 1, 1, 1).expand(2, 3, 2, 2).contiguous()
    ek = torch.randn(m.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ident = lambda x: x  # noqa: E731  # the coefficient domain = the token domain
    blocks = []  # each head's error alone, as a full-length KV error (keys, then zero values)
    for hh in range(h):
        one = torch.zeros_like(ek)
        one[:, hh] = ek[:, hh]
        blocks.append(torch.cat([one.reshape(-1), torch.zeros(t * h * w, dtype=torch.float64)]))
    want = sum(m.exact_mse(b) for b in blocks)
    full = m.exact_mse(torch.cat([ek.reshape(-1), torch.zeros(t * h * w, dtype=torch.float64)]))
    heads, fulls = [], []
    for seed in range(300):
        s = measure_kv_sensitivity(m, kv, photos, probes=8, probe_seed=seed)
        heads.append(s.coefficient_mse(0, "k", ident, ek.reshape(t, h * w).numpy()))
        fulls.append(s.part_mse(0, "k", ek.float()))
    assert abs(np.mean(heads) - want) < 4 * np.std(heads) / np.sqrt(len(heads))
    assert abs(np.mean(fulls) - full) < 4 * np.std(fulls) / np.sqrt(len(fulls))
    assert np.std(np.log(heads)) < 0.8 * np.std(np.log(fulls))


def test_coefficient_domain_equals_token_domain(setup):
    """The allocation predicts from the DCT coefficients' error (no inverse transform): the same
    number as from the decoded error in fp32 (the transform is orthonormal)."""
    _model, kv, _calib, sens = setup
    for layer, part, make in _variants(kv, n_layers=(1,))[:4]:
        err, transform = make.coefficient_error()
        x = (kv.layers[layer].key if part == "k" else kv.layers[layer].value)
        token_err = torch.from_numpy(P.EQ.inverse(err, transform.n)).reshape(x.shape)
        d = PredictedDistortion(sens, layer, kv.layers[layer].key, kv.layers[layer].value)
        full = float(np.sum(d.coefficient_projections(part, err, transform) ** 2))
        assert full == pytest.approx(sens.part_mse(layer, part, token_err), rel=1e-4)
        # the allocation's prediction: the sketch of each head's block (the same in either domain:
        # the transform mixes tokens within a channel), blended with the sketch's diagonal
        rows = sens.coefficient_rows(layer, part, transform)
        diag = float(((rows ** 2).sum(0) * err.reshape(-1) ** 2).sum())
        r = sens.rows[layer][0 if part == "k" else 1].double()
        heads = float((torch.einsum("pthd,thd->ph", r, token_err.double()) ** 2).sum())
        b = KS.DIAGONAL_BLEND
        assert d.coefficient_mse(part, err, transform) == pytest.approx(heads ** (1 - b) * diag ** b, rel=1e-6)


def test_joint_predictions_add_up(setup):
    """A layer's or the template's prediction sums the sketch projections before squaring: equal
    to the part's own when only one part is off; zero error, zero MSE."""
    _model, kv, _calib, sens = setup
    g = torch.Generator().manual_seed(1)
    e = torch.randn(kv.layers[3].key.shape, generator=g) * 0.05
    zero = torch.zeros_like(e)
    assert sens.layer_mse(3, e, zero) == pytest.approx(sens.part_mse(3, "k", e))
    errs = [(None, None)] * kv.num_layers
    errs[3] = (e, None)
    assert sens.template_mse(errs) == pytest.approx(sens.part_mse(3, "k", e))
    assert sens.template_mse([(None, None)] * kv.num_layers) == 0.0
    assert sens.token_importance().shape == (kv.num_layers, 2, kv.num_tokens)
    ks, vs = sens.relative_sensitivity(0, kv.layers[0].key, kv.layers[0].value)
    assert ks > 0 and vs > 0


def test_a_model_without_gradients_is_refused():
    with pytest.raises(TypeError, match="allocation='probes'"):
        measure_kv_sensitivity(object(), None, torch.zeros(1, 3, 8, 8))


def test_klein_differentiable_edit_equals_edit_and_sketches(tmp_path):
    """`KleinImageModel.differentiable_edit` (the adapter's no_grad lifted): the same images as
    `edit`, and the sketch reaches every layer's keys and values."""
    pytest.importorskip("diffusers")
    from sakura.models.flux.klein_random import write_random_klein_folder

    write_random_klein_folder(tmp_path / "k", "tiny", dtype=torch.float32)
    model = load_model(f"klein:{tmp_path / 'k'}@32", device="cpu", dtype="fp32")
    kv = model.extract_template_kv(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)), "a sun")
    kv = kv.to(torch.float16)
    photos = calibration_photos(32, 1)
    sens = measure_kv_sensitivity(model, kv, photos, steps=2, probes=2)
    assert torch.equal(sens.reference_image.float(), model.edit(photos, template_kv=kv, steps=2).image)
    assert all(float(r.abs().sum()) > 0 for pair in sens.rows for r in pair)
    assert not hasattr(model.adapter, "__dict__") or "edit" not in model.adapter.__dict__  # restored
