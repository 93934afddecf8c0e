#!/bin/bash
# Round 4 SAEs for layers 12/15/18 (FVU <= 0.15 target): a second training-only collection from the
# extra offline sources (stdlib + site-packages docstrings, package .rst/.md; saeot.corpus.EXTRA_SOURCES),
# excluding acts80k's chunks, then 1,500 steps on fit + acts-extra + acts-extra2. Bounded: nothing
# starts or runs past 03:55 UTC. Resumable: collect skips finished shards, train-sae resumes from
# runs/saes4/checkpoints/. Seed 0.
cd /work/wt/saeot
left() { echo $(( $(date -d '03:55' +%s) - $(date +%s) )); }
t=$(left); [ $t -gt 60 ] || exit 2
nice -n 19 timeout $(( t < 2100 ? t : 2100 )) ./dev saeot collect --out runs/acts-extra2 --n-tokens 98304 \
    --layers 12,15,18 --batch-size 8 --exclude runs/acts80k --sources stdlib,packages,package-docs || exit 1
for l in 18 12 15; do
  t=$(left); [ $t -gt 120 ] || exit 3
  [ -f runs/saes4/layer_$l/cfg.json ] || nice -n 19 timeout $t ./dev saeot train-sae --acts runs/acts80k \
      --extra-acts runs/acts-extra --extra-acts runs/acts-extra2 --layers $l --out runs/saes4 --d-sae 4096 \
      --k 64 --steps 1500 --batch-size 256 --seed 0
done
