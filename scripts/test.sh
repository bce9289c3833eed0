#!/usr/bin/env bash
# test.sh — set up, build and run the whole test suite, then run it again under sanitizers.
# Which test runs under which sanitizer, and why:
#
#   1. release     every test (ctest), built the way users build it (build/; the CUDA
#                  backend too when nvcc is there, for sm_90 on a machine without a GPU);
#                  the tests' own code at -O1 (tests/CMakeLists.txt).
#   2. isa-clang   the engine again, built by clang for any x86-64 CPU (build-clang/:
#                  -DKVSCOPE_NATIVE=OFF, no app, no CUDA), and only the test binaries that
#                  check each SIMD path against the scalar reference bit for bit (matmul,
#                  attention, elementwise, row kernels), plus the KVSCOPE_CPU_ISA dispatch
#                  test for each path. Stage 1 builds with gcc and -march=native; this one
#                  checks that the per-instruction-set files (engine/cpu/kernels_*.cpp, their
#                  flags set in engine/CMakeLists.txt) build with the other compiler and
#                  that a portable build still dispatches to every path the CPU has (a path
#                  it lacks is a skip that names it), then the per-path cases once more
#                  under qemu-x86_64 -cpu Haswell, a CPU without AVX-512. A few minutes on
#                  2 cores.
#   3. asan+ubsan  every test again but eight (named below) in one AddressSanitizer +
#                  UndefinedBehaviorSanitizer build of everything (build-asan/, CPU
#                  backend, the CUDA kernels and the CUDA backend on the emulator): out-of-bounds, use-after-free, leaks,
#                  undefined behaviour, and device-buffer overruns (the emulator poisons the
#                  bytes past every cudaMalloc). The engine's three SIMD kernel files are
#                  built uninstrumented into the engine (instrumented, they made every
#                  real-model test about 7x slower); the kernel tests (test_matmul,
#                  test_attention, test_elementwise, test_quant) link an instrumented copy
#                  of them instead, built at -O1, a sixth of -O3's compile time for the same
#                  test time (engine/CMakeLists.txt, tests/engine/CMakeLists.txt).
#                  Test code is built at -O0 without UBSan (ASan only; the code under test
#                  keeps both) and the app's at -O1 (the engine keeps -O3):
#                  most of this build's compile time was theirs. It covers the engine, the
#                  emulated kernels,
#                  the CLI (the kvscope binary the CLI tests run is instrumented), render,
#                  the app and the fuzz targets (fuzz_driver mutations). Tests added later
#                  run here too, with no list to update. A UBSan finding aborts the test
#                  that hit it. The one suppression (GL driver leaks) and the sanitizer
#                  options are in tests/sanitizer_defaults.cpp.
#   4. tsan        the controller test again under ThreadSanitizer (build-tsan/, the engine
#                  instrumented too): its worker thread, its queues, and the real model
#                  steps it runs on the CPU thread pool; and the serve test (cli_serve):
#                  `kvscope serve`'s engine thread, its inbox and per-request channels,
#                  httplib's handler threads, disconnects and the SIGTERM shutdown; and the
#                  serving run's worker thread (app_serving_run_threads: its play, pause,
#                  step, destruction and error cases of test_serving_run). The SIMD kernel
#                  files are uninstrumented here too: each thread's rows are its own, and
#                  the hand-offs between threads are in the instrumented pool. Only
#                  these: the rest is single-threaded or runs on that same pool, ASan
#                  already checks it, and TSan would slow the real-model tests 10x or more;
#                  the emulator's fibers would also need TSan fiber calls. (httplib's own
#                  code is Debian's uninstrumented library; its locks are seen through the
#                  pthread calls TSan intercepts.)
# So every test runs under at least one sanitizer, except the *_gpu tests (real GPU; skip
# without one; their sources run in stage 3 on the emulator) and the two emulated
# real-model CUDA tests named in stage 3 (their kernels run there on tiny models).
# The fuzz targets run here through fuzz_driver (a few seconds each, in stages 1 and 3).
# Coverage-guided libFuzzer runs need a clang build of the engine (-DKVSCOPE_FUZZ=ON, see
# tests/fuzz/CMakeLists.txt); they are run by hand, not here, to keep CI short on a 2-core
# machine: the ASan+UBSan build of everything is the expensive part.
# Each stage prints its time ("== NAME: done in N s").
# KVSCOPE_TEST_STAGES="release asan" (any of release, isa, asan, tsan) runs only those
# stages (scripts/stress_check.sh repeats them under load); unset, all four run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
stages=${KVSCOPE_TEST_STAGES:-release isa asan tsan}
for s in $stages; do
  case $s in release|isa|asan|tsan) ;; *) echo "test.sh: unknown stage '$s' in KVSCOPE_TEST_STAGES (release, isa, asan, tsan)" >&2; exit 2 ;; esac
