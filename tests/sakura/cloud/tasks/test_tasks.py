"""Data, tasks and library: held-out split by source, exact ground truths, template dependence."""

import pytest
import torch

from sakura.models.mini import MiniConfig, patchify
from sakura.cloud.tasks import (HELDOUT_PHOTOS, TASK_NAMES, TASKS, TRAIN_PHOTOS, get_task, get_template, heldout_photos,
                          key_mask, library_templates, look_transfer, sample_batch, sticker_composite,
                          template_library, texture_blend)
from sakura.cloud.tasks.edits import HELDOUT_PATTERNS, TRAIN_PATTERNS
from sakura.cloud.tasks.photos import HELDOUT_TEXTURES, TRAIN_TEXTURES, PhotoSampler, load_source

S = 32


def test_split_is_by_source_and_disjoint():
    assert not set(TRAIN_PHOTOS) & set(HELDOUT_PHOTOS)
    assert not set(TRAIN_TEXTURES) & set(HELDOUT_TEXTURES)
    assert not set(TRAIN_PATTERNS) & set(HELDOUT_PATTERNS)
    # skimage's `cat` is the same photograph as the held-out `chelsea`: it must not be a training source
    assert "cat" not in TRAIN_PHOTOS
    # no training source is a pixel copy of a held-out one
    for a in TRAIN_PHOTOS:
        for b in HELDOUT_PHOTOS:
            x, y = load_source(a), load_source(b)
            assert x.shape != y.shape or not torch.allclose(x, y, atol=0.02)


def test_photo_crops_are_real_images_in_range():
    g = torch.Generator().manual_seed(0)
    for split in ("train", "heldout"):
        p = PhotoSampler(split, S).sample(g)
        assert p.shape == (3, S, S) and p.min() >= 0 and p.max() <= 1 and p.std() > 0.01
    h1, h2 = heldout_photos(S, 2), heldout_photos(S, 2)
    assert h1.shape == (len(HELDOUT_PHOTOS) * 2, 3, S, S) and torch.equal(h1, h2)


def test_look_transfer_matches_reference_statistics():
    g = torch.Generator().manual_seed(1)
    photo = 0.3 + 0.4 * torch.rand(2, 3, S, S, generator=g)       # mid-range: nothing clips
    ref = 0.45 + 0.1 * torch.rand(1, 3, S, S, generator=g)
    out = look_transfer(photo, ref)
    torch.testing.assert_close(out.mean(dim=(-2, -1)), ref.mean(dim=(-2, -1)).expand(2, 3), atol=1e-5, rtol=0)
    var = lambda x: x.var(dim=(-2, -1), unbiased=False)
    # std is matched with a small floor: sd = sqrt(var + 1e-4) for both images
    want = var(photo).sqrt() / (var(photo) + 1e-4).sqrt() * (var(ref) + 1e-4).sqrt()
    torch.testing.assert_close(var(out).sqrt(), want, atol=1e-5, rtol=1e-4)
    # and it is not the identity
    assert (out - photo).abs().mean() > 0.05


def test_texture_blend_is_exact_half_half():
    g = torch.Generator().manual_seed(2)
    a, b = torch.rand(2, 3, S, S, generator=g), torch.rand(2, 3, S, S, generator=g)
    assert torch.equal(texture_blend(a, b), 0.5 * a + 0.5 * b)


def test_sticker_copies_template_outside_key_and_keeps_photo_inside():
    g = torch.Generator().manual_seed(3)
    tmpl = TASKS["sticker"].make_template("train", S, g)[None]
    photo = torch.rand(1, 3, S, S, generator=g)
    out = sticker_composite(photo, tmpl)
    key = key_mask(tmpl).expand_as(out)
    assert 0 < key.float().mean() < 1                         # some sticker, some background
    assert torch.equal(out[key], photo[key])
    assert torch.equal(out[~key], tmpl[~key])
    region = get_task("sticker").region(tmpl)
    assert torch.equal(region, ~key_mask(tmpl))
    assert get_task("look").region(tmpl) is None


