"""FLUX.2 Klein adapter on tiny random configs built in code (no downloads).

The reference is diffusers' own KV path: stock `Flux2KVAttnProcessor`s, step 0 in "extract" mode
and later steps in "cached" mode, exactly as `Flux2KleinKVPipeline.__call__` runs them."""

import copy

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2KVAttnProcessor,
    Flux2KVParallelSelfAttnProcessor,
    Flux2Transformer2DModel,
)
from diffusers.pipelines.flux2.pipeline_flux2_klein_kv import compute_empirical_mu, retrieve_timesteps
from diffusers.schedulers import FlowMatchEulerDiscreteScheduler

from sakura.models import KVMode, LayerKV, TemplateKV, TemplateKVError
from sakura.models.flux.klein import KleinAdapter, KleinReference, latent_ids, measure_template_dependence, text_ids

C, JD, GRID = 8, 12, 4


def tiny_transformer(seed=0):
    torch.manual_seed(seed)
    return Flux2Transformer2DModel(patch_size=1, in_channels=C, num_layers=2, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=JD,
                                   timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
                                   guidance_embeds=False).eval()


def ref(seed, slot):
    g = torch.Generator().manual_seed(seed)
    return KleinReference.from_grid(torch.randn(1, GRID * GRID, C, generator=g), GRID, GRID, slot=slot)


def prompt(seed=3):
    return torch.randn(1, 5, JD, generator=torch.Generator().manual_seed(seed))


def diffusers_kv_loop(transformer, template, prompt_embeds, steps, seed):
    """What Flux2KleinKVPipeline does after encoding: extract at step 0, cached afterwards."""
    t = copy.deepcopy(transformer)
    t.set_attn_processor({n: (Flux2KVParallelSelfAttnProcessor() if n.startswith("single") else Flux2KVAttnProcessor())
                          for n in t.attn_processors})
    ids = latent_ids(GRID, GRID)
    latents = torch.randn(1, GRID * GRID, C, generator=torch.Generator().manual_seed(seed))
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift_terminal=None)
    timesteps, _ = retrieve_timesteps(sched, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps),
                                      mu=compute_empirical_mu(image_seq_len=GRID * GRID, num_steps=steps))
    sched.set_begin_index(0)
    cache = None
    with torch.no_grad():
        for i, tt in enumerate(timesteps):
            ts = tt.expand(1).to(latents.dtype) / 1000
            if i == 0:
                pred, cache = t(hidden_states=torch.cat([template.latents, latents], 1), timestep=ts, guidance=None,
                                encoder_hidden_states=prompt_embeds, txt_ids=text_ids(prompt_embeds.shape[1]),
                                img_ids=torch.cat([template.ids, ids]), return_dict=False, kv_cache_mode="extract",
                                num_ref_tokens=template.latents.shape[1])
            else:
                pred = t(hidden_states=latents, timestep=ts, guidance=None, encoder_hidden_states=prompt_embeds,
                         txt_ids=text_ids(prompt_embeds.shape[1]), img_ids=ids, return_dict=False, kv_cache=cache,
                         kv_cache_mode="cached")[0]
            latents = sched.step(pred, tt, latents, return_dict=False)[0]
    return latents


@pytest.fixture(scope="module")
def tiny():
    return tiny_transformer()


def test_extract_and_injected_reproduce_diffusers_exactly(tiny):
    adapter = KleinAdapter(copy.deepcopy(tiny))
    template, p = ref(1, slot=0), prompt()
    want = diffusers_kv_loop(tiny, template, p, steps=3, seed=5)
    ext = adapter.edit(template=template, mode="extract", prompt_embeds=p, steps=3, seed=5)
    kv = adapter.extract_template_kv(template)
    inj = adapter.edit(template_kv=kv, prompt_embeds=p, steps=3, seed=5)
    noc = adapter.edit(template=template, mode=KVMode.NOCACHE, prompt_embeds=p, steps=3, seed=5)
    assert float((ext.latents - want).abs().max()) == 0.0
    assert float((inj.latents - want).abs().max()) == 0.0
    assert torch.allclose(noc.latents, want, atol=1e-5)
    assert kv.num_layers == 4 and kv.layers[0].key.shape == (GRID * GRID, 2, 16)
    assert torch.equal(kv.positions, template.ids)


def test_template_kv_round_trips_through_disk(tiny, tmp_path):
    adapter = KleinAdapter(copy.deepcopy(tiny))
    template, p = ref(1, slot=0), prompt()
    kv = adapter.extract_template_kv(template)
    back = TemplateKV.load(kv.save(tmp_path / "klein.safetensors"), model_fingerprint=adapter.fingerprint())
    a = adapter.edit(template_kv=kv, prompt_embeds=p, steps=2).latents
    b = adapter.edit(template_kv=back, prompt_embeds=p, steps=2).latents
    assert torch.equal(a, b)


