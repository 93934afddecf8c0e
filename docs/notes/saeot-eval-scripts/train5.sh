#!/bin/bash
# Round 5 (A8) SAEs for the deep layers: the round-3 recipe (TopK 4,096 features, AuxK, 1,500 steps,
# batch 256, seed 0, fit chunks of acts80k + acts-extra = 104,448 tokens) with a larger k.
# K=96 LAYERS="18 12 15" OUT=runs/saes5-k96 docs/saeot/eval/scripts/train5.sh
# Resumable (checkpoints under OUT/checkpoints/); nice 19; nothing runs past 07:20 UTC.
cd /work/wt/saeot
left() { echo $(( $(date -d '07:20' +%s) - $(date +%s) )); }
for l in ${LAYERS:-18 12 15}; do
  t=$(left); [ $t -gt 120 ] || exit 3
  [ -f $OUT/layer_$l/cfg.json ] || nice -n 19 timeout $t ./dev saeot train-sae --acts runs/acts80k \
      --extra-acts runs/acts-extra --layers $l --out $OUT --d-sae ${D_SAE:-4096} --k $K --steps ${STEPS:-1500} \
      --batch-size ${BATCH:-256} --seed 0
done
