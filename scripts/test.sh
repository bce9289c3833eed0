#!/usr/bin/env bash
# test.sh — set up, build and run the whole test suite: the controller test under
# ThreadSanitizer (a separate, instrumented build of the engine + controller), then
# everything with ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
bash "$root/scripts/setup.sh"
# The tests use both built-in models (the run command needs only the default).
bash "$root/scripts/fetch_model.sh" smollm2-135m gemma3-270m

echo "== controller under ThreadSanitizer"
cmake -S "$root" -B "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVSCOPE_SANITIZE=thread -DKVSCOPE_APP=OFF -DKVSCOPE_CUDA=OFF >/dev/null
cmake --build "$root/build-tsan" -j"$jobs" --target test_controller
(cd "$root/build-tsan" && ctest --output-on-failure -R '^app_controller$' --timeout 900)

echo "== full build and test suite"
bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j"$jobs" --timeout 900
