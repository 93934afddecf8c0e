#!/bin/bash
# debiased Sinkhorn on a real pair: 9->18, round-3 SAEs (comparable with docs/saeot/eval/sae3/eval_9_18.json),
# bound-mid candidates (16), beside exact on the same candidates. nice 19, bounded.
cd /work/wt/saeot
mkdir -p docs/saeot/eval/sinkhorn
nice -n 19 timeout 2700 ./dev saeot evaluate --acts runs/acts80k --saes runs/saes-r3 --pairs 9:18 \
  --n-eval 256 --n-intervene 32 --n-chunks 2 --settings shared --strategies nn,mutual \
  --configs "standardise+unit,sinkhorn-debiased,32,16,none,bound-mid;standardise+unit,exact,32,16,none,bound-mid" \
  --out docs/saeot/eval/sinkhorn/eval_9_18.json
