"""`sakura bench templates`: the profile once per template, renditions measured on that template's real KV."""

import json

import pytest

from sakura.bench.templates import floor_bits, run_templates
from sakura.emulation import traces_root


def test_floor_bits_picks_the_cheapest_rendition_under_the_floor():
    ladder = {"floor_image_mse": 1e-4, "renditions": {
        "lossless": {"bits_per_value": 16.0, "image_mse": 0.0},
        "progressive#0": {"bits_per_value": 0.5, "image_mse": 3e-4},    # over the floor
        "progressive#1": {"bits_per_value": 0.9, "image_mse": 0.8e-4},
        "progressive#2": {"bits_per_value": 1.4, "image_mse": 0.2e-4},
        "cachegen:level=3": {"bits_per_value": 2.0, "image_mse": 1e-4}}}
    f = floor_bits(ladder)
    assert f["sakura_bits_per_value_at_floor"] == 0.9 and f["cachegen_L3_bits_per_value"] == 2.0
    ladder["renditions"]["progressive#1"]["image_mse"] = 2e-4
    ladder["renditions"]["progressive#2"]["image_mse"] = 2e-4
    assert floor_bits(ladder)["sakura_bits_per_value_at_floor"] is None


@pytest.mark.skipif(traces_root() is None, reason="SAKURA_TRACES names no folder (unset, the bundled traces serve)")
def test_one_template_profile_writes_its_table_and_plot(tmp_path):
    r = run_templates(tmp_path, templates=["texture-00"], workloads=["style3x1024-out512"], phones=["~11"],
                      traces_per_family=1, rates_mbps=(100.0,))
    p = r["per_template"]["texture-00"]
    assert p["ladder"]["template"] == "texture-00" and p["runs"] == 2      # one 5G trace + one constant link
    f = p["floor"]
    assert f["floor_image_mse"] > 0 and f["cachegen_L3_bits_per_value"] > 0
    s = p["summary"]["style3x1024-out512 | " + p["summary"][next(iter(p["summary"]))]["phone"] + " | umn_5gophers"]
    assert s["ceiling_vs_cachegen_L3"] >= 1.0
    md = (tmp_path / "templates.md").read_text()
    assert "| texture-00 |" in md and f"{s['speedup_vs_cachegen-L3']['median']:.2f}" in md
    assert json.loads((tmp_path / "templates.json").read_text())["templates"] == ["texture-00"]
    assert (tmp_path / "templates.png").stat().st_size > 1000
