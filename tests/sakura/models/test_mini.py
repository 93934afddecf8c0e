"""sakura-mini: injected template KV reproduces in-sequence computation exactly, and the tests
could fail: perturbing the KV changes the output, the KV does not depend on the photo."""

import pytest
import torch

from sakura.cloud.capture import template_importance
from sakura.models import KVMode, LayerKV, TemplateKV, TemplateKVError


def _imgs(n, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g)


def test_injected_equals_extract_equals_nocache_bit_exact(tiny_mini):
    tmpl, photo = _imgs(1, seed=1), _imgs(2, seed=2)
    ext = tiny_mini.edit(photo, template=tmpl, mode=KVMode.EXTRACT, steps=4, seed=7)
    inj = tiny_mini.edit(photo, template_kv=ext.template_kv, steps=4, seed=7)
    noc = tiny_mini.edit(photo, template=tmpl, mode="nocache", steps=4, seed=7)
    assert torch.equal(ext.image, inj.image)
    assert torch.equal(ext.image, noc.image)
    # and the KV made on its own equals the one captured during the edit
    alone = tiny_mini.extract_template_kv(tmpl)
    for a, b in zip(alone.layers, ext.template_kv.layers):
        assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value)


def test_perturbing_injected_kv_changes_output(tiny_mini):
    tmpl, photo = _imgs(1, seed=1), _imgs(1, seed=2)
    kv = tiny_mini.extract_template_kv(tmpl)
    base = tiny_mini.edit(photo, template_kv=kv, steps=3).image
    layers = list(kv.layers)
    layers[1] = LayerKV(layers[1].key + 0.05 * torch.randn_like(layers[1].key), layers[1].value)
    bumped = TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint, kv.layout)
    out = tiny_mini.edit(photo, template_kv=bumped, steps=3).image
    assert (out - base).abs().max() > 1e-4
    # dropping half the template tokens (masked out of attention) also changes it
    keep = torch.ones(kv.num_tokens, dtype=torch.bool)
    keep[::2] = False
    masked = TemplateKV([LayerKV(l.key, l.value, keep) for l in kv.layers], kv.model_fingerprint,
                        kv.template_fingerprint, kv.layout)
    assert (tiny_mini.edit(photo, template_kv=masked, steps=3).image - base).abs().max() > 1e-4


def test_masked_tokens_do_not_matter(tiny_mini):
    """A dropped (keep=False) token's K/V must have no influence: garbage there changes nothing."""
    tmpl, photo = _imgs(1, seed=1), _imgs(1, seed=2)
    kv = tiny_mini.extract_template_kv(tmpl)
    keep = torch.ones(kv.num_tokens, dtype=torch.bool)
    keep[:5] = False
    a_layers, b_layers = [], []
    for l in kv.layers:
        k2, v2 = l.key.clone(), l.value.clone()
        k2[:5] = 3.0
        v2[:5] = -2.0
        a_layers.append(LayerKV(l.key, l.value, keep))
        b_layers.append(LayerKV(k2, v2, keep))
    mk = lambda ls: TemplateKV(ls, kv.model_fingerprint, kv.template_fingerprint, kv.layout)
    a = tiny_mini.edit(photo, template_kv=mk(a_layers), steps=2).image
    b = tiny_mini.edit(photo, template_kv=mk(b_layers), steps=2).image
    assert torch.allclose(a, b, atol=1e-6)


def test_template_kv_independent_of_photo(tiny_mini):
    tmpl = _imgs(1, seed=1)
    a = tiny_mini.edit(_imgs(1, seed=3), template=tmpl, steps=2).template_kv
    b = tiny_mini.edit(_imgs(1, seed=4), template=tmpl, steps=2).template_kv
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.key, lb.key) and torch.equal(la.value, lb.value)
    # ...but it does depend on the template
    c = tiny_mini.extract_template_kv(_imgs(1, seed=5))
    assert not torch.equal(a.layers[0].key, c.layers[0].key)
    assert a.template_fingerprint != c.template_fingerprint
    # ...and on its fixed instruction
    d = tiny_mini.extract_template_kv(tmpl, instruction=2)
    assert not torch.equal(a.layers[0].key, d.layers[0].key)
    assert a.template_fingerprint != d.template_fingerprint


def test_output_depends_on_template(tiny_mini):
    photo = _imgs(1, seed=2)
    a = tiny_mini.edit(photo, template=_imgs(1, seed=1), steps=3).image
    b = tiny_mini.edit(photo, template=_imgs(1, seed=9), steps=3).image
    assert (a - b).abs().mean() > 1e-3


