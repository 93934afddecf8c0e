"""The faster build: batched image probes (same values as one at a time, within matmul rounding),
one decode per rendition, the stage profile and the progress bar from the first second."""

import hashlib

import pytest
import torch

from sakura.cloud.builder.pipeline import MODEL_STAGES, STAGES, build_store
from sakura.cloud.capture import ShardDistortionProbe
from sakura.models.kv import LayerKV


def _kv(model):
    t = torch.rand(1, 3, model.cfg.image_size, model.cfg.image_size, generator=torch.Generator().manual_seed(3))
    return model.extract_template_kv(t, 1).to(torch.float16)


def _perturbed(kv, layer, seed):
    g = torch.Generator().manual_seed(seed)
    l = kv.layers[layer]
    return LayerKV((l.key.float() + 0.1 * torch.randn(l.key.shape, generator=g)).half(), l.value)


def test_edit_many_equals_one_edit_per_source_within_rounding(tiny_mini):
    kv = _kv(tiny_mini)
    photos = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    reqs = [(i % tiny_mini.num_layers, _perturbed(kv, i % tiny_mini.num_layers, i)) for i in range(5)]
    probe = ShardDistortionProbe(tiny_mini, kv, photos, steps=2)
    one = [probe.image_mse(l, r) for l, r in reqs]
    assert probe.image_mse_many(reqs, batch=1) == one          # batch 1: the same calls, bit for bit
    many = probe.image_mse_many(reqs, batch=4)                   # 4 + 1: a full and a partial batch
    assert all(m > 0 for m in one)
    assert many == pytest.approx(one, rel=1e-3, abs=1e-12)      # matmul rounding only (~1e-7 per pixel)
    assert probe.image_mse_many([(0, kv.layers[0])], batch=4)[0] < 1e-12  # lossless: the reference


def test_edit_many_refuses_keep_masks_and_probe_routes_them_alone(tiny_mini):
    kv = _kv(tiny_mini)
    photos = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    l = kv.layers[1]
    keep = torch.ones(l.key.shape[0], dtype=torch.bool)
    keep[::3] = False
    masked = LayerKV(l.key, l.value, keep)
    probe = ShardDistortionProbe(tiny_mini, kv, photos, steps=2)
    with pytest.raises(ValueError, match="keep mask"):
        tiny_mini.edit_many(photos, [probe.reference.__class__(
            [masked if i == 1 else x for i, x in enumerate(kv.layers)], kv.model_fingerprint,
            kv.template_fingerprint, kv.layout)], steps=2)
    got = probe.image_mse_many([(1, masked), (2, _perturbed(kv, 2, 0))], batch=2)
    assert got[0] == probe.image_mse(1, masked) and got[0] > 0


def _store_digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_batched_probes_build_the_same_ladder_and_report_stages(tmp_path, capsys):
    prof = {}
    build_store(tmp_path / "a", templates=["look-00"], calibration=1, steps=1, log=lambda s: None, device="cpu",
                probe_batch=1, profile=prof, progress=True, allocation="probes")
    err = capsys.readouterr().err
    assert "loading sakura-mini" in err and "look-00: ladder search" in err  # the bar names template and stage
    assert set(STAGES) <= set(prof["look-00"]) and all(v >= 0 for v in prof["look-00"].values())
    build_store(tmp_path / "b", templates=["look-00"], calibration=1, steps=1, log=lambda s: None, device="cpu",
                probe_batch=8, allocation="probes")
    from sakura.wire.store.manifest import manifest_tree  # version 2 manifests are compressed JSON

    ma = manifest_tree(next((tmp_path / "a" / "manifests").rglob("look-00.json")).read_bytes())
    mb = manifest_tree(next((tmp_path / "b" / "manifests").rglob("look-00.json")).read_bytes())
    # same renditions and the same quality-floor / image figures to 3 significant digits: a batch
    # only moves the recorded image MSE in its last digits (docs/scale.md)
    ra = [(r["name"], r["distortion"]["image_mse"]) for s in ma["shards"] for r in s["renditions"]]
    rb = [(r["name"], r["distortion"]["image_mse"]) for s in mb["shards"] for r in s["renditions"]]
    assert [n for n, _ in ra] == [n for n, _ in rb]
    assert [m for _, m in rb] == pytest.approx([m for _, m in ra], rel=1e-3)
    fa = [s["quality_floor"]["image_mse"] for s in ma["shards"]]
    fb = [s["quality_floor"]["image_mse"] for s in mb["shards"]]
    assert fb == pytest.approx(fa, rel=1e-3)


