#!/usr/bin/env bash
# make_golden_qwen2_tiny.sh — tests/golden/qwen2_tiny_fp32.json: the numpy reference's
# logits (scripts/reference_forward.py --tiny-golden) for the tiny qwen2 model that
# tests/cli/make_bad_models.cpp writes (random weights, q/k/v biases, NeoX RoPE). kvscope's
# forward pass plays no part: the C++ test helper only writes the GGUF file, and the
# reference reads it with the gguf package. tests/engine/test_families.cpp rebuilds the
# same file, checks its FNV-1a hash against the golden's and compares its logits.
#
# Usage: scripts/make_golden_qwen2_tiny.sh [BUILD_DIR] [PYTHON]
#   BUILD_DIR  a configured build with tests (default build/); make_bad_models is built there;
#   PYTHON     a python with numpy and gguf (default python3; e.g. build/llamacpp-venv/bin/python
#              after `pip install numpy gguf`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
python=${2:-python3}
cmake --build "$build" --target make_bad_models -j"$(nproc)" >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tests/cli/make_bad_models" "$tmp"
cd "$root"
"$python" scripts/reference_forward.py --tiny-golden --model "$tmp/qwen2.gguf" \
  --out tests/golden/qwen2_tiny_fp32.json
