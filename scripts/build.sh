#!/usr/bin/env bash
# build.sh — configure and build kvscope (Release) into build/. Extra arguments go to
# the CMake configure step (e.g. -DKVSCOPE_CUDA=OFF).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$root/build" -j"$(nproc)"
