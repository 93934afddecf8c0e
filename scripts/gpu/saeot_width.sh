#!/usr/bin/env bash
# saeot width benchmark on an accelerator: all-pairs exact W2 nearest neighbours between two layers of
# 4,096 and 16,384 features (k = 32, d = 640, synthetic layers: saeot.width.synthetic_layers) in one
# run, the candidate search on the GPU (--device cuda), exact W2 on the CPU cores, the recall of the
# exact nearest neighbour on 64 sources per width.  Needs only this repository and the venv's packages.
#
#   OUT=out/gpu scripts/gpu/saeot_width.sh                  # on the GPU machine (~1-2 min on an H200 host)
#   WIDTHS=512,1024 DEVICE=cpu scripts/gpu/saeot_width.sh   # a reduced CPU check (tests/saeot/test_width.py)
#
# Env: OUT (default ./out/gpu), WIDTHS (default 4096,16384), DEVICE (default cuda), PYTHON (default
# .venv/bin/python if present, else python3).  Writes $OUT/saeot_width.json and $OUT/saeot_width.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-./out/gpu}"
WIDTHS="${WIDTHS:-4096,16384}"
DEVICE="${DEVICE:-cuda}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/saeot_width.log"
{
  echo "# saeot width benchmark $(date -u +%FT%TZ) host $(hostname) cores $(nproc) device $DEVICE widths $WIDTHS"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; fi
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())'
} > "$LOG" 2>&1
timeout 420 "$PYTHON" -m saeot.cli bench-width --device "$DEVICE" --widths "$WIDTHS" \
  --out "$OUT/saeot_width.json" >> "$LOG" 2>&1
cat "$LOG"
