#!/bin/bash
# Continuation of eval.sh: once 9->18 (full grid of 22 OT variants) is done, the configuration is
# chosen on its val split (saeot summarize --select-pairs 9:18); 9->10, 0->18, 0->9 then run the
# default, the old scalar one and the chosen one (each with and without CSLS).  Resumable.
cd /work/wt/saeot
have() { [ -f runs/saes80k/layer_$1/cfg.json ]; }
while [ ! -f docs/saeot/eval/eval_9_18.md ]; do sleep 20; done
./dev saeot summarize docs/saeot/eval/eval_9_18.json --select-pairs 9:18 --out docs/saeot/eval/selection_9_18.md > /dev/null
CH=$(.venv/bin/python -c "
import json; c=json.load(open('docs/saeot/eval/selection_9_18.json'))['selection']['chosen']
g,sv,k,c,h=c[3:-1].split(',')[:5]; print(f'{g},{sv},{k[1:].replace(\"all\",\"0\")},{c[1:]},none')")
RED="standardise+unit,exact,32,32,none;scalar,exact,32,32,none;$CH"
RED="$RED;standardise+unit,exact,32,32,csls;scalar,exact,32,32,csls;${CH%,none},csls"
echo "chosen on 9->18 val: $CH"
for pr in 9:10 0:18 0:9; do
  a=${pr%:*}; b=${pr#*:}
  while ! (have $a && have $b); do sleep 30; done
  if [ ! -f docs/saeot/eval/eval_${a}_${b}.md ]; then
    nice -n 15 timeout 3000 ./dev saeot evaluate --acts runs/acts80k --saes runs/saes80k --pairs $pr \
      --n-eval 256 --n-intervene 32 --n-chunks 2 --configs "$RED" --settings shared --strategies nn,mutual \
      --out docs/saeot/eval/eval_${a}_${b}.json
  fi
done
