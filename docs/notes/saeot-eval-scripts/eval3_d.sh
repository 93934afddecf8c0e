#!/bin/bash
# after the round-3 9->18: debiased Sinkhorn and the bound-mid pre-filter on 9->18 (round-2 SAEs,
# comparable with docs/saeot/eval/eval_9_18.json)
cd /work/wt/saeot
while [ ! -f docs/saeot/eval/sae3/eval_9_18.md ]; do sleep 15; done
nice -n 19 timeout 1800 ./dev saeot evaluate --acts runs/acts80k --saes runs/saes80k --pairs 9:18 \
  --n-eval 256 --n-intervene 32 --n-chunks 2 --settings shared --strategies nn,mutual \
  --configs "standardise+unit,sinkhorn-debiased,32,32,none;standardise+unit,exact,32,16,none,bound-mid;standardise+unit,exact,32,32,none" \
  --out docs/saeot/eval/sinkhorn/eval_9_18.json
