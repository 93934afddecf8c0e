#!/bin/bash
# Round 3 SAEs for the layers that missed FVU <= 0.15 (18, 12, 15): a training-only extra collection
# (every corpus chunk not already in acts80k, so never a val/test chunk), then 1,500 steps on
# fit + extra tokens.  One process at a time; resumable (collect skips finished shards, train-sae
# resumes from runs/saes3/checkpoints/).
cd /work/wt/saeot
nice -n 19 timeout 3000 ./dev saeot collect --out runs/acts-extra --n-tokens 163840 --layers 12,15,18 \
    --batch-size 8 --exclude runs/acts80k || exit 1
for l in 18 12 15; do
  [ -f runs/saes3/layer_$l/cfg.json ] || nice -n 19 timeout 2400 ./dev saeot train-sae --acts runs/acts80k \
      --extra-acts runs/acts-extra --layers $l --out runs/saes3 --d-sae 4096 --k 64 --steps 1500 \
      --batch-size 256 --seed 0
done
