#!/bin/bash
# after the 9->18 evaluation: circuit compression (layers 9,18, default geometry), then the speed bench
cd /work/wt/saeot
while [ ! -f docs/saeot/eval/eval_9_18.md ]; do sleep 30; done
d=docs/saeot/compress-addition-standardise-unit
[ -f $d/compression.md ] || nice -n 15 timeout 2400 ./dev saeot compress --acts runs/acts80k --saes runs/saes80k \
   --layers 9,18 --n-nodes 24 --task addition --geometry standardise+unit --out $d
f=docs/saeot/speed_standardise-unit.json
[ -f $f ] || nice -n 15 timeout 1500 ./dev saeot bench-speed --acts runs/acts80k --saes runs/saes80k --layer-a 9 --layer-b 18 \
   --geometry standardise+unit --spaces reference --legacy '' --out $f
