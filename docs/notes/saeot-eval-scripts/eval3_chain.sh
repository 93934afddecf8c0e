#!/bin/bash
# after the old-SAE pairs: 9->18 again with the round-3 layer-18 SAE (more training tokens)
cd /work/wt/saeot
while [ ! -f docs/saeot/eval/eval_6_15.md ]; do sleep 15; done
PAIRS="9:18" SAES=runs/saes-r3 OUTDIR=docs/saeot/eval/sae3 runs/eval3.sh
