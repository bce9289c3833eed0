#!/usr/bin/env bash
# device_check.sh — the checks that need a real NVIDIA GPU, in one run that prints one
# summary. Run it in the repository root of a GPU machine (CUDA toolkit, CMake and a C++
# compiler; scripts/device_stage.sh prepares the libraries and model pieces for a machine
# that has nothing else and no network).
#
#   scripts/device_check.sh [STAGE...]      (default: every stage)
#
# Stages, in order:
#   env      the GPU, its driver and the CUDA compiler
#   build    Release, CUDA on, sm_90 (KVSCOPE_CUDA_ARCH overrides), in build-gpu/; the
#            app too when KVSCOPE_DEVICE_APP=1 and its libraries are there
#   test     ctest's real-GPU and kernel labels (KVSCOPE_DEVICE_LABELS, default gpu|kernels)
#   bench    kvscope bench --backend cuda for each model present: batch 1 (prefill 512,
#            decode at depths 0, 512 and 2048, NO CACHE steps) on the paged pool and on
#            contiguous caches, then batches 1, 4, 16, 64; and the first model's batch 1
#            once more with KVSCOPE_CUDA_PDL=0: decode tokens/s with programmatic
#            dependent launch (on by default on sm_90) against without
#   parity   greedy tokens of CPU and CUDA (PDL as by default) on each shipped prompt
#            (prompts/*.txt), 64 each (KVSCOPE_PARITY_TOKENS), for each model present:
#            identical or where they split
#   profile  (only when named) Nsight Compute over a batched decode: `kvscope batch` serving
#            KVSCOPE_PROFILE_BATCH prompts (64) at once; each kernel's GPU time per decode
#            step, each step graph's GPU time, and the step's wall time without the profiler
#   capture  the app (this build's, or the one device_stage.sh --app staged in .devapp/):
#            1280x720 headless captures (3/4, TOP and the Serving view) with the CUDA
#            engine and NVIDIA's EGL; the engine's decode step while the app draws
#            (offscreen) against the CLI's; and bench-render's frame times
# KVSCOPE_DEVICE_MODELS="gemma3-270m" limits bench, parity and capture to those models.
# Before the stages, the model pieces under .devmodel/*/ are joined into assets/models/
# and checked against the pinned sha256 (scripts/fetch_model.sh with KVSCOPE_OFFLINE=1).
# Logs and the summary go to build-gpu/device-check/; when $OUT is set, the summary, the
# captures and one archive of every log (device-check-logs.tar.gz) are copied there.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=$root/build-gpu
out=$build/device-check
mkdir -p "$out"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(env build test bench parity capture)
summary=()
note() { summary+=("$1"); echo "== $1"; }
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
t_start=$(date +%s)

# Libraries staged by device_stage.sh.
if [ -d "$root/.devdeps" ]; then
  export CMAKE_PREFIX_PATH="$root/.devdeps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$root/.devdeps/include${CPATH:+:$CPATH}"
fi
export PATH="/usr/local/cuda/bin:$PATH"

