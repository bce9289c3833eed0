#!/usr/bin/env bash
# bench_batched_vs_llamacpp.sh — kvscope's batched decode against llama.cpp's
# `llama-batched-bench` on the same GGUF file, thread count and batch sizes, measured in
# one run with the order alternating, reported as best, median and ratio.
#
#   scripts/bench_batched_vs_llamacpp.sh [--rounds N] [--threads T] [--batch 1,4,16]
#                                        [--model PATH]
#
# llama.cpp comes from PyPI: the source of llama-cpp-python==0.3.36 (sha256 pinned below),
# whose vendored llama.cpp builds `llama-batched-bench` (native CPU flags, no CUDA) into
# build/llamacpp-bb the first time (a few minutes; needs cmake and a C++ compiler).
# kvscope must be built first (scripts/build.sh; KVSCOPE_BIN names another executable).
#
# Both sides: B sequences, each with its own 32-token prompt, then 32 decode steps that
# each take one token of every sequence through one forward pass, f16 KV cache.
#   kvscope:   `kvscope bench --batch B --json`        -> decode_tok_s
#   llama.cpp: `llama-batched-bench -npp 32 -ntg 32 -npl B --output-format jsonl`
#              -> speed_tg (B x 32 tokens over the time of the 32 steps)
# The ratio is kvscope / llama.cpp (above 1: kvscope faster). Raw results stay in
# build/bench_batched_vs_llamacpp/ next to the table (table.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3
threads=$(nproc)
batch="1,4,16"
model="$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench_batched_vs_llamacpp: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_batched_vs_llamacpp: --rounds must be a positive integer, got '$rounds'" >&2; exit 1; }
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "bench_batched_vs_llamacpp: --threads must be a positive integer, got '$threads'" >&2; exit 1; }
[[ "$batch" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "bench_batched_vs_llamacpp: --batch must be like 1,4,16, got '$batch'" >&2; exit 1; }
kvscope="${KVSCOPE_BIN:-$root/build/app/kvscope}"
[ -x "$kvscope" ] || { echo "bench_batched_vs_llamacpp: $kvscope is missing: build kvscope first (scripts/build.sh)" >&2; exit 1; }
[ -f "$model" ] || { echo "bench_batched_vs_llamacpp: model $model is missing (scripts/fetch_model.sh)" >&2; exit 1; }

version=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
src="$root/build/llamacpp-src"
bb_build="$root/build/llamacpp-bb"
bb="$bb_build/bin/llama-batched-bench"
if [ ! -x "$bb" ]; then
  echo "bench_batched_vs_llamacpp: building llama-batched-bench from llama-cpp-python==$version ..."
  mkdir -p "$src"
  tarball="$src/llama_cpp_python-$version.tar.gz"
  if ! echo "$sha  $tarball" | sha256sum --quiet -c - >/dev/null 2>&1; then
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$src" "llama-cpp-python==$version"
    echo "$sha  $tarball" | sha256sum --quiet -c - ||
      { echo "bench_batched_vs_llamacpp: $tarball does not match the pinned sha256" >&2; exit 1; }
  fi
  tar -xzf "$tarball" -C "$src"
  cmake -S "$src/llama_cpp_python-$version/vendor/llama.cpp" -B "$bb_build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON > "$src/cmake.log"
  cmake --build "$bb_build" --target llama-batched-bench -j "$(nproc)" > "$src/build.log"
fi

work="$root/build/bench_batched_vs_llamacpp"
rm -rf "$work"
mkdir -p "$work"
max_b=$(tr ',' '\n' <<< "$batch" | sort -n | tail -1)
ctx=$(( max_b * 80 + 256 ))
# llama.cpp repacks the weights for its CPU kernels (and AMX where the CPU has it). On some
# CPUs that path crashes (a segmentation fault on an AMX-capable Xeon, llama.cpp 0.3.36's
# vendored tree): a short probe in its own process decides, and without repacking every
# round runs with --no-repack. The table says which.
repack=()
repack_note="weight repacking on"
if ! "$bb" -m "$model" -t "$threads" -tb "$threads" -c 256 -b 64 -ub 64 -npp 8 -ntg 2 -npl 2 \
    --output-format jsonl > "$work/probe.out" 2> "$work/probe.log"; then
  repack=(--no-repack)
  repack_note="weight repacking off (the probe with it failed on this CPU)"
  echo "bench_batched_vs_llamacpp: llama-batched-bench failed with weight repacking; measuring with --no-repack"
fi
for r in $(seq 1 "$rounds"); do
  run_kvscope() {
    "$kvscope" bench --batch "$batch" --threads "$threads" --model "$model" --json > "$work/kvscope.$r.json"
  }
  run_llama() {
    "$bb" -m "$model" -t "$threads" -tb "$threads" -c "$ctx" -b 2048 -ub 512 -npp 32 -ntg 32 \
      -npl "$batch" "${repack[@]}" --output-format jsonl > "$work/llama.$r.out" 2> "$work/llama.$r.log"
  }
  if [ $((r % 2)) -eq 1 ]; then run_kvscope; run_llama; else run_llama; run_kvscope; fi
  echo "round $r of $rounds done"
done

python3 - "$work" "$rounds" "$threads" "$model" "$repack_note" <<'PY'
import json, statistics, sys, os
work, rounds, threads, model, repack_note = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
kv, ll = {}, {}
for r in range(1, rounds + 1):
    for b in json.load(open(f"{work}/kvscope.{r}.json"))["batches"]:
        kv.setdefault(b["batch"], []).append(b["decode_tok_s"])
    for line in open(f"{work}/llama.{r}.out"):
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            o = json.loads(line)
            ll.setdefault(o["pl"], []).append(o["speed_tg"])
cpu = json.load(open(f"{work}/kvscope.1.json"))["cpu"]
rows = [f"model {os.path.basename(model)}, cpu {cpu}, {threads} threads, {rounds} rounds; "
        f"llama.cpp {repack_note}; aggregate decode tokens/s, best / median",
        "", "| batch | kvscope | llama.cpp | kvscope / llama.cpp (median) |", "|---|---|---|---|"]
for b in sorted(kv):
    k, l = kv[b], ll.get(b, [])
    if not l:
        rows.append(f"| {b} | {max(k):.1f} / {statistics.median(k):.1f} | (none) | |")
        continue
    rows.append(f"| {b} | {max(k):.1f} / {statistics.median(k):.1f} | {max(l):.1f} / "
                f"{statistics.median(l):.1f} | {statistics.median(k) / statistics.median(l):.2f}x |")
open(f"{work}/table.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
