"""The real-folder path of FLUX.2 Klein: a complete tiny Klein KV pipeline (transformer, VAE,
Qwen3 text encoder and tokenizer, scheduler; all built in code, random weights) written with
`save_pretrained`, loaded by `load_model("klein:/folder")` exactly as a user's download would be,
then pixels -> template KV -> injected edit -> pixels. Also: the Klein adapter pulls injected
layer i only when its forward pass reaches layer i."""

import pytest
import torch

from sakura.models import KVMode, TemplateKV, load_model

torch_grid = 4  # latent grid side: 16 px / VAE factor 2 / 2x2 patchify


def test_load_model_from_a_saved_klein_folder_extracts_and_injects(klein_folder, tmp_path):
    adapter = load_model(f"klein:{klein_folder}").adapter
    assert adapter.describe()["double_layers"] == 1 and adapter.num_layers == 3
    g = torch.Generator().manual_seed(0)
    template_px, photo_px = torch.rand(1, 3, 16, 16, generator=g), torch.rand(1, 3, 16, 16, generator=g)
    template = adapter.encode_image(template_px, slot=0)
    photo = adapter.encode_image(photo_px, slot=1)
    assert template.latents.shape == (1, torch_grid * torch_grid, 16)
    prompt = adapter.encode_prompt("add the sticker")
    assert prompt.shape == (1, adapter.max_sequence_length, 48)
    assert not torch.equal(prompt, adapter.encode_prompt("grade it like the reference"))

    kv = adapter.extract_template_kv(template)
    kv = TemplateKV.load(kv.save(tmp_path / "t.kv"), model_fingerprint=adapter.fingerprint())
    ext = adapter.edit(photo, template=template, mode=KVMode.EXTRACT, prompt_embeds=prompt, steps=2, seed=1)
    inj = adapter.edit(photo, template_kv=kv, prompt_embeds=prompt, steps=2, seed=1)
    assert torch.allclose(ext.latents, inj.latents, atol=1e-5)
    image = adapter.decode(inj.latents, (torch_grid, torch_grid))
    assert image.shape == (1, 3, 16, 16) and bool(((image >= 0) & (image <= 1)).all())
    other = adapter.edit(photo, template=adapter.encode_image(photo_px.flip(-1), slot=0), prompt_embeds=prompt,
                         steps=2, seed=1)
    assert (other.latents - ext.latents).abs().max() > 1e-4  # the template matters

    # a second load of the same folder has the same fingerprint (a store keyed by it stays valid)
    assert load_model(f"klein:{klein_folder}").adapter.fingerprint() == adapter.fingerprint()


@pytest.mark.parametrize("with_photo", [False, True])
def test_klein_injection_pulls_each_layer_when_its_block_runs(klein_folder, with_photo, recording_source):
    adapter = load_model(f"klein:{klein_folder}").adapter
    tr = adapter.transformer
    g = torch.Generator().manual_seed(0)
    template = adapter.encode_image(torch.rand(1, 3, 16, 16, generator=g), slot=0)
    photo = adapter.encode_image(torch.rand(1, 3, 16, 16, generator=g), slot=1) if with_photo else None
    prompt = torch.randn(1, 6, 48, generator=g)
    kv = adapter.extract_template_kv(template)
    log = []
    blocks = list(tr.transformer_blocks) + list(tr.single_transformer_blocks)
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: log.append(("block", i))) for i, b in enumerate(blocks)]
    try:
        out = adapter.edit(photo, template_kv=recording_source(kv, log), prompt_embeds=prompt, steps=2)
    finally:
        for h in hooks:
            h.remove()
    n = adapter.num_layers
    assert [e for e in log if e[0] == "layer"] == [("layer", i) for i in range(n)]
    assert log[:2 * n] == [x for i in range(n) for x in (("block", i), ("layer", i))]
    assert torch.equal(out.latents, adapter.edit(photo, template_kv=kv, prompt_embeds=prompt, steps=2).latents)
