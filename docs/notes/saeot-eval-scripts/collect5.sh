#!/bin/bash
# Round 5 (A8): a fresh machine, so the caches are collected again with the commands that made the
# published ones (same corpus, same chunks; acts80k's val/test chunks are the evaluations' held-out
# tokens). The collector now stops each forward pass at the deepest collected layer (the
# unembedding is never run), which changes no stored value. Resumable (skips finished shards);
# nice 19, bounded by 07:20 UTC.
cd /work/wt/saeot
left() { echo $(( $(date -d '07:20' +%s) - $(date +%s) )); }
t=$(left); [ $t -gt 60 ] || exit 2
nice -n 19 timeout $t ./dev saeot collect --out runs/acts80k --n-tokens 81920 --layers 0,3,6,9,10,12,15,18 \
    --batch-size 8 || exit 1
t=$(left); [ $t -gt 60 ] || exit 2
nice -n 19 timeout $t ./dev saeot collect --out runs/acts-extra --n-tokens 163840 --layers 12,15,18 \
    --batch-size 8 --exclude runs/acts80k || exit 1
