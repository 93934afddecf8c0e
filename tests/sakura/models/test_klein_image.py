"""FLUX.2 Klein at the image level (`load_model("klein:/folder@S")` -> `KleinImageModel`): pixels in,
pixels out, the same calls as the bundled models; templates of one or more reference images."""

import pytest
import torch

from sakura.models import KVMode, load_model
from sakura.models.flux.klein_image import KleinConfig, KleinImageModel, parse_klein_name

S = 16


@pytest.fixture(scope="module")
def model(klein_folder):
    return load_model(f"klein:{klein_folder}@{S}")


def px(n, seed):
    return torch.rand(n, 3, S, S, generator=torch.Generator().manual_seed(seed))


def test_config_and_name(model):
    assert isinstance(model, KleinImageModel) and model.cfg.image_size == S and model.cfg.grid == 4
    assert model.cfg == KleinConfig(double_layers=1, single_layers=2, heads=2, head_dim=16, in_channels=16,
                                    joint_attention_dim=48, image_size=S, pixels_per_token=4,
                                    text_tokens=model.adapter.max_sequence_length)
    assert parse_klein_name("/a/b@256") == ("/a/b", 256) and parse_klein_name("/a/b")[1] == 512
    with pytest.raises(ValueError, match="multiple of 4"):
        KleinImageModel(model.adapter, 18)


@pytest.mark.parametrize("refs", [1, 2])
def test_modes_agree_and_prompt_and_references_matter(model, refs):
    tmpl, photos = px(refs, 1), px(2, 2)
    kv = model.extract_template_kv(tmpl, "a prompt")
    assert kv.num_tokens == refs * model.cfg.tokens_per_image and kv.layout["references"] == refs
    assert kv.layout["instruction"] == "a prompt" and kv.positions[:, 0].unique().tolist() == [10 * (r + 1) for r in range(refs)]
    ext = model.edit(photos, template=tmpl, instruction="a prompt", mode=KVMode.EXTRACT, steps=2)
    inj = model.edit(photos, template_kv=kv, steps=2)                 # the prompt comes from the KV
    assert ext.image.shape == (2, 3, S, S) and bool(((inj.image >= 0) & (inj.image <= 1)).all())
    assert torch.allclose(ext.image, inj.image, atol=1e-5)
    assert ext.template_kv is not None and torch.allclose(ext.template_kv.layers[-1].key, kv.layers[-1].key, atol=1e-6)
    other = model.edit(photos, template_kv=kv, instruction="another prompt", steps=2).image
    assert (other - inj.image).abs().max() > 1e-5
    assert model.template_fingerprint(tmpl, "a prompt") != model.template_fingerprint(tmpl, "another prompt")
    lazy = list(model.template_layers(tmpl, "a prompt"))
    assert len(lazy) == model.num_layers and torch.equal(lazy[0][0][0], kv.layers[0].key)


def test_bad_inputs(model):
    with pytest.raises(ValueError, match="prompt text"):
        model.extract_template_kv(px(1, 0), 3)
    with pytest.raises(ValueError, match="expected"):
        model.edit(torch.rand(1, 3, 8, 8), template=px(1, 0), instruction="p")
    with pytest.raises(ValueError, match="at most"):
        model.extract_template_kv(px(5, 0), "p")


def test_phone_workloads_take_their_shapes_from_the_klein_config():
    from sakura.bench.workloads import get_workload
    from sakura.models.flux.klein_config import KLEIN_4B, KLEIN_9B

    w4, w9 = get_workload("klein4b-512"), get_workload("klein9b-1024")
    assert (w4.layers, w4.hidden, w4.text_tokens) == (KLEIN_4B.depth, KLEIN_4B.hidden, KLEIN_4B.text_tokens)
    assert (w9.layers, w9.hidden) == (KLEIN_9B.depth, KLEIN_9B.hidden)
    assert w4.template_tokens == KLEIN_4B.tokens_for(512) == 1024