def test_sticker_content_never_hits_the_key_colour():
    g = torch.Generator().manual_seed(4)
    for _ in range(20):
        t = TASKS["sticker"].make_template("heldout", S, g)
        content = ~key_mask(t[None])[0, 0]
        assert content.any()
        g_chan = t[1][content]
        assert g_chan.max() < 254 / 255  # so an 8-bit round trip cannot turn content into key


@pytest.mark.parametrize("name", TASK_NAMES)
def test_output_depends_strongly_on_template(name):
    """Swapping the template changes the ground-truth edit by a large margin, for every task."""
    task = get_task(name)
    photos = heldout_photos(S, 2)
    t = library_templates(S, task=name, held_out=True)
    a = task.ground_truth(photos, t[0].image[None])
    b = task.ground_truth(photos, t[1].image[None])
    assert (a - b).abs().mean() > 0.03
    assert (a - photos).abs().mean() > 0.03   # and the edit is not the identity


def test_library_sizes_held_out_and_determinism():
    lib = template_library(S)
    names = [t.name for t in lib]
    assert len(set(names)) == len(names)
    for name, task in TASKS.items():
        ts = library_templates(S, task=name)
        assert len(ts) >= 8
        assert 1 <= sum(t.held_out for t in ts) < len(ts)
        assert all(t.instruction == task.instruction and t.image.shape == (3, S, S) for t in ts)
    template_library.cache_clear()
    again = template_library(S)
    assert all(torch.equal(x.image, y.image) for x, y in zip(lib, again))
    assert get_template("look-00", S).name == "look-00"
    with pytest.raises(ValueError):
        get_template("nope", S)
    with pytest.raises(ValueError):
        library_templates(S, task="nope")


def test_templates_are_template_heavy():
    """Template tokens (as the model's template KV holds them) >= photo tokens."""
    from sakura.models.mini import MiniDiT

    tiny_mini = MiniDiT(MiniConfig(image_size=16, patch_size=4, dim=32, depth=2, heads=2)).eval()
    size = tiny_mini.cfg.image_size
    for name in TASK_NAMES:
        t = library_templates(size, task=name)[0]
        kv = tiny_mini.extract_template_kv(t.image[None], t.instruction)
        photo_tokens = patchify(heldout_photos(size, 1)[:1], tiny_mini.cfg.patch_size).shape[1]
        assert kv.num_tokens >= photo_tokens


def test_recipe_defaults_are_the_model_defaults():
    from sakura.cloud.training import Recipe

    assert Recipe().model_config() == MiniConfig()


def test_instruction_ids_are_distinct_and_fit_the_model():
    ids = [t.instruction for t in TASKS.values()]
    assert len(set(ids)) == len(ids) and 0 not in ids and max(ids) < MiniConfig().instructions


def test_sample_batch_is_seeded_and_targets_are_ground_truth():
    a = sample_batch(6, S, torch.Generator().manual_seed(5))
    b = sample_batch(6, S, torch.Generator().manual_seed(5))
    assert torch.equal(a.template, b.template) and torch.equal(a.photo, b.photo)
    c = sample_batch(6, S, torch.Generator().manual_seed(6))
    assert not torch.equal(a.photo, c.photo)
    for i in range(6):
        task = TASKS[TASK_NAMES[int(a.task_index[i])]]
        assert int(a.instruction[i]) == task.instruction
        torch.testing.assert_close(a.target[i], task.ground_truth(a.photo[i:i + 1], a.template[i:i + 1])[0])


def test_sklearn_sample_images_are_read_without_importing_sklearn():
    """The build's photo sources read scikit-learn's bundled JPEGs from its data folder: the same
    pixels as `load_sample_image`, without the ~1 s import of scikit-learn (checked in a child)."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_sample_image

    from sakura.cloud.tasks.photos import _sklearn_sample_image

    for f in ("china.jpg", "flower.jpg"):
        assert np.array_equal(_sklearn_sample_image(f), load_sample_image(f))
    code = ("import sys; from sakura.cloud.tasks.photos import load_source; load_source('sklearn:china.jpg'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-500:]
    import pytest

    with pytest.raises(ValueError, match="no sample image"):
        _sklearn_sample_image("nope.jpg")
