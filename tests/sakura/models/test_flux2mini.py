"""flux2-mini (diffusers' Flux2Transformer2DModel behind sakura-mini's image API) on a tiny random
config: the KV modes are bit-identical, equal diffusers' own extract/cached loop with its stock KV
processors, and injection pulls layer i only when the forward pass reaches layer i."""

import copy

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2KVAttnProcessor, Flux2KVParallelSelfAttnProcessor

from sakura.models import ImageTemplateEditModel, KVMode, LayerKV, TemplateKV, TemplateKVError, load_model
from sakura.models.flux2mini import Flux2MiniDiT, save_flux2_mini_weights
from sakura.models.mini import patchify

S = 16  # the tiny model's pixels per side (tests/conftest.py)


@pytest.fixture(scope="module")
def tiny(make_tiny_flux2):
    return make_tiny_flux2()


def images(n, seed):
    return torch.rand(n, 3, S, S, generator=torch.Generator().manual_seed(seed))


def block_log(transformer, log):
    """Forward pre-hooks that log each block's start, in consumption (layer) order."""
    blocks = list(transformer.transformer_blocks) + list(transformer.single_transformer_blocks)
    return [b.register_forward_pre_hook(lambda mod, args, i=i: log.append(("block", i))) for i, b in enumerate(blocks)]


def diffusers_loop(model: Flux2MiniDiT, template, instruction, photo, steps, noise):
    """The edit as diffusers' KV pipeline runs it: stock Flux2KV processors, the template as the
    reference in "extract" mode at step 0, "cached" mode afterwards; our sampler and output head."""
    tr = copy.deepcopy(model.transformer)
    tr.set_attn_processor({n: (Flux2KVParallelSelfAttnProcessor() if n.startswith("single") else Flux2KVAttnProcessor())
                           for n in tr.attn_processors})
    cfg, p = model.cfg, model.cfg.patch_size
    prompt = model.prompts[torch.tensor([instruction])]
    x = noise
    ts = torch.linspace(1.0, 0.0, steps + 1)
    cache = None
    with torch.no_grad():
        for s in range(steps):
            t = ts[s].expand(1)
            main = torch.cat([patchify(photo, p), patchify(x, p)], 1)
            if s == 0:
                out, cache = tr(hidden_states=torch.cat([patchify(template, p), main], 1), encoder_hidden_states=prompt,
                                timestep=t, img_ids=torch.cat([model.ids_template, model.ids_main]),
                                txt_ids=model.ids_text, guidance=None, return_dict=False, kv_cache_mode="extract",
                                num_ref_tokens=cfg.tokens_per_image)
            else:
                out = tr(hidden_states=main, encoder_hidden_states=prompt, timestep=t, img_ids=model.ids_main,
                         txt_ids=model.ids_text, guidance=None, return_dict=False, kv_cache=cache,
                         kv_cache_mode="cached")[0]
            v = model._to_velocity(out[:, -cfg.tokens_per_image:], photo, x, t)
            x = x + (ts[s + 1] - ts[s]) * v
    return x.clamp(0, 1)


def test_modes_bit_identical_and_equal_to_diffusers_kv_loop(tiny, tmp_path):
    template, photos = images(1, 1), images(2, 2)
    kv = tiny.extract_template_kv(template, 2)
    loaded = TemplateKV.load(kv.save(tmp_path / "t.kv"), model_fingerprint=tiny.fingerprint())
    ext = tiny.edit(photos, template=template, instruction=2, mode="extract", steps=3, seed=5)
    noc = tiny.edit(photos, template=template, instruction=2, mode="nocache", steps=3, seed=5).image
    inj = tiny.edit(photos, template_kv=loaded, steps=3, seed=5).image
    assert torch.equal(ext.image, noc) and torch.equal(ext.image, inj)
    assert float((ext.image - inj).abs().max()) == 0.0
    for a, b in zip(ext.template_kv.layers, kv.layers):  # KV captured in the sequence == extracted
        assert torch.equal(a.key, b.key) and torch.equal(a.value, b.value)
    noise = torch.randn(photos.shape, generator=torch.Generator().manual_seed(5))  # edit()'s draw
    for j in range(2):  # edit() runs one photo at a time with its slice of the batch's noise
        want = diffusers_loop(tiny, template, 2, photos[j:j + 1], 3, noise[j:j + 1])
        assert torch.equal(inj[j:j + 1], want)
    assert isinstance(tiny, ImageTemplateEditModel)


