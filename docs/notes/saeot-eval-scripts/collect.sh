#!/bin/bash
# resumable: re-running skips finished shards
cd /work/wt/saeot
exec nice -n 15 timeout 6000 ./dev saeot collect --out runs/acts80k --n-tokens 81920 --layers 0,3,6,9,10,12,15,18 --batch-size 8
