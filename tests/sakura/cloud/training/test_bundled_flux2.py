"""The bundled flux2-mini weights: loaded by default, small, the same data contract as sakura-mini,
and their edits follow the template. Skipped only when the weights file is absent."""

import pytest
import torch

from sakura.models import FLUX2_MINI_WEIGHTS, load_model
from sakura.cloud.tasks import TASK_NAMES, get_task, heldout_photos, library_templates
from sakura.cloud.tasks.quality import edit_with_template, psnr_per_image

pytestmark = pytest.mark.skipif(not FLUX2_MINI_WEIGHTS.is_file(), reason="no bundled flux2-mini weights")


@pytest.fixture(scope="module")
def model():
    return load_model("flux2-mini")


def test_bundled_weights_are_loaded_by_default_and_small(model):
    from sakura.models.flux2mini import Flux2MiniDiT, load_flux2_mini_weights

    assert FLUX2_MINI_WEIGHTS.stat().st_size <= 25 * 1024 * 1024
    assert isinstance(model, Flux2MiniDiT)
    assert model.fingerprint() == load_flux2_mini_weights(FLUX2_MINI_WEIGHTS).fingerprint()
    assert model.cfg.image_size == 64 and model.cfg.tokens_per_image == 64  # as sakura-mini


def test_bundled_edits_follow_the_template(model):
    """One crop per held-out photo, two held-out templates per task: each output is closer to its
    own template's ground truth than to the other's (the model reads the template)."""
    photos = heldout_photos(model.cfg.image_size, 1)
    for name in TASK_NAMES:
        task = get_task(name)
        a, b = library_templates(model.cfg.image_size, task=name, held_out=True)[:2]
        out_a = edit_with_template(model, photos, a.image, a.instruction, steps=4, seed=0)
        out_b = edit_with_template(model, photos, b.image, b.instruction, steps=4, seed=0)
        gt_a = task.ground_truth(photos, a.image[None])
        assert float(psnr_per_image(out_a, gt_a).mean()) > float(psnr_per_image(out_b, gt_a).mean()) + 3.0, name
        assert float(psnr_per_image(out_a, gt_a).mean()) > float(psnr_per_image(photos, gt_a).mean()) + 3.0, name


def test_exactness_on_the_trained_model(model, tmp_path):
    """On the trained weights: lossless KV injected (after a round trip through disk) gives the same
    image as the template computed in the sequence (max abs diff 0.0), and both equal diffusers' own
    extract/cached loop with its stock KV processors. (Streamed: test_flux2mini_pipeline.py.)"""
    from sakura.models import TemplateKV

    from ...models.test_flux2mini import diffusers_loop

    tpl = library_templates(model.cfg.image_size, task="sticker", held_out=True)[0]
    template, photo = tpl.image[None], heldout_photos(model.cfg.image_size, 1)[:1]
    ext = model.edit(photo, template=template, instruction=tpl.instruction, mode="extract", steps=3, seed=1)
    noc = model.edit(photo, template=template, instruction=tpl.instruction, mode="nocache", steps=3, seed=1).image
    kv = TemplateKV.load(model.extract_template_kv(template, tpl.instruction).save(tmp_path / "t.kv"),
                         model_fingerprint=model.fingerprint())
    inj = model.edit(photo, template_kv=kv, steps=3, seed=1).image
    assert float((inj - ext.image).abs().max()) == 0.0 and torch.equal(inj, noc)
    noise = torch.randn(photo.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(inj, diffusers_loop(model, template, tpl.instruction, photo, 3, noise))