def test_perturbed_or_masked_kv_changes_output(tiny):
    adapter = KleinAdapter(copy.deepcopy(tiny))
    template, p = ref(1, slot=0), prompt()
    kv = adapter.extract_template_kv(template)
    base = adapter.edit(template_kv=kv, prompt_embeds=p, steps=2).latents
    layers = list(kv.layers)
    layers[3] = LayerKV(layers[3].key, layers[3].value + 0.1 * torch.randn_like(layers[3].value))
    bumped = TemplateKV(layers, kv.model_fingerprint, kv.template_fingerprint, kv.layout, kv.positions)
    assert (adapter.edit(template_kv=bumped, prompt_embeds=p, steps=2).latents - base).abs().max() > 1e-4
    keep = torch.ones(kv.num_tokens, dtype=torch.bool)
    keep[::3] = False
    masked = TemplateKV([LayerKV(l.key, l.value, keep) for l in kv.layers], kv.model_fingerprint,
                        kv.template_fingerprint, kv.layout, kv.positions)
    out_m = adapter.edit(template_kv=masked, prompt_embeds=p, steps=2).latents
    assert (out_m - base).abs().max() > 1e-4
    # garbage in the dropped tokens has no effect
    junk = TemplateKV([LayerKV(torch.where(keep[:, None, None], l.key, 9.0), torch.where(keep[:, None, None], l.value, -9.0),
                               keep) for l in kv.layers], kv.model_fingerprint, kv.template_fingerprint, kv.layout,
                      kv.positions)
    assert torch.allclose(adapter.edit(template_kv=junk, prompt_embeds=p, steps=2).latents, out_m, atol=1e-6)


def test_template_kv_depends_on_user_reference_only_under_diffusers_mask(tiny):
    dep = measure_template_dependence(copy.deepcopy(tiny), ref(1, slot=0), [ref(7, slot=1), ref(8, slot=1)])
    assert dep["isolated"] == 0.0
    assert dep["diffusers_mask"] > 1e-3  # the measured dependence the README documents


def test_isolated_extract_with_photo_equals_injected_with_photo(tiny):
    adapter = KleinAdapter(copy.deepcopy(tiny), isolate_template=True)
    template, photo, p = ref(1, slot=0), ref(7, slot=1), prompt()
    ext = adapter.edit(photo, template=template, mode="extract", prompt_embeds=p, steps=3, seed=2)
    inj = adapter.edit(photo, template_kv=adapter.extract_template_kv(template), prompt_embeds=p, steps=3, seed=2)
    assert torch.allclose(ext.latents, inj.latents, atol=1e-5)
    # the KV captured during the edit with a photo equals the KV made without one
    alone = adapter.extract_template_kv(template)
    for a, b in zip(alone.layers, ext.template_kv.layers):
        assert torch.allclose(a.key, b.key, atol=1e-6) and torch.allclose(a.value, b.value, atol=1e-6)
    # and the photo matters
    other = adapter.edit(ref(9, slot=1), template=template, mode="extract", prompt_embeds=p, steps=3, seed=2)
    assert (other.latents - ext.latents).abs().max() > 1e-4


def test_bad_inputs(tiny):
    adapter = KleinAdapter(copy.deepcopy(tiny))
    template, p = ref(1, slot=0), prompt()
    other = KleinAdapter(tiny_transformer(seed=1))
    with pytest.raises(TemplateKVError, match="model"):
        adapter.edit(template_kv=other.extract_template_kv(template), prompt_embeds=p)
    with pytest.raises(ValueError, match="prompt_embeds"):
        adapter.edit(template=template, prompt_embeds=torch.zeros(1, 5, JD + 1))
    with pytest.raises(ValueError, match="latents"):
        adapter.extract_template_kv(KleinReference(torch.zeros(1, 16, C + 1), latent_ids(4, 4)))
    with pytest.raises(ValueError, match="NaN"):
        adapter.extract_template_kv(KleinReference(torch.full((1, 16, C), float("nan")), latent_ids(4, 4)))
    with pytest.raises(ValueError, match="grid"):
        KleinReference.from_grid(torch.zeros(1, 15, C), 4, 4, slot=0)
    kv = adapter.extract_template_kv(template)
    ragged = TemplateKV([kv.layers[0]] + [LayerKV(l.key[:-2], l.value[:-2]) for l in kv.layers[1:]],
                        kv.model_fingerprint, kv.template_fingerprint)
    with pytest.raises(TemplateKVError, match="tokens"):
        adapter.edit(ref(2, slot=1), template_kv=ragged, prompt_embeds=p, grid=(4, 4))
    short = TemplateKV([LayerKV(l.key[:-2], l.value[:-2]) for l in kv.layers], kv.model_fingerprint,
                       kv.template_fingerprint, positions=kv.positions)
    with pytest.raises(TemplateKVError, match="positions"):
        adapter.edit(ref(2, slot=1), template_kv=short, prompt_embeds=p, grid=(4, 4))
    with pytest.raises(ValueError, match="mode"):
        adapter.edit(template=template, mode="cahced", prompt_embeds=p)


def test_template_layers_is_lazy_and_bit_identical_to_the_extract_forward(tiny):
    from sakura.models.flux.klein import ForwardSlot

    adapter = KleinAdapter(copy.deepcopy(tiny))
    template = ref(1, slot=0)
    log = []
    tr = adapter.transformer
    blocks = list(tr.transformer_blocks) + list(tr.single_transformer_blocks)
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: log.append(i)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            gen = adapter.template_layers(template)
            first = next(gen)
            assert log == [0]
            layers = [first] + list(gen)
    finally:
        for h in hooks:
            h.remove()
    assert log == list(range(adapter.num_layers))
    # diffusers' own extract forward with the same stand-ins captures the same K/V bit for bit
    c = tr.config
    slot = ForwardSlot(num_template_tokens=GRID * GRID)
    with torch.no_grad():
        adapter._forward(torch.cat([template.latents, torch.zeros(1, 1, C)], 1),
                         torch.cat([template.ids, latent_ids(1, 1)]), torch.zeros(1, 1, c.joint_attention_dim),
                         text_ids(1), torch.zeros(1), mode="extract", num_ref=GRID * GRID, slot=slot)
    for (k, v), (k2, v2) in zip(layers, slot.captured):
        assert torch.equal(k, k2) and torch.equal(v, v2)
