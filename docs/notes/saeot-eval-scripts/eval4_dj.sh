#!/bin/bash
# disjoint-token setting on 9->18 (round-3 SAEs), default configuration only; bounded by 03:55 UTC
cd /work/wt/saeot
left=$(( $(date -d '03:55' +%s) - $(date +%s) ))
nice -n 19 timeout $left ./dev saeot evaluate --acts runs/acts80k --saes runs/saes-r3 --pairs 9:18 \
  --n-eval 256 --n-intervene 32 --n-chunks 2 --settings disjoint --strategies nn,mutual \
  --configs "standardise+unit,exact,32,32,none" --out docs/saeot/eval/sae3/disjoint_9_18.json
