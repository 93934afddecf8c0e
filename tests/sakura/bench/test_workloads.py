"""Workload cost model: SPEC's closed forms, the cited configs, and what the ceilings must obey."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sakura.bench.workloads import (PHONES, WORKLOADS, break_even_bps, break_even_closed_form, ceilings,
                                    flux2_weights_per_token_layer, get_phone, get_workload, qwen3_weights,
                                    tokens_for, vae_flops, workload_costs)


def test_spec_example_ceilings_1_17x_and_1_67x():
    """SPEC: Klein-4B, 512^2, 4 steps, 1,024 template tokens, 1,536 live tokens, no photo reference,
    no fixed costs, no attention -> 1 + N_t/(S N_live) = 1.17 and 1 + N_t/N_live = 1.67."""
    w = dataclasses.replace(get_workload("klein4b-512"), photo_tokens=0)
    assert (w.template_tokens, w.live_tokens, w.passes) == (1024, 1536, 4)
    c = ceilings(workload_costs(w, get_phone("~11"), attention=False, fixed=False))
    assert math.isclose(c["vs on-device"], 1 + 1024 / (4 * 1536), rel_tol=1e-12)
    assert math.isclose(c["vs on-device-nocache"], 1 + 1024 / 1536, rel_tol=1e-12)
    assert round(c["vs on-device"], 2) == 1.17 and round(c["vs on-device-nocache"], 2) == 1.67


def test_spec_break_even_17_5_b_mbit_per_tflop():
    """SPEC's W* for Klein-4B with P_l = 4e9 / 25 and a = 0.1 is ~17.5 x b Mbit/s per TFLOP/s."""
    for b in (1.0, 2.0, 4.5):
        w_star = break_even_closed_form(3072, b, 1e12, 4e9 / 25, 0.1)
        assert math.isclose(w_star / 1e6, 17.45 * b, rel_tol=1e-3)


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.name)
@pytest.mark.parametrize("bits", [1.0, 2.5, 16.0])
def test_break_even_matches_closed_form_with_this_workloads_attention(w, bits):
    """break_even_bps (fetch one layer vs compute it, from the costs) equals d b F / (P (1 + a)) with
    a = attention / linear FLOPs of the template = 2 N_t d / P, and without attention a = 0."""
    ph = get_phone("~3")
    a = 2 * w.template_tokens * w.hidden / w.weights_per_token_layer
    expect = break_even_closed_form(w.hidden, bits, ph.effective_flops, w.weights_per_token_layer, a)
    assert math.isclose(break_even_bps(w, ph, bits), expect, rel_tol=1e-9)
    expect0 = break_even_closed_form(w.hidden, bits, ph.effective_flops, w.weights_per_token_layer, 0.0)
    assert math.isclose(break_even_bps(w, ph, bits, attention=False), expect0, rel_tol=1e-9)


def test_klein4b_break_even_per_tflop_from_the_architecture():
    """From the Klein-4B config a token touches 13 d^2 = 1.23e8 weights per block (not 4e9/25 = 1.6e8,
    which counts both streams of the double blocks): W* ~ 24 b Mbit/s per TFLOP/s at 1,024 tokens."""
    w = get_workload("klein4b-512")
    assert w.weights_per_token_layer == 13 * 3072 ** 2
    one_tflop = dataclasses.replace(PHONES[0], effective_flops=1e12)
    assert 23.0e6 < break_even_bps(w, one_tflop, 1.0) < 24.5e6


def test_cited_configs_give_the_published_sizes():
    # Klein-4B: 5 double blocks (two weight sets) + 20 single blocks of 13 d^2 -> 3.7e9 in the blocks (~4B model)
    blocks_4b = (5 * 2 + 20) * flux2_weights_per_token_layer(3072)
    assert 3.5e9 < blocks_4b < 4.0e9
    blocks_9b = (8 * 2 + 24) * flux2_weights_per_token_layer(4096)
    assert 8.0e9 < blocks_9b < 9.5e9
    # Qwen3 non-embedding weights: model cards say 3.6B (4B) and 6.95B (8B)
    assert math.isclose(qwen3_weights(2560, 9728, 36), 3.6e9, rel_tol=0.02)
    assert math.isclose(qwen3_weights(4096, 12288, 36), 6.95e9, rel_tol=0.01)
    assert tokens_for(512) == 1024 and tokens_for(1024) == 4096
    # KV of one Klein-4B template at 512^2: 25 layers x 2 x 1,024 x 3,072 x 2 B = 315 MB (SPEC)
    assert round(get_workload("klein4b-512").kv_fp16_bytes_per_layer * 25 / 1e6) == 315
    assert vae_flops(1024, decode=True) > 4 * vae_flops(512, decode=True) * 0.99


