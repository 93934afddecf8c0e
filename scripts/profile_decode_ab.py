"""Phone profile headline with host vs phone-class decode rates, side by side in one run: the published
profile's measured ladder (docs/e2e/e2e_profile.json) re-rated to each target of the shipped calibration
(sakura/assets/decode_rates.json), no sweep (the losing runs and the equal-quality ratios do not need it).
Usage: python scripts/profile_decode_ab.py host phone   (writes out/ab-host, out/ab-phone; ~9 min each)"""
import json, sys, time
from sakura.bench.profile import rate_ladder, run_profile
src = json.load(open("docs/e2e/e2e_profile.json"))
ladder = src["ladder"]
t0 = time.time()
for target in sys.argv[1:]:
    lad = rate_ladder(ladder, target)   # both from the same side-by-side run (sakura/assets/decode_rates.json)
    r = run_profile(f"out/ab-{target}", traces_per_family=None, jobs=2, sweep=False, ladder=lad, decode_target=target,
                    log=lambda s: None)
    print(target, "done", time.time() - t0, flush=True)

for target in sys.argv[1:]:   # the headline: losing runs over all families, the best cell's equal-quality ratio
    d = json.load(open(f"out/ab-{target}/e2e_profile.json"))
    cells = [v for v in d["summary"].values() if v["family"] == "umn_5gophers"]
    best = max(cells, key=lambda v: v["speedup_vs_cachegen-L3"]["median"])
    print(f"{target}: {sum(v['losing_runs'] for v in d['summary'].values() if v['family'] == 'all')} of "
          f"{len(d['runs'])} runs lose; best cell {best['workload']} {best['phone']}: cachegen-L3 / sakura "
          f"{best['speedup_vs_cachegen-L3']['median']:.2f} (p10 {best['speedup_vs_cachegen-L3']['p10']:.2f})")
