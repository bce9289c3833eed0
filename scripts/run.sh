#!/usr/bin/env bash
# run.sh — set up, build and launch kvscope on the default model with the first prompt.
# Builds only the kvscope executable and the libraries it links (no test binaries);
# arguments go to kvscope (e.g. --model gemma3-270m, --backend cpu).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target kvscope
exec "$root/build/app/kvscope" "$@"
