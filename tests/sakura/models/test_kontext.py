"""FLUX.1 Kontext through diffusers (`load_model("kontext:/folder@S")` -> `KontextImageModel`): a
complete tiny random Kontext pipeline written with save_pretrained, its template KV captured in the
sequence, computed alone layer by layer, and injected, bit for bit; with no template the forward is
stock diffusers'."""

import pytest
import torch

from sakura.models import ImageTemplateEditModel, KVMode, TemplateKVError, available_models, load_model
from sakura.models.flux.kontext import (KontextConfig, KontextImageModel, KVSlot, image_ids, kontext_forward,
                                   parse_kontext_arg)
from sakura.models.kv import KVSourceDefaults, LayerKV, TemplateKV

S = 16
PROMPT = "put the sun in the sky"


@pytest.fixture(scope="module")
def model(kontext_folder):
    torch.set_num_threads(1)
    return load_model(f"kontext:{kontext_folder}@{S}")


def px(n, seed):
    return torch.rand(n, 3, S, S, generator=torch.Generator().manual_seed(seed))


def test_registered_config_and_protocol(model):
    assert "kontext" in available_models()
    assert isinstance(model, KontextImageModel) and isinstance(model, ImageTemplateEditModel)
    assert model.cfg == KontextConfig(double_layers=1, single_layers=2, heads=2, head_dim=16, in_channels=16,
                                      joint_attention_dim=16, image_size=S, pixels_per_token=4, text_tokens=32)
    assert model.num_layers == 3 and model.cfg.tokens_per_image == 16
    d = model.describe()
    assert d["model"] == "flux1-kontext" and d["template_kv_values"] == 2 * 16 * 32 * 3
    assert parse_kontext_arg("/a/b@256") == ("/a/b", 256) and parse_kontext_arg("/a/b")[1] == 512


@pytest.mark.parametrize("refs", [1, 2])
def test_injected_template_kv_reproduces_the_in_sequence_edit_bit_for_bit(model, refs):
    """EXTRACT (template in the sequence at step 0, its captured K/V reused), NOCACHE (in the
    sequence every step) and INJECTED (K/V from the store's `extract_template_kv`, or the ones the
    extract pass captured) give the same bits: every operation on the template stream has the same
    shapes in all three (max abs diff 0.0, not a tolerance)."""
    tmpl, photos = px(refs, 1), px(2, 2)
    ext = model.edit(photos, template=tmpl, instruction=PROMPT, mode=KVMode.EXTRACT, steps=2)
    kv = model.extract_template_kv(tmpl, PROMPT)
    assert kv.num_tokens == refs * 16 and kv.layout["references"] == refs and kv.layout["instruction"] == PROMPT
    assert kv.positions[:, 0].unique().tolist() == [2 + r for r in range(refs)]
    for a, b in zip(kv.layers, ext.template_kv.layers):
        assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value)
    inj = model.edit(photos, template_kv=kv, steps=2)                # the prompt comes from the KV
    inj_captured = model.edit(photos, template_kv=ext.template_kv, steps=2)
    nocache = model.edit(photos, template=tmpl, instruction=PROMPT, mode="nocache", steps=2)
    assert inj.image.shape == (2, 3, S, S) and bool(((inj.image >= 0) & (inj.image <= 1)).all())
    for other in (inj, inj_captured, nocache):
        assert (other.image - ext.image).abs().max().item() == 0.0
    lazy = list(model.template_layers(tmpl, PROMPT))
    assert len(lazy) == model.num_layers and torch.equal(lazy[-1][1][0], kv.layers[-1].value)
    # the template, the prompt and the photo each change the image
    flipped = model.edit(photos, template=tmpl.flip(-1), instruction=PROMPT, steps=2).image
    prompt2 = model.edit(photos, template_kv=kv, instruction="another prompt", steps=2).image
    assert (flipped - ext.image).abs().max() > 1e-4 and (prompt2 - ext.image).abs().max() > 1e-4
    assert (ext.image[0] - ext.image[1]).abs().max() > 1e-4


def test_fp16_kv_and_keep_masks(model):
    tmpl, photo = px(1, 3), px(1, 4)
    kv = model.extract_template_kv(tmpl, PROMPT)
    half = kv.to(torch.float16)
    a = model.edit(photo, template_kv=half, steps=2).image
    assert 0 < (a - model.edit(photo, template_kv=kv, steps=2).image).abs().max() < 1e-2  # fp16 rounding only
    keep = torch.ones(kv.num_tokens, dtype=torch.bool)
    keep[::2] = False
    dropped = TemplateKV([LayerKV(l.key, l.value, keep) for l in kv.layers], kv.model_fingerprint,
                         kv.template_fingerprint, kv.layout, kv.positions)
    assert (model.edit(photo, template_kv=dropped, steps=2).image - model.edit(photo, template_kv=kv, steps=2).image
            ).abs().max() > 1e-5


class _CountingSource(KVSourceDefaults):
    """Records the order layers are asked for (a streaming source blocks in `layer(i)`)."""

    def __init__(self, kv):
        self.kv, self.asked = kv, []
        self.model_fingerprint, self.template_fingerprint = kv.model_fingerprint, kv.template_fingerprint
        self.instruction = kv.instruction

    @property
    def num_layers(self):
        return self.kv.num_layers

    def layer(self, i):
        self.asked.append(i)
        return self.kv.layer(i)


