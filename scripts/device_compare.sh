#!/usr/bin/env bash
# device_compare.sh — a change's effect on GPU speed, measured against the code before it on
# the same GPU in the same run (GPU machines differ, and so do runs on one).
#
#   here:        scripts/device_compare.sh --stage REV     (writes .devbase/base.tar.gz)
#   on the GPU:  scripts/device_compare.sh [build|bench|profile]...   (default: all three)
#
# --stage packs REV's tracked files (git archive) into the ignored folder .devbase/, to
# travel with the working tree to a GPU machine that has no git history. There:
#   build    REV's kvscope into build-base/: Release, CUDA on, sm_90 (KVSCOPE_CUDA_ARCH
#            overrides), with the libraries that scripts/device_stage.sh staged in .devdeps/.
#            The change's is scripts/device_check.sh's build (build-gpu/); the two can
#            build at once.
#   bench    `kvscope bench --backend cuda` of each model present, base and change in turn,
#            twice (KVSCOPE_COMPARE_ROUNDS), and the change's decode tokens/s over the
#            base's per depth and round; then the same for batched decode (`--batch`,
#            KVSCOPE_COMPARE_BATCHES, default 1,16,64), aggregate tokens/s per batch size
#   profile  the GPU time of each kernel of a short greedy generation (Nsight Compute,
#            caches and clocks left as they are), base and change: where a step's time goes
# Output goes to build-gpu/device-compare/ (and, when $OUT is set, its summary and logs
# there as well).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "${1:-}" = --stage ]; then
  rev=${2:?--stage needs a revision}
  mkdir -p .devbase
  git archive --format=tar.gz -o .devbase/base.tar.gz "$rev" || exit 1
  git rev-parse --short "$rev" > .devbase/REV
  echo ".devbase: $(cat .devbase/REV), $(du -h .devbase/base.tar.gz | cut -f1)"
  exit 0
fi

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build bench profile)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
out=$root/build-gpu/device-compare
mkdir -p "$out"
summary=()
note() { summary+=("$1"); echo "== $1"; }
[ -f .devbase/base.tar.gz ] || { echo "device_compare: no .devbase/base.tar.gz (run --stage REV here first)" >&2; exit 1; }
base_rev=$(cat .devbase/REV 2>/dev/null || echo base)
base_src=$root/build-base/src
if [ -d "$root/.devdeps" ]; then
  export CMAKE_PREFIX_PATH="$root/.devdeps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$root/.devdeps/include${CPATH:+:$CPATH}"
fi
export PATH="/usr/local/cuda/bin:$PATH"

build_tree() {  # source dir, build dir, log
  local gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  cmake -S "$1" -B "$2" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${KVSCOPE_CUDA_ARCH:-90}" -DKVSCOPE_APP=OFF -DKVSCOPE_TESTS=OFF \
    > "$3" 2>&1 && cmake --build "$2" -j "$(nproc)" --target kvscope >> "$3" 2>&1
}

if want build; then
  t0=$(date +%s)
  rm -rf "$base_src" && mkdir -p "$base_src" && tar -xzf .devbase/base.tar.gz -C "$base_src"
  if build_tree "$base_src" "$root/build-base" "$out/build-base.log"; then
    note "build: base $base_rev ok in $(( $(date +%s) - t0 )) s"
  else
    note "build: base $base_rev FAILED (see build-base.log)"
    tail -n 30 "$out/build-base.log"
  fi
fi

change=$root/build-gpu/app/kvscope
base=$root/build-base/app/kvscope
models=()
[ -f assets/models/SmolLM2-135M-Instruct.Q4_1.gguf ] && models+=(smollm2-135m)
[ -f assets/models/gemma-3-270m-q4_k_m.gguf ] && models+=(gemma3-270m)
[ -n "${KVSCOPE_DEVICE_MODELS:-}" ] && read -r -a models <<< "$KVSCOPE_DEVICE_MODELS"
model_path() {  # both builds read the working tree's model files
  case "$1" in
    gemma3-270m) echo "$root/assets/models/gemma-3-270m-q4_k_m.gguf" ;;
    *) echo "$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  esac
}

