#!/usr/bin/env bash
# make_golden_kquant.sh — regenerates tests/golden/q5_k_dequant.json with the gguf Python
# package (scripts/make_golden_kquant.py), in a venv of its own at build/golden-venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/golden-venv"
if ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "gguf==0.19.0" "numpy==1.26.4"
fi
"$venv/bin/python" "$root/scripts/make_golden_kquant.py"