done
wanted() { [[ " $stages " == *" $1 "* ]]; }
bash "$root/scripts/setup.sh"
# The tests use both built-in models (the run command needs only the default).
bash "$root/scripts/fetch_model.sh" smollm2-135m gemma3-270m


stage() {
  echo "== $1"
  SECONDS=0
}
done_stage() {
  echo "== $1: done in ${SECONDS} s"
}

# ctest in a build folder (its log, Testing/Temporary/LastTest.log, is what check_skips reads).
run_ctest() {  # build dir, ctest arguments...
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@")
}

# A green run must not hide tests that never ran (scripts/check_skips.py). Two reasons to
# skip are expected on CI's machines, and a skip gives its reason in its message
# (tests/util/skip_reason.h): "[allowed: no-gpu]" for a real-GPU test where no GPU is
# usable, "[allowed: isa avx512]" (or avx2) for a SIMD path the CPU lacks. Any other skip (no
# OpenGL, no model, no long text) fails the stage and names the tests. Each stage's line
# counts the allowed skips and says which SIMD paths ran here and which did not; the lines
# are repeated at the end.
summary=()
check_skips() {  # stage name, build dirs or GoogleTest XML reports...
  local line rc=0
  line=$(python3 "$root/scripts/check_skips.py" "$@") || rc=$?
  echo "$line"
  summary+=("$(head -n1 <<<"$line")")
  return $rc
}

if wanted release; then
stage "release: full build and test suite"
bash "$root/scripts/build.sh"
run_ctest "$root/build" --timeout 900
check_skips release "$root/build"
done_stage "release"
fi

if wanted isa; then
stage "isa-clang: each SIMD path of a portable clang build against the scalar reference"
CC=clang CXX=clang++ cmake -S "$root" -B "$root/build-clang" -DCMAKE_BUILD_TYPE=Release \
  -DKVSCOPE_NATIVE=OFF -DKVSCOPE_APP=OFF -DKVSCOPE_CUDA=OFF >/dev/null
isa_tests=(test_matmul test_attention test_elementwise test_quant)
cmake --build "$root/build-clang" -j"$jobs" --target "${isa_tests[@]}"
reports=()
for t in "${isa_tests[@]}"; do
  "$root/build-clang/tests/engine/$t" --gtest_brief=1 \
    --gtest_output="xml:$root/build-clang/$t.xml"
  reports+=("$root/build-clang/$t.xml")
done
# The dispatch as the environment forces it: a path this CPU lacks is reported as skipped.
for isa in scalar avx2 avx512; do
  KVSCOPE_CPU_ISA=$isa "$root/build-clang/tests/engine/test_matmul" --gtest_filter='CpuIsa.*' \
    --gtest_output="xml:$root/build-clang/cpu_isa_$isa.xml"
  reports+=("$root/build-clang/cpu_isa_$isa.xml")
