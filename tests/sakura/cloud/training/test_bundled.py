"""The bundled sakura-mini weights: loaded by default, small, and their edits follow the template.

Real checks on the shipped model (skipped only when the weights file is absent)."""

import pytest
import torch

from sakura.models import MINI_WEIGHTS, load_mini
from sakura.cloud.tasks import TASK_NAMES, get_task, heldout_photos, library_templates
from sakura.cloud.tasks.quality import edit_with_template, psnr_per_image

pytestmark = pytest.mark.skipif(not MINI_WEIGHTS.is_file(), reason="no bundled sakura-mini weights")


@pytest.fixture(scope="module")
def model():
    return load_mini()


def test_bundled_weights_are_loaded_by_default_and_small(model):
    assert MINI_WEIGHTS.stat().st_size <= 25 * 1024 * 1024
    from sakura.models.mini_io import load_mini_weights

    ref = load_mini_weights(MINI_WEIGHTS)
    assert model.fingerprint() == ref.fingerprint()
    assert model.cfg.tokens_per_image * 3 == 192  # [template | photo | target], 64 tokens each


@pytest.mark.parametrize("task_name", TASK_NAMES)
def test_swapping_the_template_changes_the_output_by_a_large_margin(model, task_name):
    """Held-out photos and held-out templates: the output follows its own template, not another."""
    task = get_task(task_name)
    photos = heldout_photos(model.cfg.image_size, 1)                              # (3, 3, 64, 64)
    a, b = library_templates(model.cfg.image_size, task=task_name, held_out=True)[:2]
    out_a = edit_with_template(model, photos, a.image, a.instruction, steps=8, seed=0)
    out_b = edit_with_template(model, photos, b.image, b.instruction, steps=8, seed=0)
    gt_a, gt_b = task.ground_truth(photos, a.image[None]), task.ground_truth(photos, b.image[None])
    # the model's outputs differ about as much as the two ground truths do...
    assert (out_a - out_b).abs().mean() > 0.5 * (gt_a - gt_b).abs().mean()
    # ...and each is closer to its own template's ground truth than to the other's, by >= 3 dB
    assert float(psnr_per_image(out_a, gt_a).mean()) > float(psnr_per_image(out_b, gt_a).mean()) + 3.0
    assert float(psnr_per_image(out_b, gt_b).mean()) > float(psnr_per_image(out_a, gt_b).mean()) + 3.0


def test_bundled_model_beats_identity_on_heldout_data(model):
    """A quick slice of `sakura bench quality`: one crop per held-out photo, every held-out template."""
    photos = heldout_photos(model.cfg.image_size, 1)
    for name in TASK_NAMES:
        task = get_task(name)
        gains = []
        for t in library_templates(model.cfg.image_size, task=name, held_out=True):
            gt = task.ground_truth(photos, t.image[None])
            out = edit_with_template(model, photos, t.image, t.instruction, steps=8, seed=0)
            gains.append(psnr_per_image(out, gt) - psnr_per_image(photos, gt))
        assert float(torch.cat(gains).mean()) > 3.0, name
