#!/usr/bin/env bash
# Real-shape FLUX.2 Klein on one CUDA GPU (issue 33): `sakura bench realscale` for Klein-4B at
# 1024^2 in bf16 (random weights written with save_pretrained, loaded as klein:/folder@1024), then
# Klein-9B at 1024^2 if the time budget still allows. Writes under $OUT:
#   realscale_klein-4b.json / .log, realscale_klein-9b.json / .log, env.txt
# Budget: BUDGET_S (default 270 s) for everything; each JSON is rewritten after every stage of a
# size, so a run cut short still returns what it measured.
#
# On the device machine (repo root; its image has torch but not diffusers & co.: carry the wheels
# that scripts/gpu/fetch_wheels.sh downloads here, `carry: [".wheels"]`):
#   OUT=$OUT bash scripts/gpu/realscale.sh
# Reduced form on a CPU (what the test suite and docs/scale.md run):
#   DEVICE=cpu DTYPE=fp32 PRESETS=tiny SIZES=32 OUT=out/gpu-cpu bash scripts/gpu/realscale.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
PRESETS=${PRESETS:-"klein-4b klein-9b"}
SIZES=${SIZES:-1024}
BUDGET_S=${BUDGET_S:-280}
# The build's ladder here: lossless (the bit-exact streamed edit) and uniform 8-bit (issue 33's
# run). scripts/gpu/build41.sh runs this script with the DEFAULT ladder instead (issue 41: the
# sensitivity model's ~20 calibration edits, and the progressive fit at ~2.4 CPU-s per Klein-4B
# 1024^2 layer on a channel sample, in part threads: docs/scale.md).
LADDER=${LADDER:-"lossless;uniform:bits=8"}
CALIBRATION=${CALIBRATION:-1}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
start=$(date +%s)

if [ -d .wheels ] && ls .wheels/*.whl >/dev/null 2>&1; then
  # offline, only what is missing (the image's own torch/transformers stay)
  for w in .wheels/*.whl; do
    name=$(basename "$w" | cut -d- -f1 | tr _ -)
    $PY -m pip show "$name" >/dev/null 2>&1 || $PY -m pip install -q --no-index --no-deps "$w" 2>&1 | tail -1
  done
fi

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY - <<'EOF'
import importlib.metadata as md, importlib.util, sys
print("python", sys.version.split()[0])
# found, not imported (importing ray alone takes seconds); an optional one (ray) may be missing
for m, dist in (("torch", "torch"), ("diffusers", "diffusers"), ("transformers", "transformers"), ("numpy", "numpy"),
                ("numba", "numba"), ("constriction", "constriction"), ("zstandard", "zstandard"),
                ("pydantic", "pydantic"), ("aiohttp", "aiohttp"), ("typer", "typer"), ("tqdm", "tqdm"),
                ("skimage", "scikit-image"), ("PIL", "pillow"), ("sklearn", "scikit-learn"), ("ray", "ray")):
    if importlib.util.find_spec(m) is None:
        print(f"{m} MISSING")
        continue
    try:
        print(f"{m} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{m} ?")
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
missing=$(grep -E "^(torch|diffusers|transformers|numpy|numba|constriction|zstandard|pydantic|aiohttp|typer|tqdm|skimage|PIL|sklearn) MISSING" "$OUT/env.txt")
if [ -n "$missing" ]; then
  echo "required packages missing (carry .wheels from scripts/gpu/fetch_wheels.sh):"; echo "$missing"
  exit 3
fi

ladder_args=()
IFS=';' read -ra parts <<< "$LADDER"
for l in "${parts[@]}"; do ladder_args+=(--ladder "$l"); done
size_args=()
for s in $SIZES; do size_args+=(--size "$s"); done

rc=0
for preset in $PRESETS; do
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  # the 9B needs ~2x the 4B's time: start it only with room for its folder, load and one size
  if [ "$preset" != "klein-4b" ] && [ "$preset" != "tiny" ] && [ "$left" -lt 200 ]; then
    echo "$preset: skipped, ${left}s of the ${BUDGET_S}s budget left" | tee "$OUT/realscale_$preset.log"
    continue
  fi
  echo "== $preset (${left}s left)"
  timeout --signal=TERM "$left" $PY -m sakura bench realscale --preset "$preset" "${size_args[@]}" \
      --device "$DEVICE" --dtype "$DTYPE" "${ladder_args[@]}" --calibration "$CALIBRATION" --steps 4 --reps 2 \
      --deadline-s $(( left * 2 / 3 )) --quiet --out "$OUT/realscale_$preset.json" 2>&1 | tee "$OUT/realscale_$preset.log"
  r=${PIPESTATUS[0]}
  [ "$r" -ne 0 ] && { echo "$preset: exit $r (124: out of time; its JSON holds the stages it finished)"; rc=$r; }
done
echo "total $(( $(date +%s) - start )) s"
exit $rc
