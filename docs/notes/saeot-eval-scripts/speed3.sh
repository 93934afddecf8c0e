#!/bin/bash
cd /work/wt/saeot
exec nice -n 19 timeout 2400 ./dev saeot bench-speed --acts runs/acts80k --saes runs/saes80k --geometry standardise+unit \
  --spaces reference --legacy '' --no-pruned --prefilters sliced,pca-sliced,pca-bound,bound-mid --recall-sources 32 \
  --out docs/saeot/speed_r3.json