def test_wrong_model_kv_rejected(tiny_mini, mini_factory):
    other = mini_factory(seed=1)
    kv = other.extract_template_kv(_imgs(1))
    with pytest.raises(TemplateKVError, match="model"):
        tiny_mini.edit(_imgs(1), template_kv=kv, steps=1)


def test_wrong_shape_kv_rejected(tiny_mini):
    kv = tiny_mini.extract_template_kv(_imgs(1))
    cut = TemplateKV([LayerKV(l.key[:-1], l.value[:-1]) for l in kv.layers], kv.model_fingerprint,
                     kv.template_fingerprint, kv.layout)
    with pytest.raises(TemplateKVError, match="tokens"):
        tiny_mini.edit(_imgs(1), template_kv=cut, steps=1)
    short = TemplateKV(kv.layers[:-1], kv.model_fingerprint, kv.template_fingerprint, kv.layout)
    with pytest.raises(TemplateKVError, match="layers"):
        tiny_mini.edit(_imgs(1), template_kv=short, steps=1)


def test_nan_kv_rejected(tiny_mini):
    kv = tiny_mini.extract_template_kv(_imgs(1))
    bad_v = kv.layers[2].value.clone()
    bad_v[0, 0, 0] = float("nan")
    layers = list(kv.layers)
    layers[2] = LayerKV(layers[2].key, bad_v)
    with pytest.raises(TemplateKVError, match="NaN"):
        tiny_mini.edit(_imgs(1), template_kv=TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint),
                       steps=1)


