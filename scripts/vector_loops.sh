#!/usr/bin/env bash
# vector_loops.sh — what this core's vector pipes allow for the products' inner loops
# (scripts/vector_loops.cpp): ns per vector of weights for each instruction mix of the
# product kernels, in loops of independent chains, one thread; 256-bit, then 512-bit
# where the CPU has AVX-512F. Set against `kvscope bench`'s ceiling (the products with
# every weight in cache), it says how near the kernels run to their own instructions'
# bound (docs/performance.md). An argument sets the iterations per run (default 20
# million). Needs a C++ compiler; builds into build/vector_loops/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/vector_loops"
mkdir -p "$out"
cxx=${CXX:-c++}
grep -m1 "model name" /proc/cpuinfo || true
"$cxx" -O2 -std=c++20 -o "$out/loops256" "$root/scripts/vector_loops.cpp"
"$out/loops256" "$@"
if grep -qw avx512f /proc/cpuinfo; then
  "$cxx" -O2 -std=c++20 -DKVSCOPE_LOOPS_512 -mavx512f -o "$out/loops512" "$root/scripts/vector_loops.cpp"
  "$out/loops512" "$@"
else
  echo "vector_loops: no AVX-512F on this CPU; 512-bit loops not run"
fi
