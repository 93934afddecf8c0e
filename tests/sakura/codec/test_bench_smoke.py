"""`sakura bench codec --quick` end to end on one template (tiny settings)."""

from __future__ import annotations

import json

from sakura.codec.bench import run


def test_bench_codec_quick(tmp_path):
    res = run(tmp_path, tasks=1, steps=2, quick=True, klein=False, throughput_tokens=64, log=lambda s: None)
    assert (tmp_path / "table.md").is_file() and (tmp_path / "rd_attn.png").is_file()
    assert (tmp_path / "rd_psnr.png").is_file()
    rows = json.loads((tmp_path / "results.json").read_text())["tasks"]["look"]["rows"]
    by = {r["setting"]: r for r in rows}
    assert by["lossless"]["attn_rel_err_mean"] == 0.0 and by["lossless"]["psnr_vs_lossless_db"] == float("inf")
    assert by["uniform:bits=4"]["bits_per_value"] < 5.2
    assert 0 < by["sakura:budget=2.0"]["attn_rel_err_mean"] < 0.5
    assert "delta_psnr_vs_gt_db" in by["sakura:budget=2.0"]
    rungs = [r for r in rows if r["rung"] is not None]
    assert [r["bytes"] for r in rungs] == sorted(r["bytes"] for r in rungs)
    assert res["tasks"]["look"]["ladder_fraction_of_fp16"] < 1 / 3
