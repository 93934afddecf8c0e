"""`sakura bench codec --quick` end to end on one template (tiny settings)."""

from __future__ import annotations

import json

from sakura.bench.codec import run


def test_bench_codec_quick(tmp_path):
    res = run(tmp_path, tasks=1, templates_per_task=1, photos=2, steps=2, quick=True, klein=False, storage=False,
              throughput_tokens=64, log=lambda s: None)
    assert (tmp_path / "table.md").is_file() and (tmp_path / "rd_psnr.png").is_file()
    t = json.loads((tmp_path / "results.json").read_text())["tasks"]["look"]["templates"][0]
    by = {r["setting"]: r for r in t["rows"]}
    assert 0 < by["cachegen:level=3"]["psnr_vs_lossless_db"] <= 100 and by["cachegen:level=3"]["table_bytes"] > 0
    rungs = [r for r in t["rows"] if r["family"] == "progressive"]
    assert len(rungs) == 3 and [r["bytes"] for r in rungs] == sorted(r["bytes"] for r in rungs)
    assert rungs[-1]["psnr_vs_lossless_db"] > rungs[0]["psnr_vs_lossless_db"]
    assert "delta_psnr_vs_gt_db" in rungs[0] and res["summary"]["look"]["cachegen"]["points"] >= 0
    assert res["decode_workers"][0]["workers"] == 1 and res["throughput_klein_sized"][0]["decode_MBps"] > 0