def test_probes_in_threads_give_the_same_values_in_order(tiny_mini):
    kv = _kv(tiny_mini)
    photos = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    reqs = [(i % tiny_mini.num_layers, _perturbed(kv, i % tiny_mini.num_layers, i)) for i in range(5)]
    probe = ShardDistortionProbe(tiny_mini, kv, photos, steps=2)
    one = probe.image_mse_many(reqs, batch=1)
    assert len(set(one)) == len(one)                              # distinct values: order is checked
    assert probe.image_mse_many(reqs, batch=1, workers=2) == one  # bit for bit: one intra-op thread each
    assert probe.image_mse_many(reqs, batch=1, workers=8) == one  # more workers than requests


def test_probe_threads_leave_the_store_unchanged(tmp_path):
    kw = dict(templates=["look-00"], calibration=1, steps=1, log=lambda s: None, device="cpu", allocation="probes")
    build_store(tmp_path / "a", probe_workers=1, **kw)
    build_store(tmp_path / "b", probe_workers=2, **kw)
    assert _store_digest(tmp_path / "a") == _store_digest(tmp_path / "b")


def test_build_rejects_bad_probe_settings(tmp_path):
    with pytest.raises(ValueError, match="probe_workers"):
        build_store(tmp_path, templates=["look-00"], probe_workers=0, log=lambda s: None, device="cpu")
    with pytest.raises(ValueError, match="allocation_photos"):
        build_store(tmp_path, templates=["look-00"], allocation_photos=0, log=lambda s: None, device="cpu")


def _linear_scan(cands, f, target):
    return next((b for b in cands if f(b) >= target), cands[-1])


@pytest.mark.parametrize("target", [20.0, 30.0, 37.9, 38.0, 41.0, 55.0, 80.0])
@pytest.mark.parametrize("curve", ["steep", "flat", "saturating"])
def test_budget_search_finds_what_a_cheapest_first_scan_finds(curve, target):
    """`search_budget` against trying every candidate cheapest first, on monotone PSNR curves of
    the shapes the templates show (steep at low rates, flatter above): the same budget, fewer trials."""
    import math

    from sakura.cloud.builder.pipeline import BASE_RUNG_BUDGETS, MAX_SINGLE_RUNG_BUDGETS, search_budget

    cands = list(BASE_RUNG_BUDGETS) + list(MAX_SINGLE_RUNG_BUDGETS)
    f = {"steep": lambda b: 30 + 35 * b, "flat": lambda b: 25 + 9 * b,
         "saturating": lambda b: 20 + 25 * math.log1p(3 * b)}[curve]
    calls = []
    b, p = search_budget(cands, lambda x: calls.append(x) or f(x), target)
    assert b == _linear_scan(cands, f, target) and p == f(b)
    assert len(calls) == len(set(calls)) <= 5 < len(cands)  # each budget tried at most once
    linear = cands.index(b) + 1 if f(b) >= target else len(cands)
    assert len(calls) <= max(linear, 4)


def test_budget_search_edges():
    from sakura.cloud.builder.pipeline import search_budget

    assert search_budget([0.5], lambda b: 1.0, 38.0) == (0.5, 1.0)          # one candidate, missed: it stands
    assert search_budget([0.5, 1.0], lambda b: 99.0, 38.0) == (0.5, 99.0)   # everything passes: the cheapest
    with pytest.raises(ValueError, match="no candidate"):
        search_budget([], lambda b: 0.0, 1.0)


def test_layer_sensitivity_in_threads_equals_one_thread(tiny_mini):
    from sakura.cloud.capture import layer_sensitivity
    from sakura.models.kv import TemplateKV

    kv = _kv(tiny_mini)
    photos = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))

    def edit(layers):
        t = TemplateKV([LayerKV(k, v) for k, v in layers], kv.model_fingerprint, kv.template_fingerprint, kv.layout)
        return tiny_mini.edit(photos, template_kv=t, steps=2).image

    pairs = [(l.key, l.value) for l in kv.layers]
    one = layer_sensitivity(pairs, edit, seed=3)
    assert layer_sensitivity(pairs, edit, seed=3, workers=2) == one and all(k > 0 and v > 0 for k, v in one)