def test_phone_levels_are_about_1_3_and_11_tflops():
    got = [p.effective_flops / 1e12 for p in PHONES]
    assert 0.8 < got[0] < 1.2 and 2.5 < got[1] < 4.0 and 10.0 < got[2] < 12.0
    assert get_phone(11.0) is PHONES[2] and get_phone(1) is PHONES[0]
    with pytest.raises(KeyError):
        get_phone("nope")


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.name)
def test_method_latencies_are_ordered_and_fixed_costs_shrink_ceilings(w):
    for ph in PHONES:
        c = workload_costs(w, ph)
        assert c.oracle_s < c.on_device_s < c.on_device_nocache_s
        bare = ceilings(workload_costs(w, ph, fixed=False))
        full = ceilings(c)
        # fixed costs are paid by every method, so including them can only shrink the ratios
        assert full["vs on-device"] < bare["vs on-device"]
        assert full["vs on-device-nocache"] < bare["vs on-device-nocache"]
    # a compute-bound phone scales every piece alike: ceilings do not depend on the phone level
    cs = [ceilings(workload_costs(w, ph)) for ph in PHONES]
    assert all(math.isclose(c["vs on-device"], cs[0]["vs on-device"], rel_tol=1e-9) for c in cs)


def test_template_heavy_and_base_workloads_allow_more_than_the_4_step_512_edit():
    ph = get_phone("~11")
    c512 = ceilings(workload_costs(get_workload("klein4b-512"), ph))
    style = ceilings(workload_costs(get_workload("style3x1024-out512"), ph))
    base = ceilings(workload_costs(get_workload("klein4b-base-1024"), ph))
    assert c512["vs on-device"] < 1.2
    assert style["vs on-device"] > 2.0 and style["vs on-device-nocache"] > 5.0
    # the base model: template once is negligible beside 100 passes, recomputing it every pass is not
    assert base["vs on-device"] < 1.05 and base["vs on-device-nocache"] > 2.5


def test_every_workload_cites_its_sources():
    for w in WORKLOADS:
        assert {"klein-configs", "flux2-vae", "tokens"} <= set(w.sources) and all(w.sources.values())
    for p in PHONES:
        assert len(p.source) > 40
    with pytest.raises(KeyError):
        get_workload("nope")


def test_docs_workloads_md_is_the_generated_report():
    """docs/workloads.md is written by `sakura bench workloads`; a stale copy fails here."""
    from pathlib import Path

    from sakura.bench.workloads import report_markdown

    doc = Path(__file__).resolve().parents[3] / "docs" / "workloads.md"
    assert doc.read_text() == report_markdown(), "regenerate with `sakura bench workloads`"


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: w.name)
def test_streaming_bound_spans_on_device_to_oracle_and_is_the_minimum_over_splits(w):
    from sakura.bench.workloads import streaming_bound_s

    c = workload_costs(w, get_phone("~3"))
    assert math.isclose(streaming_bound_s(c, 1e18, 2.0), c.oracle_s, rel_tol=1e-9)   # free KV: the ceiling
    assert math.isclose(streaming_bound_s(c, 1.0, 2.0), c.on_device_s, rel_tol=1e-6)  # no link: on-device
    rates = [5e6, 20e6, 50e6, 100e6, 300e6, 1e9]
    lat = [streaming_bound_s(c, r, 2.0, decode_fp16_bytes_per_s=200e6, rtt_s=0.05) for r in rates]
    assert all(a >= b - 1e-12 for a, b in zip(lat, lat[1:]))                           # faster link, never slower
    assert all(c.oracle_s <= x <= c.on_device_s for x in lat)
    # the closed-form split is the minimum of the max over a fine grid of splits
    W, bits, D, rtt = 80e6, 2.0, 150e6, 0.04
    per_layer = max(c.kv_fp16_bytes_per_layer * bits / 2 / W, c.kv_fp16_bytes_per_layer / D)
    after = (c.passes - 1) * c.layers * c.live_layer_s + c.vae_decode_s
    grid = min(max(c.on_device_s - f * c.template_s, rtt + f * c.layers * per_layer + after, c.oracle_s)
               for f in (i / 10000 for i in range(10001)))
    assert math.isclose(streaming_bound_s(c, W, bits, decode_fp16_bytes_per_s=D, rtt_s=rtt), grid, rel_tol=1e-3)
