#!/usr/bin/env bash
# Download (here, where PyPI is reachable) the wheels sakura needs that the GPU machine's image
# lacks, for its Python 3.12 on x86-64, into .wheels/ (git-ignored; carry it: `carry: [".wheels"]`).
# The image has torch, transformers, numpy, numba, aiohttp, typer, tqdm, scikit-image, pillow...
# (/work/.library/device/KINDS.md); it lacks these. ~15 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=${PIP:-pip}
mkdir -p .wheels
$PIP download --dest .wheels --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --implementation cp --abi cp312 \
    "diffusers==0.42.1" "constriction>=0.4" "zstandard>=0.22" "pydantic>=2.7,<3" "pydantic-core" \
    "annotated-types" "typing-inspection" "importlib-metadata" "zipp"
ls -la .wheels
