#!/bin/bash
# waits for the collection, then trains SAEs layer by layer (priority order); resumable:
# re-running continues from runs/saes80k/checkpoints/ and skips nothing finished (report.json keeps results)
cd /work/wt/saeot
while [ ! -f runs/acts80k/shard_00079.safetensors ]; do sleep 20; done
sleep 5
for l in 9 18 10 0 12 3 15 6; do
  if [ -f runs/saes80k/layer_$l/cfg.json ]; then continue; fi
  nice -n 15 timeout 5400 ./dev saeot train-sae --acts runs/acts80k --layers $l --out runs/saes80k \
      --d-sae 4096 --k 64 --steps 600 --batch-size 256 --seed 0
done
