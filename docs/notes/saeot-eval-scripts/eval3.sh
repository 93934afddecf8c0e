#!/bin/bash
# This round's evaluations, one at a time (nice 19, bounded): PAIRS="a:b ..." SAES=folder SUFFIX=tag.
# The configurations are eval2.sh's (default, old scalar, the one chosen on 9->18 val; each +/- CSLS).
cd /work/wt/saeot
CH=$(.venv/bin/python -c "
import json; c=json.load(open('docs/saeot/eval/selection_9_18.json'))['selection']['chosen']
g,sv,k,c,h=c[3:-1].split(',')[:5]; print(f'{g},{sv},{k[1:].replace(\"all\",\"0\")},{c[1:]},none')")
RED="standardise+unit,exact,32,32,none;scalar,exact,32,32,none;$CH"
RED="$RED;standardise+unit,exact,32,32,csls;scalar,exact,32,32,csls;${CH%,none},csls"
echo "configs: $RED"
for pr in $PAIRS; do
  a=${pr%:*}; b=${pr#*:}
  o=${OUTDIR:-docs/saeot/eval}/eval_${a}_${b}.json
  [ -f ${o%.json}.md ] && continue
  nice -n 19 timeout 2400 ./dev saeot evaluate --acts runs/acts80k --saes $SAES --pairs $pr \
    --n-eval 256 --n-intervene 32 --n-chunks 2 --configs "$RED" --settings shared --strategies nn,mutual --out $o
done