# Model pieces: .devmodel/NN/NAME.part-KK, joined in KK order.
models=()
join_models() {
  local names name
  names=$(ls .devmodel/*/*.part-* 2>/dev/null | sed 's|.*/||; s|\.part-[0-9]*$||' | sort -u)
  for name in $names; do
    [ -f "assets/models/$name" ] && continue
    mkdir -p assets/models
    ls .devmodel/*/"$name".part-* | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2 |
      xargs cat > "assets/models/$name.joining"
    mv "assets/models/$name.joining" "assets/models/$name"
  done
  local m
  for m in smollm2-135m gemma3-270m; do
    if KVSCOPE_OFFLINE=1 scripts/fetch_model.sh "$m" > "$out/model-$m.log" 2>&1; then
      models+=("$m")
    else
      # A partial join (pieces still to come) is not kept.
      case $m in
        smollm2-135m) rm -f assets/models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
        gemma3-270m) rm -f assets/models/gemma-3-270m-q4_k_m.gguf ;;
      esac
    fi
  done
}
join_models
if [ -n "${KVSCOPE_DEVICE_MODELS:-}" ]; then  # only these of the models present
  keep=()
  for m in "${models[@]}"; do [[ " $KVSCOPE_DEVICE_MODELS " == *" $m "* ]] && keep+=("$m"); done
  models=("${keep[@]}")
fi
note "models: ${models[*]:-none} (sha256 checked)"

kvscope=$build/app/kvscope

if want env; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)
  cuda=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p')
  note "gpu: ${gpu:-none}; nvcc ${cuda:-missing}; $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
fi

if want build; then
  t0=$(date +%s)
  gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  app=OFF
  [ "${KVSCOPE_DEVICE_APP:-0}" = 1 ] && app=ON
  if cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${KVSCOPE_CUDA_ARCH:-90}" -DKVSCOPE_APP=$app \
      > "$out/configure.log" 2>&1 &&
    targets=() &&
    if [ -z "${KVSCOPE_DEVICE_APP:-}" ] && [ -f "$build/build.ninja" ]; then
      # kvscope and the binaries behind the gpu and kernels labels (tests/kernels) only.
      mapfile -t targets < <(ninja -C "$build" -t targets all |
        sed -n 's/^\(test_kernel_[A-Za-z0-9_]*\|test_cuda_backend[A-Za-z0-9_]*\|test_backend_ops[A-Za-z0-9_]*\): phony$/\1/p')
      targets=(--target kvscope "${targets[@]}")
    fi &&
    cmake --build "$build" -j "$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1; then
    note "build: ok in $(( $(date +%s) - t0 )) s (Release, sm_${KVSCOPE_CUDA_ARCH:-90}, app $app)"
  else
    note "build: FAILED (see build.log / configure.log)"
    tail -n 40 "$out/configure.log" "$out/build.log"
  fi
fi

if want test && [ -d "$build" ]; then
  labels=${KVSCOPE_DEVICE_LABELS:-gpu|kernels}
  ctest --test-dir "$build" -L "$labels" -j "$(nproc)" --output-on-failure --timeout 300 \
    > "$out/ctest.log" 2>&1
  line=$(grep -E "tests passed|tests failed" "$out/ctest.log" | tail -n 1)
  skipped=$(grep -c "\*\*\*Skipped" "$out/ctest.log")
  note "ctest -L '$labels': ${line:-no summary} ($skipped skipped)"
  grep -E "\*\*\*Failed|\*\*\*Skipped|\*\*\*Timeout|\*\*\*Exception" "$out/ctest.log" | head -n 20 |
    while read -r l; do note "  $l"; done
fi

if want bench && [ -x "$kvscope" ]; then
  for m in "${models[@]}"; do
    if "$kvscope" bench --backend cuda --model "$m" > "$out/bench-$m.txt" 2>&1; then
      note "bench $m (cuda, batch 1):"
      while read -r l; do note "  $l"; done < <(grep -E "prefill|decode|NO CACHE|step" "$out/bench-$m.txt")
    else
      note "bench $m: FAILED: $(tail -n 3 "$out/bench-$m.txt" | tr '\n' ' ')"
    fi
    # The same with caches of their own: what the paged pool costs on the GPU.
    if "$kvscope" bench --backend cuda --model "$m" --kv-layout contiguous > "$out/bench-contig-$m.txt" 2>&1; then
      note "bench $m (cuda, batch 1, contiguous caches):"
      while read -r l; do note "  $l"; done < <(grep -E "prefill|decode" "$out/bench-contig-$m.txt")
    else
      note "bench $m contiguous: FAILED: $(tail -n 3 "$out/bench-contig-$m.txt" | tr '\n' ' ')"
    fi
    if "$kvscope" bench --backend cuda --model "$m" --batch 1,4,16,64 > "$out/bench-batch-$m.txt" 2>&1; then
      note "bench $m (cuda, batched):"
      while read -r l; do note "  $l"; done < <(grep -E "batch +[0-9]+:" "$out/bench-batch-$m.txt")
    else
      note "bench $m batched: FAILED: $(tail -n 3 "$out/bench-batch-$m.txt" | tr '\n' ' ')"
    fi
  done
  decode_tok_s() { sed -n 's/^ *decode .*after *\([0-9]*\):.*(\([0-9.]*\) tokens\/s).*/\1 \2/p' "$1"; }
  # Programmatic dependent launch: the first model's batch-1 bench again with it off. The
  # backend line names the state ("PDL on" / "PDL off"; nothing below sm_90).
  if [ ${#models[@]} -gt 0 ]; then
    m=${models[0]}
    if KVSCOPE_CUDA_PDL=0 "$kvscope" bench --backend cuda --model "$m" > "$out/bench-nopdl-$m.txt" 2>&1; then
      on_backend=$(sed -n 's/^backend *\(.*\)  (kv.*/\1/p' "$out/bench-$m.txt" | head -n 1)
      off_backend=$(sed -n 's/^backend *\(.*\)  (kv.*/\1/p' "$out/bench-nopdl-$m.txt" | head -n 1)
      note "bench $m decode tokens/s, PDL on vs off (batch 1, paged; $on_backend / $off_backend):"
      while read -r depth on off; do
        note "  after $depth: $on vs $off"
      done < <(paste -d ' ' <(decode_tok_s "$out/bench-$m.txt") \
                 <(decode_tok_s "$out/bench-nopdl-$m.txt" | cut -d ' ' -f 2))
    else
      note "bench $m with KVSCOPE_CUDA_PDL=0: FAILED: $(tail -n 3 "$out/bench-nopdl-$m.txt" | tr '\n' ' ')"
    fi
  fi
fi

if want parity && [ -x "$kvscope" ]; then
  n=${KVSCOPE_PARITY_TOKENS:-64}
  for m in "${models[@]}"; do
    for p in prompts/*.txt; do
      base=$(basename "$p" .txt)
      for b in cpu cuda; do
        env -u KVSCOPE_CUDA_PDL "$kvscope" generate --model "$m" --prompt-file "$p" --max-tokens "$n" --temp 0 --json \
          --backend $b > "$out/parity-$m-$base-$b.jsonl" 2> "$out/parity-$m-$base-$b.err"
      done
      if grep -q "no chat template" "$out/parity-$m-$base-cpu.err"; then
        note "parity $m $base: not run (a chat prompt; this base model has no chat template)"
        continue
      fi
      verdict=$(python3 - "$out/parity-$m-$base-cpu.jsonl" "$out/parity-$m-$base-cuda.jsonl" <<'PY'
import json, sys
def ids(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            o = json.loads(line)
            if "token_id" in o:
                out.append(o["token_id"])
    return out
a, b = ids(sys.argv[1]), ids(sys.argv[2])
if not a or not b:
    print(f"FAILED: cpu gave {len(a)} tokens, cuda {len(b)}")
elif a == b:
    print(f"identical ({len(a)} tokens)")
else:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"DIFFER from token {k} (cpu {a[k] if k < len(a) else '-'}, cuda {b[k] if k < len(b) else '-'}; {len(a)}/{len(b)} tokens)")
PY
)
      note "parity $m $base: $verdict"
    done
  done
fi

if want profile && [ -x "$kvscope" ] && [ ${#models[@]} -gt 0 ]; then
  # Where a batched decode step's time goes: Nsight Compute over `kvscope batch` serving
  # B prompts at once (KVSCOPE_PROFILE_BATCH, default 64) that all fit one prefill step,
  # then a few decode steps of B rows each (caches and clocks left as they are). Per
  # kernel: launches and GPU time; then each step's whole graph as one result, against
  # the step's wall time (`batch --json`, the same run without the profiler).
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  B=${KVSCOPE_PROFILE_BATCH:-64}
  m=${models[0]}
  pf=$out/profile-prompts.txt
  for i in $(seq 1 "$B"); do echo "Once upon a time, in a town with $i bridges, there lived"; done > "$pf"
  # No --min-tokens: holding back end tokens keeps every row on the host's sampling path.
  # These prompts run all 6 tokens greedily without it (5 decode steps of B rows).
  args=(batch --backend cuda --model "$m" --prompts-file "$pf" --max-tokens 6 --temp 0
        --max-seqs "$B" --max-batch-tokens 4096 --json)
  "$kvscope" "${args[@]}" > "$out/profile-batch.jsonl" 2> "$out/profile-batch.err"
  wall=$(python3 - "$out/profile-batch.jsonl" "$B" <<'PY' 2>&1
import json, sys
ms = [o["ms"] for o in map(json.loads, filter(str.strip, open(sys.argv[1])))
      if "ms" in o and len(o.get("sequences", [])) == int(sys.argv[2])
      and not any(s.get("is_prompt") for s in o["sequences"])]
print("%d decode steps of %s rows, median %.2f ms wall" % (len(ms), sys.argv[2], sorted(ms)[len(ms) // 2])
      if ms else "no decode step of that size")
PY
)
  note "profile $m, batch $B (kvscope batch): $wall"
  if [ -z "$ncu" ]; then
    note "profile: no ncu on this machine"
  else
    # node: each kernel of every step; graph: each replayed step graph as one result.
    for mode in node graph; do
      timeout 300 "$ncu" --cache-control none --clock-control none --graph-profiling "$mode" \
        --metrics gpu__time_duration.sum --csv --log-file "$out/ncu-batch-$mode.csv" \
        "$kvscope" "${args[@]}" > /dev/null 2> "$out/ncu-batch-$mode.err"
      note "profile batch $B, ncu --graph-profiling $mode (GPU time per name):"
      while read -r l; do note "  $l"; done < <(python3 - "$out/ncu-batch-$mode.csv" "$mode" <<'PY' 2>&1
import collections, csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
def name(r):
    return r["Kernel Name"].replace("(anonymous namespace)::", "").split("(")[0]
def us(r):
    return float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0)
if sys.argv[2] == "graph":  # one result per replayed graph (the decode steps), eager kernels apart
    g = [us(r) for r in rows if "graph" in r["Kernel Name"].lower()]
    print(f"{len(rows)} results; {len(g)} graphs: " + ", ".join(f"{x:.1f}" for x in g) + " us")
    sys.exit()
# Steps begin at the embed kernel; the decode steps are those after the first (prefill).
steps = []
for r in rows:
    if "embed" in name(r) or not steps:
        steps.append([])
    steps[-1].append(r)
print(f"{len(rows)} kernels in {len(steps)} steps: " +
      ", ".join(f"{len(s)} kernels {sum(map(us, s)):.0f} us" for s in steps))
dec = steps[1:]
if not dec:
    sys.exit()
by = collections.defaultdict(list)
for s in dec:
    for r in s:
        by[name(r)].append(us(r))
n = len(dec)
print(f"per decode step (mean of {n}): {sum(sum(v) for v in by.values()) / n:.1f} us")
for k, v in sorted(by.items(), key=lambda x: -sum(x[1]))[:16]:
    print(f"{len(v) / n:5.0f} x {sum(v) / len(v):8.2f} us = {sum(v) / n:8.1f} us  {k[-60:]}")
PY
)
    done
  fi
fi

if want capture; then
  # The app: this build's kvscope when it has the app, else the one device_stage.sh --app
  # staged in .devapp/ with the libraries it loads.
  appexe=
  if [ -x "$kvscope" ] && "$kvscope" --help 2>/dev/null | grep -q -- "--screenshot"; then
    appexe=$kvscope
  elif [ -x .devapp/kvscope ]; then
    appexe=$root/.devapp/kvscope
    export LD_LIBRARY_PATH="$root/.devapp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -f .devapp/DejaVuSans.ttf ] && export KVSCOPE_FONT=$root/.devapp/DejaVuSans.ttf
  fi
  # NVIDIA's EGL through glvnd, where the driver's vendor file is not in the usual place.
  nv_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -f "$nv_egl" ] &&
    export __EGL_VENDOR_LIBRARY_FILENAMES=$nv_egl
  if [ -n "$appexe" ] && [ ${#models[@]} -gt 0 ]; then
    mpath=assets/models/SmolLM2-135M-Instruct.Q4_1.gguf
    [ "${models[0]}" = gemma3-270m ] && mpath=assets/models/gemma-3-270m-q4_k_m.gguf
    for cam in 3/4 top; do
      f=$(echo "$cam" | tr / -)
      if "$appexe" --backend cuda --model "$mpath" --prompt-file prompts/01_narrative.txt \
          --screenshot "$out/capture-$f.png" --steps 24 --camera "$cam" --size 1280x720 \
          > "$out/capture-$f.log" 2>&1; then
        note "capture $cam: capture-$f.png ($(grep -v '^$' "$out/capture-$f.log" | tail -n 2 | tr '\n' ' '))"
      else
        note "capture $cam: FAILED: $(tail -n 3 "$out/capture-$f.log" | tr '\n' ' ')"
      fi
    done
    # The Serving view: several requests from one pool of KV blocks, on the CUDA engine.
    if "$appexe" --backend cuda --model "$mpath" --view serving --requests 8 \
        --screenshot "$out/capture-serving.png" --steps 24 --size 1280x720 \
        > "$out/capture-serving.log" 2>&1; then
      note "capture serving: capture-serving.png ($(grep -v '^$' "$out/capture-serving.log" | tail -n 1))"
    else
      note "capture serving: FAILED: $(tail -n 3 "$out/capture-serving.log" | tr '\n' ' ')"
    fi
    # The engine's decode step inside the app while it draws (offscreen at 1280x720, frames
    # paced as the window paces them) against `kvscope generate` on the same prompt, same
    # binary: the median decode step of each (the prefill step left out), twice in turn.
    n=${KVSCOPE_MEASURE_STEPS:-256}
    for round in 1 2; do
      cli_ms=$("$appexe" generate --backend cuda --model "$mpath" --prompt-file prompts/01_narrative.txt \
          --max-tokens $((n + 1)) --temp 0 --json 2> "$out/measure-cli.err" | python3 -c '
import json, sys
ms = sorted(o["ms"] for o in map(json.loads, filter(str.strip, sys.stdin)) if "ms" in o and o.get("step", 0) >= 2)
print("%.3f" % ms[len(ms) // 2] if ms else "none")')
      app_line=$("$appexe" --backend cuda --model "$mpath" --prompt-file prompts/01_narrative.txt \
          --screenshot "$out/capture-measure.png" --measure "$n" --size 1280x720 2> "$out/measure-app.err" |
        grep '"measure"')
      verdict=$(python3 -c '
import json, sys
cli, line = sys.argv[1], sys.argv[2]
if cli == "none" or not line:
    print("FAILED: no figures (see measure-cli.err, measure-app.err)")
else:
    a = json.loads(line)
    print("CLI %s ms, app %.3f ms (%.2fx), %d frames at %.1f/s, %.2f ms of frame work each"
          % (cli, a["engine_ms_median"], a["engine_ms_median"] / float(cli), a["frames"],
             a["frames_per_s"], a["frame_work_ms_mean"]))' "$cli_ms" "$app_line")
      note "decode step while the app draws, round $round ($n steps): $verdict"
    done
    if "$appexe" bench-render --size 1280x720 --frames 300 > "$out/bench-render.txt" 2>&1; then
      note "bench-render (1280x720, GPU renderer):"
      while read -r l; do note "  $l"; done < <(grep -v '^$' "$out/bench-render.txt" | head -n 12)
    else
      note "bench-render: FAILED: $(tail -n 3 "$out/bench-render.txt" | tr '\n' ' ')"
    fi
  else
    note "capture: not run (no app: build with KVSCOPE_DEVICE_APP=1 or stage .devapp with device_stage.sh --app; or no model)"
  fi
fi

echo
echo "==== device_check summary ($(( $(date +%s) - t_start )) s) ===="
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  # The summary, the captures and one archive of every log (at most 8 files come back).
  ls "$out"/summary.txt "$out"/capture-*.png 2>/dev/null | head -n 7 | xargs -r cp -t "$OUT"
  tar -czf "$OUT/device-check-logs.tar.gz" -C "$out" --exclude='*.png' . 2>/dev/null
fi