def test_template_kv_depends_on_template_only(tiny):
    template = images(1, 1)
    a = tiny.edit(images(1, 3), template=template, instruction=1, mode="extract", steps=1).template_kv
    b = tiny.edit(images(1, 4), template=template, instruction=3, mode="extract", steps=2, seed=9).template_kv
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.key, lb.key) and torch.equal(la.value, lb.value)
    c = tiny.extract_template_kv(images(1, 5), 1)
    assert not torch.equal(c.layers[-1].key, a.layers[-1].key)
    # the instruction is the prompt: it changes the edit, not the template KV
    photo = images(1, 3)
    assert (tiny.edit(photo, template_kv=a, instruction=1, steps=2).image
            - tiny.edit(photo, template_kv=a, instruction=3, steps=2).image).abs().max() > 1e-4


def test_template_layers_is_lazy_and_matches_extract(tiny):
    log = []
    hooks = block_log(tiny.transformer, log)
    try:
        gen = tiny.template_layers(images(1, 1), 0)
        with torch.no_grad():
            k0, v0 = next(gen)
            assert log == [("block", 0)]
            rest = list(gen)
    finally:
        for h in hooks:
            h.remove()
    assert [b for _, b in log] == list(range(tiny.num_layers))
    kv = tiny.extract_template_kv(images(1, 1), 0)
    assert torch.equal(k0[0], kv.layers[0].key) and torch.equal(rest[-1][1][0], kv.layers[-1].value)


def test_injection_pulls_each_layer_when_its_block_runs(tiny, recording_source):
    kv = tiny.extract_template_kv(images(1, 1), 2)
    log = []
    hooks = block_log(tiny.transformer, log)
    try:
        tiny.edit(images(2, 2), template_kv=recording_source(kv, log), steps=2)
    finally:
        for h in hooks:
            h.remove()
    n = tiny.num_layers
    requests = [e for e in log if e[0] == "layer"]
    assert requests == [("layer", i) for i in range(n)]  # each layer once, in order, then resident
    first_step = log[:2 * n]
    assert first_step == [x for i in range(n) for x in (("block", i), ("layer", i))]


def test_keep_mask_and_perturbation_change_the_output(tiny):
    kv = tiny.extract_template_kv(images(1, 1), 1)
    photo = images(1, 2)
    base = tiny.edit(photo, template_kv=kv, steps=2).image
    keep = torch.ones(kv.num_tokens, dtype=torch.bool)
    keep[::2] = False
    masked = TemplateKV([LayerKV(l.key, l.value, keep) for l in kv.layers], kv.model_fingerprint,
                        kv.template_fingerprint, layout=kv.layout, positions=kv.positions)
    out_m = tiny.edit(photo, template_kv=masked, steps=2).image
    assert (out_m - base).abs().max() > 1e-4
    junk = TemplateKV([LayerKV(torch.where(keep[:, None, None], l.key, 1e3), l.value, keep) for l in kv.layers],
                      kv.model_fingerprint, kv.template_fingerprint, layout=kv.layout, positions=kv.positions)
    assert torch.allclose(tiny.edit(photo, template_kv=junk, steps=2).image, out_m, atol=1e-6)


