#!/bin/bash
# Round 5 (A8) driver, after collect5.sh and train5_l9.sh: two chains side by side (nice 19),
#   A: layer 18 at k = 96, then the 9 -> 18 evaluation on it (eval5.sh)
#   B: layer 12 at k = 96, then layer 15 at k = 96
# k = 96 for every deep layer, chosen before any result (the rule: the smallest k of 96, 128 whose
# *val* FVU <= 0.15 at layers 12, 15 and 18; k = 128 only where 96 misses).
cd /work/wt/saeot
while ! grep -q 'in runs/acts-extra' runs/collect5.log; do sleep 10; done
(K=96 LAYERS=18 OUT=runs/saes5-k96 docs/saeot/eval/scripts/train5.sh > runs/train5_18.log 2>&1 &&
 docs/saeot/eval/scripts/eval5.sh > runs/eval5.log 2>&1) &
(K=96 LAYERS="12 15" OUT=runs/saes5-k96 docs/saeot/eval/scripts/train5.sh > runs/train5_12_15.log 2>&1) &
wait
# What actually ran (05:50-07:12 UTC): chain B's loop was stopped once layer 12 was training and
# layer 15 was started beside it at 06:37 (K=96 LAYERS=15 OUT=runs/saes5-k96 train5.sh) to finish
# in time; layer 15's val FVU at k = 96 was 0.1501, so by the rule:
#   K=128 LAYERS=15 OUT=runs/saes5-k128 docs/saeot/eval/scripts/train5.sh
# then .venv/bin/python docs/saeot/eval/scripts/fill_a8.py (the A8 tables).