if want bench && [ -x "$change" ] && [ -x "$base" ]; then
  rounds=${KVSCOPE_COMPARE_ROUNDS:-2}
  tok_s() { sed -n 's/^ *decode .*after *\([0-9]*\):.*(\([0-9.]*\) tokens\/s).*/\1 \2/p' "$1"; }
  for m in "${models[@]}"; do
    for r in $(seq 1 "$rounds"); do
      "$base" bench --backend cuda --model "$(model_path "$m")" > "$out/bench-base-$m-$r.txt" 2>&1
      "$change" bench --backend cuda --model "$(model_path "$m")" > "$out/bench-change-$m-$r.txt" 2>&1
      note "bench $m round $r: prefill 512 base $(sed -n 's/.*prefill.*(\([0-9.]*\) tokens\/s).*/\1/p' "$out/bench-base-$m-$r.txt") vs change $(sed -n 's/.*prefill.*(\([0-9.]*\) tokens\/s).*/\1/p' "$out/bench-change-$m-$r.txt") tokens/s"
      while read -r depth b c; do
        note "  decode after $depth: base $b, change $c tokens/s ($(python3 -c "print('%.2fx' % ($c / $b))" 2>/dev/null))"
      done < <(paste -d ' ' <(tok_s "$out/bench-base-$m-$r.txt") <(tok_s "$out/bench-change-$m-$r.txt" | cut -d ' ' -f 2))
      # Batched decode (KVSCOPE_COMPARE_BATCHES, default 1,16,64): aggregate tokens/s.
      batches=${KVSCOPE_COMPARE_BATCHES:-1,16,64}
      "$base" bench --backend cuda --model "$(model_path "$m")" --batch "$batches" > "$out/batch-base-$m-$r.txt" 2>&1
      "$change" bench --backend cuda --model "$(model_path "$m")" --batch "$batches" > "$out/batch-change-$m-$r.txt" 2>&1
      batch_tok_s() { sed -n 's/^ *batch *\([0-9]*\): *\([0-9.]*\) tokens\/s.*/\1 \2/p' "$1"; }
      while read -r n b c; do
        note "  batch $n: base $b, change $c tokens/s ($(python3 -c "print('%.2fx' % ($c / $b))" 2>/dev/null))"
      done < <(paste -d ' ' <(batch_tok_s "$out/batch-base-$m-$r.txt") <(batch_tok_s "$out/batch-change-$m-$r.txt" | cut -d ' ' -f 2))
    done
  done
fi

if want profile && [ -x "$change" ] && [ ${#models[@]} -gt 0 ]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  m=${models[0]}
  for side in base change; do
    exe=$change
    [ $side = base ] && exe=$base
    [ -x "$exe" ] || continue
    if [ -z "$ncu" ]; then note "profile: no ncu on this machine"; break; fi
    # 1 prompt step + 8 decode steps; each kernel's duration with the caches and clocks as
    # they are (the defaults flush the caches and lock the clocks before each kernel).
    timeout 240 "$ncu" --cache-control none --clock-control none --metrics gpu__time_duration.sum \
      --csv --log-file "$out/ncu-$side.csv" "$exe" generate --backend cuda --model "$(model_path "$m")" \
      --prompt-file prompts/01_narrative.txt --max-tokens 9 --temp 0 > /dev/null 2> "$out/ncu-$side.err"
    note "profile $side ($m, GPU time per kernel over 8 decode steps and the prompt step):"
    while read -r l; do note "  $l"; done < <(python3 - "$out/ncu-$side.csv" <<'PY'
import collections, csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
by = collections.defaultdict(lambda: [0, 0.0])
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
for r in rows:
    name = r["Kernel Name"].split("(")[0].replace("(anonymous namespace)::", "")
    by[name][0] += 1
    by[name][1] += float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0)
total = sum(t for _, t in by.values())
print(f"{len(rows)} kernels, {total:.1f} us in all")
for name, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])[:14]:
    print(f"{n:5d} x {t / n:8.2f} us = {t:9.1f} us  {name[-60:]}")
PY
)
  done
fi

printf '%s\n' "${summary[@]}" > "$out/summary.txt"
echo
echo "==== device_compare summary ===="
cat "$out/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$out/summary.txt" "$OUT/compare-summary.txt"
  tar -czf "$OUT/device-compare-logs.tar.gz" -C "$out" . 2>/dev/null
fi
