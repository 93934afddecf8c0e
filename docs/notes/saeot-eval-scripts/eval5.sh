#!/bin/bash
# Round 5 (A8): 9 -> 18 with the round-2 layer-9 SAE (retrained, runs/saes5-l9) and the round-5
# layer-18 SAE (L18=runs/saes5-k96/layer_18 by default), default configuration only, shared tokens,
# nn + mutual: the same command as docs/saeot/eval/sae3/eval_9_18.json's default rows. nice 19, bounded.
cd /work/wt/saeot
mkdir -p runs/saes5-eval docs/saeot/eval/sae5
ln -sfn ../saes5-l9/layer_9 runs/saes5-eval/layer_9
ln -sfn ../../${L18:-runs/saes5-k96/layer_18} runs/saes5-eval/layer_18
left=$(( $(date -d '07:22' +%s) - $(date +%s) )); [ $left -gt 120 ] || exit 3
nice -n 19 timeout $left ./dev saeot evaluate --acts runs/acts80k --saes runs/saes5-eval --pairs 9:18 \
  --n-eval 256 --n-intervene 32 --n-chunks 2 --settings shared --strategies nn,mutual \
  --configs "standardise+unit,exact,32,32,none" --out docs/saeot/eval/sae5/eval_9_18.json
