#!/bin/bash
# Round 5 (A8), second part (integrator): the distant pairs that use the deep layers, on SAEs that meet
# FVU <= 0.15: layers 0, 3, 6 retrained with the published round-2 recipe (600 steps on acts80k's fit
# chunks, k = 64, seed 0; as train5_l9.sh), layers 12 / 15 / 18 from round 5 (k = 96 / 128 / 96).
# Default configuration only, shared tokens, nn + mutual (eval5.sh's command). nice 19, bounded by END.
cd /work/wt/saeot
END=${END:-08:12}
left() { echo $(( $(date -d "$END" +%s) - $(date +%s) )); }
for l in 0 3 6; do
  t=$(left); [ $t -gt 120 ] || exit 3
  [ -f runs/saes5-shallow/layer_$l/cfg.json ] || nice -n 19 timeout $t ./dev saeot train-sae --acts runs/acts80k \
      --layers $l --out runs/saes5-shallow --d-sae 4096 --k 64 --steps 600 --batch-size 256 --seed 0 || exit 1
done
mkdir -p runs/saes5-eval docs/saeot/eval/sae5
for l in 0 3 6; do ln -sfn ../saes5-shallow/layer_$l runs/saes5-eval/layer_$l; done
ln -sfn ../saes5-k96/layer_12 runs/saes5-eval/layer_12
ln -sfn ../saes5-k128/layer_15 runs/saes5-eval/layer_15
ln -sfn ../saes5-k96/layer_18 runs/saes5-eval/layer_18
for pr in 0:18 3:12 6:15; do
  a=${pr%:*}; b=${pr#*:}; o=docs/saeot/eval/sae5/eval_${a}_${b}.json
  [ -f ${o%.json}.md ] && continue
  t=$(left); [ $t -gt 120 ] || exit 3
  nice -n 19 timeout $t ./dev saeot evaluate --acts runs/acts80k --saes runs/saes5-eval --pairs $pr \
    --n-eval 256 --n-intervene 32 --n-chunks 2 --settings shared --strategies nn,mutual \
    --configs "standardise+unit,exact,32,32,none" --out $o
done
