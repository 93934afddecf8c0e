"""`sakura bench codec --quick` end to end on one template (tiny settings)."""

from __future__ import annotations

import json

from sakura.bench.codec import run


def test_bench_codec_quick(tmp_path):
    res = run(tmp_path, tasks=1, templates_per_task=1, photos=2, steps=2, quick=True, klein=False, storage=False,
              throughput_tokens=64)
    assert (tmp_path / "table.md").is_file() and (tmp_path / "rd_psnr.png").is_file()
    t = json.loads((tmp_path / "results.json").read_text())["tasks"]["look"]["templates"][0]
    by = {r["setting"]: r for r in t["rows"]}
    assert 0 < by["cachegen:level=3"]["psnr_vs_lossless_db"] <= 100 and by["cachegen:level=3"]["table_bytes"] > 0
    rungs = [r for r in t["rows"] if r["family"] == "progressive"]
    assert len(rungs) == 3 and [r["bytes"] for r in rungs] == sorted(r["bytes"] for r in rungs)
    assert rungs[-1]["psnr_vs_lossless_db"] > rungs[0]["psnr_vs_lossless_db"]
    assert "delta_psnr_vs_gt_db" in rungs[0]
    # the summary counts the comparisons the template made: every CacheGen level either reached
    # (a byte ratio) or not, and the ratios it reports are the ones it counted
    vs, cg = t["compare"]["vs"]["cachegen"], res["summary"]["look"]["cachegen"]
    assert len(vs) >= 1 and cg["points"] + cg["not_reached"] == len(vs)
    assert cg["points"] == sum(1 for e in vs if e["ratio"])
    assert cg["points"] == 0 or 0 < cg["median_ratio"] <= cg["max_ratio"]
    assert res["decode_workers"][0]["workers"] == 1 and res["throughput_klein_sized"][0]["decode_MBps"] > 0
