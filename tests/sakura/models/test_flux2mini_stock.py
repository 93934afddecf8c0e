"""flux2-mini with stock multi-reference attention (`photo_reference=True`): the photo is reference
slot 1 and, without isolation, the template's K/V depend on it (what stock FLUX.2 Klein does);
with isolation the in-sequence edit equals the edit from the cached (photo-independent) KV."""

import torch

from sakura.models.flux2mini import Flux2MiniDiT
from sakura.models.flux.klein import ForwardSlot
from sakura.cloud.training.loop import Recipe, new_state, train_step

def _captured(model: Flux2MiniDiT, template, photo, images):
    n = model.cfg.tokens_per_image
    slot = ForwardSlot(num_template_tokens=n)
    with torch.no_grad():
        model.velocity_in_sequence(template, 1, photo, images(1, 9), torch.full((1,), 0.5), slot=slot)
    return slot.captured


def test_stock_template_kv_depends_on_the_photo_and_isolation_removes_it(make_tiny_flux2, tiny_images):
    images = tiny_images
    m = make_tiny_flux2(photo_reference=True, isolate_template=False)
    tmpl, p1, p2 = images(1, 1), images(1, 2), images(1, 3)
    a, b = _captured(m, tmpl, p1, images), _captured(m, tmpl, p2, images)
    assert max(float((ka - kb).abs().max()) for (ka, _), (kb, _) in zip(a, b)) > 1e-3   # layer 0 aside, they differ
    m.isolate_template = True
    a, b = _captured(m, tmpl, p1, images), _captured(m, tmpl, p2, images)
    assert all(torch.equal(ka, kb) and torch.equal(va, vb) for (ka, va), (kb, vb) in zip(a, b))
    # and the isolated in-sequence KV is the one the template alone gives (what a store caches)
    alone = m.template_stream(tmpl, 1)
    assert all(torch.allclose(ka, k, atol=1e-6) for (ka, _), (k, _) in zip(a, alone))


def test_stock_model_isolated_edit_matches_the_cached_kv_edit_and_differs_from_stock(make_tiny_flux2, tiny_images):
    images = tiny_images
    m = make_tiny_flux2(photo_reference=True, isolate_template=False)
    tmpl, photo = images(1, 4), images(2, 5)
    kv = m.extract_template_kv(tmpl, 2)
    cached = m.edit(photo, template_kv=kv, steps=3).image
    stock = m.edit(photo, template=tmpl, instruction=2, mode="nocache", steps=3).image
    m.isolate_template = True
    isolated = m.edit(photo, template=tmpl, instruction=2, mode="nocache", steps=3).image
    assert torch.allclose(isolated, cached, atol=1e-5)
    assert (stock - cached).abs().max() > 1e-3
    m.isolate_template = False


def test_fingerprints_of_default_models_are_unchanged_by_the_new_fields(make_tiny_flux2):
    a = make_tiny_flux2()
    b = make_tiny_flux2(photo_reference=True, isolate_template=False)
    from dataclasses import asdict

    from sakura.models.kv import fingerprint_model

    assert a.fingerprint() != b.fingerprint()   # same weights, other attention: another model
    old = {k: v for k, v in asdict(a.cfg).items() if k not in ("photo_reference", "isolate_template")}
    assert a.fingerprint() == fingerprint_model(a, {"model": "flux2-mini", **old})  # stores built before stay valid


def test_stock_recipe_trains():
    r = Recipe(model="flux2-mini", image_size=16, patch_size=4, dim=32, depth=3, heads=2, double_layers=1, steps=2,
               batch_size=2, stock_references=True)
    st = new_state(r)
    assert st.model.cfg.photo_reference and not st.model.cfg.isolate_template
    row = train_step(r, st)
    assert row[1] > 0 and Recipe.from_dict({k: v for k, v in r.__dict__.items() if k != "stock_references"}) \
        .stock_references is False


def test_isolation_finetune_starts_from_the_given_weights(tmp_path):
    from sakura.cloud.training.loop import save_checkpoint

    base = Recipe(model="flux2-mini", image_size=16, patch_size=4, dim=32, depth=3, heads=2, double_layers=1, steps=2,
                  batch_size=2, stock_references=True)
    st = new_state(base)
    train_step(base, st)
    save_checkpoint(base, st, tmp_path)
    ft = Recipe(**{**base.__dict__, "isolate_template": True, "init_from": str(tmp_path), "seed": 5})
    st2 = new_state(ft)
    assert st2.model.cfg.isolate_template and st2.model.isolate_template
    assert all(torch.equal(a, b) for a, b in zip(st.model.state_dict().values(), st2.model.state_dict().values()))
