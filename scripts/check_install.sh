#!/usr/bin/env bash
# What a user gets from `pip install sakura-kv` (no extras), measured: builds the wheel, installs it
# into a fresh venv (torch first, by exact version: the local CPU wheel), then checks the wheel's
# metadata, `import sakura`, the one-line errors of the extras it lacks, and a serve + edit of a store
# built beforehand by the full environment (the cloud builds; a phone or server has only the core).
# Prints the venv's size. docs/dependencies.md has the figures and the command.
#
#   scripts/check_install.sh VENV_DIR STORE_DIR [EXTRAS]     e.g. /tmp/v-core /tmp/store   or   ... flux
set -euo pipefail
venv="$1"; store="$2"; extras="${3:-}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3.11}"
wheels="$(mktemp -d)"
"$py" -m pip wheel -q --no-deps -w "$wheels" "$repo" >/dev/null
whl="$(ls "$wheels"/sakura_kv-*.whl)"
echo "== wheel $(basename "$whl"): Requires-Dist (core)"
unzip -p "$whl" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/   /'
if unzip -p "$whl" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | grep -Ei '==|matplotlib|scikit|diffusers|transformers'; then
  echo "FAIL: a pin or a heavy package in the core requirements"; exit 1
fi
rm -rf "$venv"; "$py" -m venv "$venv"
"$venv/bin/pip" install -q "torch==2.13.0"
spec="$whl"; [ -n "$extras" ] && spec="sakura-kv[$extras] @ file://$whl"
"$venv/bin/pip" install -q -c "$repo/constraints.txt" "$spec"
echo "== installed: $("$venv/bin/sakura" --version); $("$venv/bin/pip" list 2>/dev/null | tail -n +3 | wc -l) distributions"
"$venv/bin/python" - <<'EOF'
import importlib.util
print("   heavy packages present:", [m for m in ("matplotlib", "skimage", "sklearn", "diffusers", "transformers", "scipy")
                                    if importlib.util.find_spec(m)] or "none")
EOF
cd "$(mktemp -d)"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
"$venv/bin/python" -c "import sakura; print('== import sakura:', sakura.__version__, sakura.__file__)"
echo "== what the core lacks, one line each (rc 2):"
set +e
for args in "build st" "info --model flux2-mini" "bench workloads --out w"; do
  out="$("$venv/bin/sakura" $args 2>&1)"; rc=$?
  echo "   sakura $args -> rc $rc: $(echo "$out" | tail -n 1)"
done
set -e
echo "== serve + edit with the bundled model (store built by the full environment: $store)"
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
"$venv/bin/sakura" serve "$store" --port "$port" --quiet > serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
"$venv/bin/python" - "$url" <<'EOF'
import sys, time, urllib.request
for _ in range(200):  # bounded: 20 s at most
    try:
        urllib.request.urlopen(sys.argv[1] + "/", timeout=1)
        break
    except OSError as e:
        if getattr(e, "code", None):  # an HTTP status: the server answers
            break
        time.sleep(0.1)
EOF
"$venv/bin/python" -c "from PIL import Image; Image.new('RGB', (96, 80), (200, 120, 40)).save('photo.png')"
"$venv/bin/sakura" warm >/dev/null   # the decoders' JIT once after an install (the docs say so too)
"$venv/bin/sakura" edit photo.png --server "$url" --template sticker-00 --gallery gallery --out edited.png | tail -n 3
test -s edited.png
echo "== venv size: $(du -sh "$venv" | cut -f1) ($venv)"
