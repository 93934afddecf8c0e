#!/bin/bash
# continuation of train.sh: layer 0, then layer 18 with 1,500 steps (FVU target), then 12, 3, 15, 6.
# resumable (checkpoints under <out>/checkpoints/)
cd /work/wt/saeot
while [ ! -f runs/saes80k/layer_10/cfg.json ]; do sleep 20; done
tr() { [ -f $2/layer_$1/cfg.json ] || nice -n 15 timeout 3000 ./dev saeot train-sae --acts runs/acts80k --layers $1 \
         --out $2 --d-sae 4096 --k 64 --steps $3 --batch-size 256 --seed 0; }
tr 0 runs/saes80k 600
tr 18 runs/saes80k-long 1500
for l in 12 3 15 6; do tr $l runs/saes80k 600; done