@pytest.mark.parametrize("target", [20.0, 30.0, 38.0, 41.0, 55.0, 80.0])
@pytest.mark.parametrize("prior", ["exact", "2 dB low", "6 dB low", "4 dB high", "flat"])
def test_budget_search_with_a_prior_finds_the_same_budget(prior, target):
    """A prior (the proxy allocation's PSNR, one cheap edit a budget) only steers which budget is
    tried: the answer is a linear scan's for any prior, good or bad; a good one needs at most two
    trials (the answer and its cheaper neighbour's miss); each budget is tried, and the prior asked,
    at most once."""
    import math

    from sakura.cloud.builder.pipeline import (BASE_RUNG_BUDGETS, MAX_SINGLE_RUNG_BUDGETS, SEARCH_PRIOR_GAP_DB,
                                               search_budget)

    cands = list(BASE_RUNG_BUDGETS) + list(MAX_SINGLE_RUNG_BUDGETS)
    f = lambda b: 20 + 25 * math.log1p(3 * b)  # noqa: E731
    exact = lambda b: f(b) - SEARCH_PRIOR_GAP_DB  # noqa: E731  (what the search assumes before a trial)
    g = {"exact": exact, "2 dB low": lambda b: exact(b) - 2, "6 dB low": lambda b: exact(b) - 6,
         "4 dB high": lambda b: exact(b) + 4, "flat": lambda b: 30.0}[prior]
    calls, asked = [], []
    b, p = search_budget(cands, lambda x: calls.append(x) or f(x), target,
                         prior_at=lambda x: asked.append(x) or g(x))
    assert b == _linear_scan(cands, f, target) and p == f(b)
    assert len(calls) == len(set(calls)) <= len(cands) and len(asked) == len(set(asked)) <= len(cands)
    if prior == "exact":
        assert len(calls) <= 2


def test_shared_probe_memoises_and_measures_in_threads(tiny_mini):
    """The allocation's shared probe (`_many_probe`): parts handed over as decode callables are
    decoded and measured in the threads; the same bytes twice are measured once; the values are
    the probe's, in order, for any thread count."""
    from sakura.cloud.builder.pipeline import _many_probe, _Probing

    kv = _kv(tiny_mini)
    photos = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    parts = [(i % tiny_mini.num_layers, "kv"[i % 2], _perturbed(kv, i % tiny_mini.num_layers, i).key) for i in range(4)]
    want = []
    probe = ShardDistortionProbe(tiny_mini, kv, photos, steps=2)
    for layer, part, dec in parts:
        l = kv.layers[layer]
        want.append(probe.image_mse(layer, LayerKV(dec, l.value) if part == "k" else LayerKV(l.key, dec)))
    for workers in (1, 2):
        calls = []
        many = _many_probe(probe, kv, _Probing(1, workers))
        futs = [many.submit(layer, part, lambda d=dec: calls.append(1) or d) for layer, part, dec in parts + parts[:2]]
        assert [f.result() for f in futs] == want + want[:2] and len(calls) == 6
        assert many(parts) == want
    probe.close()


def test_template_processes_build_the_same_store_and_report_their_stages(tmp_path, capsys):
    """Templates in forked processes (the default on a multi-core CPU under Linux): the same
    bytes as one process, every template's stage profile back in the parent, and the bar moved by
    the processes' stage events."""
    import sys

    if sys.platform != "linux":
        pytest.skip("template processes fork: Linux only")
    kw = dict(templates=["look-00", "sticker-00"], calibration=1, steps=1, device="cpu")
    lines, prof = [], {}
    build_store(tmp_path / "a", template_workers=2, log=lines.append, profile=prof, progress=True, **kw)
    err = capsys.readouterr().err
    # the parent's bar names a template and stage (refreshed at most twice a second) and ends full
    assert any(f"{t}: {st}" in err for t in ("look-00", "sticker-00") for st in STAGES) and "20/20 stages" in err
    assert set(prof) == {"look-00", "sticker-00"} and all(set(MODEL_STAGES) <= set(p) for p in prof.values())
    assert sum(line.startswith(("look-00:", "sticker-00:")) for line in lines) == 2  # each summary line, once
    build_store(tmp_path / "b", template_workers=1, log=lambda s: None, **kw)
    assert _store_digest(tmp_path / "a") == _store_digest(tmp_path / "b")


def test_template_processes_refused_where_they_cannot_fork():
    import sys
    from types import SimpleNamespace

    from sakura.cloud.builder.pipeline import _template_processes

    cpu, cuda = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
    assert _template_processes(None, cuda, 5) == 1 and _template_processes(1, cuda, 5) == 1
    with pytest.raises(ValueError, match="accelerator builds one template at a time"):
        _template_processes(2, cuda, 5)
    with pytest.raises(ValueError, match=">= 1"):
        _template_processes(0, cpu, 5)
    if sys.platform == "linux":
        assert _template_processes(8, cpu, 3) == 3  # never more processes than templates