def test_injection_is_lazy_and_reads_each_layer_once(model):
    kv = model.extract_template_kv(px(1, 5), PROMPT)
    src = _CountingSource(kv)          # no positions: the token count comes from each layer
    out = model.edit(px(2, 6), template_kv=src, steps=3).image
    assert src.asked == [0, 1, 2] and torch.equal(out, model.edit(px(2, 6), template_kv=kv, steps=3).image)


def test_probe_sees_the_template_keys(model):
    kv = model.extract_template_kv(px(1, 7), PROMPT)
    seen = {}
    model.edit(px(1, 8), template_kv=kv, steps=2, probe=lambda i, p: seen.setdefault(i, p.shape))
    # (B, heads, text 32 + target 16 + photo 16 queries, 16 template keys) in every layer
    assert seen == {i: (1, 2, 32 + 32, 16) for i in range(3)}


def test_no_template_forward_is_stock_diffusers(model):
    """The block loop is a copy of `FluxTransformer2DModel.forward`: with no template it gives the
    stock forward's output bit for bit (what `FluxKontextPipeline` runs each step)."""
    emb, pooled, tids = model.encode_prompt("x")
    g = torch.Generator().manual_seed(9)
    main = torch.randn(1, 32, 16, generator=g)
    ids = torch.cat([image_ids(4, 0), image_ids(4, 1)])
    ts, gd = torch.tensor([0.7]), torch.tensor([2.5])
    with torch.no_grad():
        ours = kontext_forward(model.transformer, main=main, main_ids=ids, prompt_embeds=emb, txt_ids=tids,
                               template=None, tmpl_ids=None, pooled=pooled, timestep=ts, guidance=gd,
                               ref_timestep=0.0, slot=KVSlot())
        stock = model.transformer(hidden_states=main, timestep=ts, guidance=gd, pooled_projections=pooled,
                                  encoder_hidden_states=emb, txt_ids=tids, img_ids=ids, return_dict=False)[0]
    assert torch.equal(ours, stock)
    # and the adapter installed nothing on the shared transformer
    assert {type(p).__name__ for p in model.transformer.attn_processors.values()} == {"FluxAttnProcessor"}


def test_refuses_foreign_or_misplaced_kv_and_bad_inputs(model, kontext_folder):
    kv = model.extract_template_kv(px(1, 1), PROMPT)
    other = load_model(f"kontext:{kontext_folder}@{S}", guidance=3.5)
    with pytest.raises(TemplateKVError, match="made by model"):
        other.edit(px(1, 2), template_kv=kv, steps=1)
    bad = TemplateKV(kv.layers, kv.model_fingerprint, kv.template_fingerprint, kv.layout, image_ids(4, 1))
    with pytest.raises(TemplateKVError, match="photo's RoPE slot"):
        model.edit(px(1, 2), template_kv=bad, steps=1)
    with pytest.raises(ValueError, match="prompt text"):
        model.extract_template_kv(px(1, 0), 3)
    with pytest.raises(ValueError, match="expected"):
        model.edit(torch.rand(1, 3, 8, 8), template=px(1, 0), instruction="p")
    with pytest.raises(ValueError, match="at most"):
        model.extract_template_kv(px(5, 0), "p")
    with pytest.raises(ValueError, match="multiple of 4"):
        KontextImageModel(model.pipeline, 18)
    with pytest.raises(ValueError, match="needs a local folder"):
        load_model("kontext")
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        load_model("kontext:/nonexistent/folder@16")


def test_without_a_template_the_sampler_is_stock_flux_kontext_pipeline(model):
    """The adapter's own encode, noise, schedule, sampling loop and decode, with no template in the
    sequence, are `FluxKontextPipeline.__call__`'s: the same image bit for bit."""
    photo = px(1, 11)
    mine, pairs = model._sample(model.encode_image(photo), model.encode_prompt(PROMPT), steps=3, seed=5)
    assert pairs is None
    stock = model.pipeline(image=photo, prompt=PROMPT, height=S, width=S, max_area=S * S, _auto_resize=False,
                           num_inference_steps=3, guidance_scale=model.guidance, max_sequence_length=32,
                           generator=torch.Generator().manual_seed(5), output_type="pt").images
    assert stock.shape == (1, 3, S, S) and torch.equal(model.decode(mine), stock)


def test_differentiable_edit_gives_the_same_image_with_a_gradient_into_the_template_kv(model):
    """The build's sensitivity sketch needs the edit's gradient in the template KV (its model-based
    allocation; without it a Kontext build falls back to the probes' ~90 calibration edits)."""
    kv = model.extract_template_kv(px(1, 1), PROMPT)
    key = kv.layers[1].key.clone().requires_grad_(True)
    leafy = TemplateKV([LayerKV(key, l.value) if i == 1 else l for i, l in enumerate(kv.layers)],
                       kv.model_fingerprint, kv.template_fingerprint, kv.layout, positions=kv.positions)
    photo = px(1, 2)
    out = model.differentiable_edit(photo, template_kv=leafy, steps=2, seed=3).image
    (grad,) = torch.autograd.grad(out.sum(), [key])
    assert float(grad.abs().sum()) > 0.0
    plain = model.edit(photo, template_kv=leafy, steps=2, seed=3).image
    assert not plain.requires_grad and torch.equal(plain, out.detach())
    assert "decode" not in model.__dict__  # the lifted method is gone again
