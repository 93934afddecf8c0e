#!/bin/bash
# Runs `saeot evaluate` per layer pair as soon as both SAEs exist (resumable: a finished pair's
# JSON is kept and skipped).  Outputs: docs/saeot/eval/eval_<a>_<b>.json (+ .md), disjoint_<a>_<b>.json.
cd /work/wt/saeot
mkdir -p docs/saeot/eval
CFG="standardise+unit,exact,32,32,none;scalar,exact,32,32,none;whiten+unit,exact,32,32,none"
for g in scalar standardise whiten unit standardise+unit whiten+unit; do CFG="$CFG;$g,sliced,32,0,none"; done
CFG="$CFG;standardise+unit,sliced,128,0,none;standardise+unit,sliced,0,0,none"
ALL="$CFG"
for c in $(echo "$CFG" | tr ';' ' '); do ALL="$ALL;${c%,none},csls"; done
have() { [ -f runs/saes80k/layer_$1/cfg.json ]; }
for pr in 9:18 9:10 0:18 0:9 3:12 6:15; do
  a=${pr%:*}; b=${pr#*:}
  while ! (have $a && have $b); do sleep 30; done
  if [ ! -f docs/saeot/eval/eval_${a}_${b}.md ]; then
    nice -n 15 timeout 3000 ./dev saeot evaluate --acts runs/acts80k --saes runs/saes80k --pairs $pr \
      --n-eval 256 --n-intervene 32 --n-chunks 2 --configs "$ALL" --settings shared --strategies nn,mutual \
      --out docs/saeot/eval/eval_${a}_${b}.json
  fi
done
for pr in 9:18 9:10 0:18 0:9 3:12 6:15; do
  a=${pr%:*}; b=${pr#*:}
  while ! (have $a && have $b); do sleep 30; done
  if [ ! -f docs/saeot/eval/disjoint_${a}_${b}.md ]; then
    nice -n 15 timeout 2000 ./dev saeot evaluate --acts runs/acts80k --saes runs/saes80k --pairs $pr \
      --n-eval 256 --n-intervene 32 --n-chunks 2 --configs "standardise+unit,exact,32,32,none;scalar,exact,32,32,none" \
      --settings disjoint --strategies nn,mutual --out docs/saeot/eval/disjoint_${a}_${b}.json
  fi
done
