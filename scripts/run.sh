#!/usr/bin/env bash
# run.sh — set up, build and launch kvscope on the default model with the first prompt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
exec "$root/build/app/kvscope" "$@"