def test_bad_sources_and_inputs_rejected(tiny, make_tiny_flux2):
    kv = tiny.extract_template_kv(images(1, 1), 1)
    photo = images(1, 2)
    other = make_tiny_flux2(seed=1)
    with pytest.raises(TemplateKVError, match="model"):
        tiny.edit(photo, template_kv=other.extract_template_kv(images(1, 1), 1))
    short = TemplateKV(kv.layers[:-1], kv.model_fingerprint, kv.template_fingerprint, layout=kv.layout)
    with pytest.raises(TemplateKVError, match="layers"):
        tiny.edit(photo, template_kv=short)
    moved = TemplateKV(kv.layers, kv.model_fingerprint, kv.template_fingerprint, layout=kv.layout,
                       positions=kv.positions + 1)
    with pytest.raises(TemplateKVError, match="RoPE"):
        tiny.edit(photo, template_kv=moved)
    bare = TemplateKV(kv.layers, kv.model_fingerprint, kv.template_fingerprint)
    with pytest.raises(ValueError, match="instruction"):
        tiny.edit(photo, template_kv=bare)
    assert torch.equal(tiny.edit(photo, template_kv=bare, instruction=1, steps=1).image,
                       tiny.edit(photo, template_kv=kv, steps=1).image)
    ragged = TemplateKV([LayerKV(l.key[:-1], l.value[:-1]) for l in kv.layers], kv.model_fingerprint,
                        kv.template_fingerprint, layout=kv.layout)
    with pytest.raises(TemplateKVError, match="tokens"):
        tiny.edit(photo, template_kv=ragged)
    with pytest.raises(ValueError, match="shape"):
        tiny.edit(torch.rand(1, 3, S + 1, S), template=images(1, 1))
    with pytest.raises(ValueError, match="instruction"):
        tiny.extract_template_kv(images(1, 1), 7)
    with pytest.raises(ValueError, match="mode"):
        tiny.edit(photo, template=images(1, 1), mode="cahced")


def test_weights_round_trip_and_registry(tmp_path, make_tiny_flux2):
    m = make_tiny_flux2(seed=2)
    path = save_flux2_mini_weights(m, tmp_path / "f.safetensors")
    loaded = load_model(f"flux2-mini:{path}")
    assert loaded.fingerprint() == m.fingerprint()
    photo, template = images(1, 2), images(1, 1)
    assert torch.equal(loaded.edit(photo, template=template, instruction=1, steps=2).image,
                       m.edit(photo, template=template, instruction=1, steps=2).image)
    assert loaded.describe()["model"] == "flux2-mini"


def test_runtime_profile_and_capture_probe_run_on_flux2(tiny):
    from sakura.cloud.capture import template_importance
    from sakura.phone.live import profile_model

    prof = profile_model(tiny, repeats=1)
    assert prof.compute_s > 0 and prof.local_s > 0
    kv = tiny.extract_template_kv(images(1, 1), 1)
    imp = template_importance(tiny, kv, images(2, 3), steps=2)
    assert imp.shape == (tiny.num_layers, kv.num_tokens)
    share = imp.sum(-1)
    assert bool((share > 0).all()) and bool((share <= 1 + 1e-5).all())
    # the probe sees the same attention the edit uses: the image is unchanged (up to SDPA rounding)
    photo = images(1, 3)
    probed = tiny.edit(photo, template_kv=kv, steps=2, probe=lambda i, p: None).image
    assert torch.allclose(probed, tiny.edit(photo, template_kv=kv, steps=2).image, atol=1e-5)


def test_streamed_source_with_local_prefix_is_bit_exact(tiny):
    """The runtime's LiveKVSource: layers 0-1 computed on the device, the rest 'arrive' fetched."""
    import threading
    import time

    from sakura.models.kv import LayerKV
    from sakura.phone import BandwidthEstimator, Route, RttEstimator, SakuraPolicy, ShardSpec
    from sakura.phone.driver import EditDriver
    from sakura.phone.live import LiveKVSource

    template, photo = images(1, 1), images(1, 2)
    kv = tiny.extract_template_kv(template, 3)
    route = Route("lossless", 1, 0.0, 0.0)
    policy = SakuraPolicy(k=2)  # the plan: layers below 2 on the device
    d = EditDriver([ShardSpec((route,), 0.001, 0.001)] * tiny.num_layers, policy,
                   bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.0))
    src = LiveKVSource(d, threading.Condition(), time.monotonic,
                       lambda: (LayerKV(k[0], v[0]) for k, v in tiny.template_layers(template, 3)),
                       tiny.fingerprint(), tiny.template_fingerprint(template, 3), instruction=3)
    for i in range(2, tiny.num_layers):
        d.routes[i] = route
        d.records[i].status, d.records[i].decode_end = "ready", 0.0
        src.decoded[i] = kv.layer(i)
    got = tiny.edit(photo, template_kv=src, steps=2).image
    assert [r.source for r in d.records] == ["local", "local"] + ["lossless"] * (tiny.num_layers - 2)
    assert torch.equal(got, tiny.edit(photo, template=template, instruction=3, steps=2).image)