done
check_skips isa-clang "${reports[@]}"
# The AVX2 and AVX-512 cases again on an AVX2-only CPU (qemu-x86_64 -cpu Haswell: AVX2,
# FMA, F16C, no AVX-512), as on the project's AVX2-only machines: the AVX-512 cases must
# skip naming their path (the line below lists avx512 as not run), the AVX2 ones pass, and
# an AVX-512 instruction outside the AVX-512 kernels would stop the run (SIGILL). Emulated,
# an instruction costs about a hundred times its native time, so the cases take fewer and
# smaller shapes there, still one of each kernel branch (KVSCOPE_TEST_EMULATED_CPU,
# tests/util/isa_paths.h), and the scalar path (built for any x86-64 CPU) is left to the
# native runs above, which check every shape. About 40 s.
reports=()
for t in "${isa_tests[@]}"; do
  KVSCOPE_TEST_EMULATED_CPU=1 qemu-x86_64 -cpu Haswell "$root/build-clang/tests/engine/$t" --gtest_brief=1 \
    --gtest_filter='Isa/*/avx2:Isa/*/avx512:CpuIsa.*' --gtest_output="xml:$root/build-clang/haswell_$t.xml" 2>&1 |
    grep -v "TCG doesn't support requested feature"
  reports+=("$root/build-clang/haswell_$t.xml")
done
check_skips "isa-clang on an emulated AVX2-only CPU" "${reports[@]}"
done_stage "isa-clang"
fi

if wanted asan; then
stage "asan+ubsan: every test under AddressSanitizer and UndefinedBehaviorSanitizer"
cmake -S "$root" -B "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVSCOPE_SANITIZE=address,undefined -DKVSCOPE_CUDA=OFF >/dev/null
cmake --build "$root/build-asan" -j"$jobs"
# Left out here, each because this stage's other tests already run its code under ASan
# and what it adds is a number that stage 1 checks (an ASan run costs 30 to 60 times a
# release run):
#  - the forced-ISA reruns of real-model tests (engine_session_cache_nocache_avx2,
#    engine_forward_fp32_reference_{avx2,scalar}): each SIMD path's numbers, on test code
#    that runs here with the default path; test_matmul still runs the scalar, AVX2 and
#    AVX-512 kernels for every weight type here; and the forced-ISA reruns of
#    Matmul.TheStartPathEqualsTheExactReferenceForEveryTypeAndT
#    (engine_matmul_exact_{avx2,avx512}, 50 s each here), whose paths the
#    Isa/MatmulPath.EveryTypeEqualsTheExactReferenceBitForBit/<path> cases run here;
#  - CudaBackendParity.{DefaultModel,Gemma3}PromptAndTwoDecodeStepsSameTop5: the emulated
#    CUDA backend on the two real models, three steps each (about 15% of this stage's test
#    time): the only tests not run under any sanitizer but test_cuda_backend_gpu; every
#    kernel and cache layout they use (rings, batches, graphs) runs here in the tiny-model
#    parity tests of the same file;
#  - app_memory_return: resident memory after Reset and a model switch, which means nothing
#    under ASan's allocator (the controller code it drives runs here in app_controller).
# Long tests that run shorter here (tests/util/sanitizer.h) include: the sink + window perplexity
# test over 120 tokens instead of 200, the KL ordering over 12 steps instead of 32, the
# emulated CUDA device-sampling parity over 24 steps instead of 64 and the fused
# quantized-cache parity over 8 instead of 16.
asan_skip='^engine_(session_cache_nocache_avx2|forward_fp32_reference_(avx2|scalar)|matmul_exact_(avx2|avx512))$'
asan_skip+='|^CudaBackendParity\.(DefaultModel|Gemma3)PromptAndTwoDecodeStepsSameTop5$'
asan_skip+='|^app_memory_return$'
run_ctest "$root/build-asan" --timeout 1800 -E "$asan_skip"
check_skips asan+ubsan "$root/build-asan"
done_stage "asan+ubsan"
fi

if wanted tsan; then
stage "tsan: the controller, the serving run and kvscope serve under ThreadSanitizer"
cmake -S "$root" -B "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVSCOPE_SANITIZE=thread -DKVSCOPE_APP=OFF -DKVSCOPE_CUDA=OFF >/dev/null
cmake --build "$root/build-tsan" -j"$jobs" --target test_controller test_serving_run kvscope
run_ctest "$root/build-tsan" -R '^(app_controller|app_serving_run_threads|cli_serve)$' --timeout 900
check_skips tsan "$root/build-tsan"
done_stage "tsan"
fi
printf '%s\n' "== summary of skips and SIMD paths, by stage:" "${summary[@]}"