@pytest.mark.parametrize("bad, match", [
    (torch.rand(1, 3, 8, 8), "shape"),
    (torch.rand(1, 4, 16, 16), "shape"),
    (torch.full((1, 3, 16, 16), float("inf")), "NaN or inf"),
])
def test_bad_images_rejected(tiny_mini, bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_mini.edit(bad, template=_imgs(1), steps=1)
    with pytest.raises(ValueError, match=match):
        tiny_mini.extract_template_kv(bad)


def test_bad_modes_rejected(tiny_mini):
    with pytest.raises(ValueError, match="mode must be one of"):
        tiny_mini.edit(_imgs(1), template=_imgs(1), mode="cahced")
    with pytest.raises(ValueError, match="needs template_kv"):
        tiny_mini.edit(_imgs(1), template=_imgs(1), mode="injected")
    with pytest.raises(ValueError, match="needs the template"):
        tiny_mini.edit(_imgs(1), mode="extract")
    with pytest.raises(ValueError, match="instruction"):
        tiny_mini.edit(_imgs(1), template=_imgs(1), instruction=99)
    with pytest.raises(ValueError, match="steps"):
        tiny_mini.edit(_imgs(1), template=_imgs(1), steps=0)


def test_importance_is_attention_mass(tiny_mini):
    kv = tiny_mini.extract_template_kv(_imgs(1))
    imp = template_importance(tiny_mini, kv, _imgs(2, seed=5), steps=2)
    assert imp.shape == (tiny_mini.num_layers, kv.num_tokens)
    assert bool((imp >= 0).all())
    share = imp.sum(dim=1)
    assert bool(((share > 0) & (share <= 1 + 1e-5)).all())
    # not uniform: in every layer some token receives clearly more than the average
    assert float((imp.max(dim=1).values / imp.mean(dim=1)).min()) > 1.1


def test_probe_does_not_change_the_output(tiny_mini):
    kv = tiny_mini.extract_template_kv(_imgs(1))
    photo = _imgs(1, seed=5)
    plain = tiny_mini.edit(photo, template_kv=kv, steps=2).image
    probed = tiny_mini.edit(photo, template_kv=kv, steps=2, probe=lambda layer, p: None).image
    assert torch.allclose(plain, probed, atol=1e-5)


def test_differentiable_edit_keeps_the_graph_and_edit_does_not(tiny_mini):
    from sakura.cloud.capture import token_sensitivity
    from sakura.models.base import DifferentiableEditModel

    assert isinstance(tiny_mini, DifferentiableEditModel)
    tmpl, photo = _imgs(1, seed=1), _imgs(1, seed=2)
    kv = tiny_mini.extract_template_kv(tmpl)
    key = kv.layers[1].key.clone().requires_grad_(True)
    leafy = TemplateKV([LayerKV(key, l.value) if i == 1 else l for i, l in enumerate(kv.layers)],
                       kv.model_fingerprint, kv.template_fingerprint, kv.layout)
    out = tiny_mini.differentiable_edit(photo, template_kv=leafy, steps=2, seed=3).image
    (grad,) = torch.autograd.grad(out.sum(), [key])
    assert float(grad.abs().sum()) > 0.0
    plain = tiny_mini.edit(photo, template_kv=leafy, steps=2, seed=3).image
    assert not plain.requires_grad and torch.equal(plain, out.detach())
    sens = token_sensitivity(tiny_mini, kv, photo, steps=2, probes=2)
    assert sens.shape == (tiny_mini.num_layers, 2, kv.num_tokens) and float(sens.min()) >= 0 and float(sens.max()) > 0
    with pytest.raises(TypeError, match="differentiable_edit"):
        token_sensitivity(object(), kv, photo)


def test_kv_source_protocol_declares_what_models_read(tiny_mini):
    from sakura.models import KVSourceDefaults, TemplateKVSource

    kv = tiny_mini.extract_template_kv(_imgs(1, seed=1), 2)
    assert kv.instruction == 2 and kv.positions is None and isinstance(kv, TemplateKVSource)

    class Bare(KVSourceDefaults):
        model_fingerprint, template_fingerprint, num_layers = kv.model_fingerprint, kv.template_fingerprint, kv.num_layers

        def layer(self, i):
            return kv.layer(i)

    src = Bare()
    assert isinstance(src, TemplateKVSource) and src.instruction is None and dict(src.layout) == {}
    out = tiny_mini.edit(_imgs(1, seed=2), template_kv=src, steps=2)
    assert torch.equal(out.image, tiny_mini.edit(_imgs(1, seed=2), template_kv=kv, steps=2).image)


def test_edit_replacing_one_layer_equals_the_whole_edit_bit_for_bit(tiny_mini):
    """The build's probes resume at the replaced layer (`first_step_prefix`): the first step's
    blocks below it are not run, and the images are those of `edit`, to the last bit; also with
    a keep mask (another attention kernel in that layer only) and on the first and last layer."""
    photo, tmpl = _imgs(2, seed=11), _imgs(1, seed=12)
    kv = tiny_mini.extract_template_kv(tmpl).to(torch.float16)
    prefix = tiny_mini.first_step_prefix(photo, kv, steps=3, seed=5)
    g = torch.Generator().manual_seed(0)
    for layer in range(tiny_mini.num_layers):
        l = kv.layers[layer]
        keep = torch.ones(l.key.shape[0], dtype=torch.bool)
        keep[::4] = False
        for rep in (LayerKV((l.key.float() + 0.2 * torch.randn(l.key.shape, generator=g)).half(), l.value),
                    LayerKV(l.key, l.value, keep)):
            layers = [rep if i == layer else x for i, x in enumerate(kv.layers)]
            whole = tiny_mini.edit(photo, template_kv=TemplateKV(layers, kv.model_fingerprint,
                                                                 kv.template_fingerprint, kv.layout),
                                   steps=3, seed=5).image
            assert torch.equal(tiny_mini.edit_replacing(prefix, layer, rep), whole)
    with pytest.raises(IndexError):
        tiny_mini.edit_replacing(prefix, tiny_mini.num_layers, kv.layers[0])


def test_rope_as_swapped_products_equals_the_pairwise_rotation():
    from sakura.models.mini import apply_rope, rope_2d, rope_tables

    cos, sin = rope_2d(4, 16, 100.0)
    x = torch.randn(2, 16, 3, 16, generator=torch.Generator().manual_seed(1))
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    pairwise = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    assert torch.equal(apply_rope(x, *rope_tables(cos, sin)), pairwise)


def test_last_block_rows_compute_as_in_the_whole_block(tiny_mini):
    """`main_forward(rows_from=n)`: the last block skips the photo rows past attention; the rows
    it returns are those of the whole block, bit for bit."""
    block, n, c = tiny_mini.blocks[-1], tiny_mini.cfg.tokens_per_image, tiny_mini.cfg.dim
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 2 * n, c, generator=g)
    temb = torch.randn(2, c, generator=g)
    kt = torch.randn(2, n, tiny_mini.cfg.heads, tiny_mini.cfg.head_dim, generator=g)
    vt = torch.randn(kt.shape, generator=g)
    rope = tiny_mini._rope()
    rope = (torch.cat([rope[0], rope[0]]), torch.cat([rope[1], rope[1]]))
    with torch.no_grad():
        whole = block.main_forward(x, temb, rope, kt, vt, None, None)
        rows = block.main_forward(x, temb, rope, kt, vt, None, None, rows_from=n)
    assert rows.shape == (2, n, c) and torch.equal(rows, whole[:, n:])
