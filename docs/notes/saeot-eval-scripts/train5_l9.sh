#!/bin/bash
# Round 5 (A8): the layer-9 SAE again with the published round-2 recipe (runs/saes80k: 600 steps on
# acts80k's 40,960 fit tokens, k = 64); it should reproduce held-out FVU 0.071. nice 19, bounded.
cd /work/wt/saeot
left=$(( $(date -d '07:20' +%s) - $(date +%s) )); [ $left -gt 120 ] || exit 3
[ -f runs/saes5-l9/layer_9/cfg.json ] || nice -n 19 timeout $left ./dev saeot train-sae --acts runs/acts80k \
    --layers 9 --out runs/saes5-l9 --d-sae 4096 --k 64 --steps 600 --batch-size 256 --seed 0
