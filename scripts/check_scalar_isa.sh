#!/usr/bin/env bash
# check_scalar_isa.sh — shows that the scalar path of the CPU backend runs no AVX
# instruction, and that a CPU without AVX gets that path by itself (the point of choosing
# the SIMD path at run time, engine/cpu/cpu_isa.h).
#
# Usage: scripts/check_scalar_isa.sh [BUILD_DIR] [TOKENS]
#   BUILD_DIR  a portable build (-DKVSCOPE_NATIVE=OFF); default build-portable/, configured
#              (-DKVSCOPE_APP=OFF -DKVSCOPE_CUDA=OFF) and built (kvscope only) when absent.
#   TOKENS     tokens to generate; default 2 (each run under emulation takes 2 to 3 minutes).
# Needs qemu-x86_64 (Debian package qemu-user; scripts/setup.sh installs it).
#
# Checks, in order:
#  0. the emulated CPU refuses AVX: a one-instruction program dies there with SIGILL;
#  1. the per-instruction-set objects (engine/cpu/kernels_{avx2,avx512}.cpp, the only
#     files built with AVX flags) define no symbol but their kernel table: no copy of a
#     library function compiled with AVX that the linker could pick for the rest of the
#     program;
#  2. `kvscope generate` on the default model, KVSCOPE_CPU_ISA=scalar, natively: the
#     reference tokens and top-5 logits;
#  3. the same under qemu-x86_64 -cpu Nehalem (SSE4.2, no AVX, AVX2, FMA, F16C, AVX-512):
#     an AVX instruction anywhere on the way would stop it with SIGILL; the output must be
#     the reference's;
#  4. the same under qemu with KVSCOPE_CPU_ISA unset: the dispatch must pick the scalar
#     path on its own (the backend's name says which) and give the same output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-portable}
tokens=${2:-2}
cpu_model=Nehalem

command -v qemu-x86_64 >/dev/null || {
  echo "check_scalar_isa: qemu-x86_64 not found (apt-get install qemu-user)" >&2
  exit 1
}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_NATIVE=OFF \
    -DKVSCOPE_APP=OFF -DKVSCOPE_CUDA=OFF >/dev/null
fi
grep -q '^KVSCOPE_NATIVE:BOOL=OFF' "$build/CMakeCache.txt" || {
  echo "check_scalar_isa: $build is not a -DKVSCOPE_NATIVE=OFF build" >&2
  exit 1
}
cmake --build "$build" -j"$(nproc)" --target kvscope >/dev/null
kvscope=$build/app/kvscope
fail=0

echo "== 0. qemu-x86_64 -cpu $cpu_model refuses AVX"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'int main(void) { __asm__ volatile("vxorps %%%%ymm0, %%%%ymm0, %%%%ymm0" ::: "xmm0"); }\n' \
  >"$tmp/avx.c"
cc -O0 "$tmp/avx.c" -o "$tmp/avx"
rc=0
# (The braces take the shell's own "Illegal instruction" notice too.)
{ (cd "$tmp" && qemu-x86_64 -cpu "$cpu_model" ./avx); } 2>/dev/null || rc=$?
if [ "$rc" -eq 132 ]; then
  echo "ok   an AVX instruction stops the program there (SIGILL)"
else
  echo "FAIL an AVX instruction ran there (exit $rc): this check would prove nothing"
  exit 1
fi

echo "== 1. symbols of the AVX objects"
objdir=$build/engine/CMakeFiles/kvscope_engine.dir/cpu
for isa in avx2 avx512; do
  # Defined symbols that are global or weak (lower-case types are local).
  exported=$(nm -C --defined-only "$objdir/kernels_$isa.cpp.o" | awk '$2 ~ /^[A-Z]$/' |
    grep -v " kvscope::cpu::kernels_$isa()$" || true)
  if [ -n "$exported" ]; then
    echo "FAIL kernels_$isa.cpp.o defines more than its table:"
    echo "$exported"
    fail=1
  else
    echo "ok   kernels_$isa.cpp.o defines only kvscope::cpu::kernels_$isa()"
  fi
done

# Token ids and top-5 (id, logit) per step, and the backend's name, of one generation.
run() {
  "$@" "$kvscope" generate --prompt "The capital of France is" --max-tokens "$tokens" \
    --threads 1 --temp 0 --json |
    python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("done"):
        print("backend", d["backend"])
    elif "token_id" in d:
        print(d["step"], d["token_id"], [(t["id"], t["logit"]) for t in d["top"]])
'
}
expect_same() {  # name, reference output, output
  if [ "$(grep -v '^backend' <<<"$2")" = "$(grep -v '^backend' <<<"$3")" ]; then
    echo "ok   $1: same tokens and top-5 logits as the native scalar run"
  else
    echo "FAIL $1: output differs from the native scalar run"
    diff <(echo "$2") <(echo "$3") || true
    fail=1
  fi
}
expect_backend() {  # name, output, wanted path
  if grep -q "^backend .*, $3)" <<<"$2"; then
    echo "ok   $1: $(grep '^backend' <<<"$2")"
  else
    echo "FAIL $1: not on the $3 path: $(grep '^backend' <<<"$2" || echo 'no summary')"
    fail=1
  fi
}

echo "== 2. native, KVSCOPE_CPU_ISA=scalar"
ref=$(run env KVSCOPE_CPU_ISA=scalar)
echo "$ref"
expect_backend native "$ref" scalar

echo "== 3. qemu-x86_64 -cpu $cpu_model (no AVX), KVSCOPE_CPU_ISA=scalar"
SECONDS=0
if out=$(run env KVSCOPE_CPU_ISA=scalar qemu-x86_64 -cpu "$cpu_model"); then
  echo "     ($SECONDS s)"
  expect_backend "qemu, forced scalar" "$out" scalar
  expect_same "qemu, forced scalar" "$ref" "$out"
else
  echo "FAIL qemu, forced scalar: kvscope stopped (exit $?)"
  fail=1
fi

echo "== 4. qemu-x86_64 -cpu $cpu_model (no AVX), KVSCOPE_CPU_ISA unset"
SECONDS=0
if out=$(run env -u KVSCOPE_CPU_ISA qemu-x86_64 -cpu "$cpu_model"); then
  echo "     ($SECONDS s)"
  expect_backend "qemu, dispatch" "$out" scalar
  expect_same "qemu, dispatch" "$ref" "$out"
else
  echo "FAIL qemu, dispatch: kvscope stopped (exit $?)"
  fail=1
fi

if [ "$fail" -ne 0 ]; then
  echo "check_scalar_isa: FAILED"
  exit 1
fi
echo "check_scalar_isa: passed"
