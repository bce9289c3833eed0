#!/usr/bin/env bash
# bench_vs_llamacpp.sh — kvscope against llama.cpp on the same GGUF file and thread
# counts, measured interleaved in one run, reported as best, median and ratio.
#
#   scripts/bench_vs_llamacpp.sh [--rounds N] [--threads 1,2] [--model PATH] [--json FILE]
#                                [--baseline KVSCOPE] [--isa avx2|avx512]
#
# llama.cpp comes from PyPI: llama-cpp-python==0.3.36 (the version the golden data were
# made with), built from source (native CPU flags) into a venv at build/llamacpp-venv the
# first time (about ten minutes; needs python3-venv and a C++ compiler). Set
# KVSCOPE_LLAMACPP_PYTHON to a python that already has that version to skip the venv.
# --isa avx2|avx512 compares one instruction set on both sides: kvscope runs with
# KVSCOPE_CPU_ISA set to it, and llama.cpp is built for it alone (GGML_NATIVE off; for
# avx2: AVX2, FMA, F16C, BMI2 and no AVX-512 or AVX-VNNI; for avx512: those plus AVX-512
# F/BW/DQ/VL, and VBMI, VNNI and BF16 where the CPU has them) into
# build/llamacpp-venv-<isa>. The run stops if the
# llama.cpp it loads reports an AVX-512 feature on for avx2. The CPU must have the ISA.
# kvscope must be built first (scripts/build.sh; KVSCOPE_BIN names another executable
# to measure). --baseline names a second kvscope executable (say, a build of the
# previous commit) measured in the same rounds, so a change's before and after ratios
# come from one run.
#
# Each round runs `kvscope bench --json` and the same measures through llama.cpp's C API
# (via the Python bindings, with no Python work inside the timed calls), alternating
# which goes first; every figure is then the best and the median over the rounds, and
# the ratio is kvscope / llama.cpp (above 1: kvscope faster). Measures, as kvscope bench:
#   pp512          one 512-token batch into an empty cache, best of 3 (tokens/s)
#   tg128          128 single-token decode calls from an empty cache (tokens/s)
#   decode@512     the same after a 512-token prefill; decode@2048 after 2,048
# and each side's tg128 as a share of the memory floor: kvscope bench's measured read
# speed (same thread count, the best of many passes over a buffer the size of the weight
# bytes one decode step reads, which a large last-level cache may partly hold, as it
# holds the weights) over those bytes (decode_floor_tok_s in its JSON; median over the
# rounds), beside the read of 512 MiB, past the caches, and kvscope's tg128 as a share of
# the ceiling its products' instructions put on decode (decode_ceiling_tok_s: a step's
# products timed with every weight in cache),
# plus kvscope's NO CACHE step at 64, 128, 256 and 512 tokens (ms). Both use an f16 KV
# cache. llama.cpp's CPU "extra buffer types" (AMX and repacked weights) are used when a
# probe shows they work on this CPU, and left off otherwise; the table says which.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3
threads="1,$(nproc)"
model="$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"
json_out=""
baseline=""
isa=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --json) json_out=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "bench_vs_llamacpp: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_vs_llamacpp: --rounds must be a positive integer, got '$rounds'" >&2; exit 1; }
[[ "$threads" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "bench_vs_llamacpp: --threads must be like 1,2, got '$threads'" >&2; exit 1; }
kvscope="${KVSCOPE_BIN:-$root/build/app/kvscope}"
[ -x "$kvscope" ] || { echo "bench_vs_llamacpp: $kvscope is missing: build kvscope first (scripts/build.sh)" >&2; exit 1; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "bench_vs_llamacpp: --baseline $baseline is not an executable" >&2; exit 1; }
[ -f "$model" ] || { echo "bench_vs_llamacpp: model $model is missing (scripts/fetch_model.sh)" >&2; exit 1; }
case "$isa" in
  "") cmake_args="" ;;
  avx2) cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF" ;;
  avx512)
    # AVX-512 F/BW/DQ/VL, and of VBMI, VNNI and BF16 those this CPU has (Intel's Skylake
    # and Cascade Lake servers have no VBMI or BF16; a build with them would not run here).
    has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
    cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)" ;;
  *) echo "bench_vs_llamacpp: --isa must be avx2 or avx512, got '$isa'" >&2; exit 1 ;;
esac
if [ -n "$isa" ]; then
  export KVSCOPE_CPU_ISA=$isa
  grep -qw "${isa/avx512/avx512f}" /proc/cpuinfo || { echo "bench_vs_llamacpp: this CPU has no $isa" >&2; exit 1; }
fi

version=0.3.36
venv="$root/build/llamacpp-venv${isa:+-$isa}"
py="${KVSCOPE_LLAMACPP_PYTHON:-$venv/bin/python}"
have_llama() { "$1" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; }
if ! have_llama "$py"; then
  if [ -n "${KVSCOPE_LLAMACPP_PYTHON:-}" ]; then
    echo "bench_vs_llamacpp: $py has no llama_cpp $version" >&2
    exit 1
  fi
  echo "bench_vs_llamacpp: building llama-cpp-python==$version into $venv (about ten minutes) ..."
  python3 -m venv "$venv" || { echo "bench_vs_llamacpp: python3 -m venv failed: install python3-venv" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # No wheel cache: a wheel built earlier for other flags must not stand in for this one.
  CMAKE_ARGS="$cmake_args" "$venv/bin/python" -m pip install --quiet --no-cache-dir \
    --no-binary llama-cpp-python "llama-cpp-python==$version"
  have_llama "$py" || { echo "bench_vs_llamacpp: llama-cpp-python $version did not install" >&2; exit 1; }
fi

# Raw results of every round stay in build/bench_vs_llamacpp/ (kvscope JSON, llama.cpp
# JSON lines, llama.cpp's log) next to the summary table (table.md).
work="$root/build/bench_vs_llamacpp"
rm -rf "$work"
mkdir -p "$work"

# The llama.cpp side: the same measures as kvscope bench, one thread count per process.
cat > "$work/llama_bench.py" <<'PY'
import ctypes, json, sys, time
import llama_cpp as L

TEXT = (b"Once upon a time, in a small kingdom by the sea, there lived a clockmaker who could "
        b"mend anything but his own heart. Every morning he opened his shop, wound the great "
        b"clock in the square, and listened to the town wake up around him. ")
PREFILL, DECODE, DEPTHS = 512, 128, (0, 512, 2048)

@L.llama_log_callback
def quiet(level, text, user_data):
    pass

def main():
    path, threads, extra, probe = sys.argv[1].encode(), int(sys.argv[2]), sys.argv[3] == "1", len(sys.argv) > 4
    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = extra
    model = L.llama_model_load_from_file(path, mp)
    if not model:
        sys.exit("llama.cpp could not load the model")
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 4096)()
    n = L.llama_tokenize(vocab, TEXT, len(TEXT), buf, 4096, False, False)
    tokens = list(buf[:n])
    while len(tokens) < DEPTHS[-1] + DECODE:
        tokens += tokens[:n]
    cp = L.llama_context_default_params()
    cp.n_ctx = DEPTHS[-1] + DECODE + 64
    cp.n_batch = cp.n_ubatch = PREFILL
    cp.n_threads = cp.n_threads_batch = threads
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)

    def decode(toks):
        for i in range(0, len(toks), PREFILL):
            part = toks[i:i + PREFILL]
            arr = (L.llama_token * len(part))(*part)
            if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(part))) != 0:
                sys.exit("llama_decode failed")
        L.llama_synchronize(ctx)

    if sys.argv[4:] == ["info"]:  # the instruction sets this llama.cpp was built with
        print(L.llama_print_system_info().decode()); return
    if probe:  # a small batch and one token: crashes here if the extra buffers do not work
        decode(tokens[:16]); decode(tokens[16:17])
        print("ok"); return
    decode(tokens[:PREFILL])  # warm up
    best = 1e30
    for _ in range(3):
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter(); decode(tokens[:PREFILL]); best = min(best, time.perf_counter() - t0)
    out = {"threads": threads, "prefill_tok_s": PREFILL / best, "decode_tok_s": {}}
    for depth in DEPTHS:
        L.llama_memory_clear(mem, True)
        if depth:
            decode(tokens[:depth])
        t0 = time.perf_counter()
        for g in range(DECODE):
            decode(tokens[depth + g:depth + g + 1])
        out["decode_tok_s"][str(depth)] = DECODE / (time.perf_counter() - t0)
    print(json.dumps(out))

main()
PY

# The instruction sets the llama.cpp build uses (its system info line).
llama_isa=$("$py" "$work/llama_bench.py" "$model" 1 0 info 2>/dev/null | tail -1)
if [ "$isa" = avx2 ] && grep -Eq "AVX512[A-Z_]* = 1" <<< "$llama_isa"; then
  echo "bench_vs_llamacpp: the llama.cpp in $venv uses AVX-512 ($llama_isa): rebuild it for avx2" >&2
  exit 1
fi

# Extra buffer types: on when a probe in a separate process survives them.
extra=0
if ( "$py" "$work/llama_bench.py" "$model" 1 1 probe ) >/dev/null 2>&1; then extra=1; fi

IFS=, read -ra counts <<< "$threads"
echo "bench_vs_llamacpp: $rounds rounds, threads $threads, model $(basename "$model"), isa ${isa:-best}, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "llama.cpp: $llama_isa"
for r in $(seq 1 "$rounds"); do
  run_kvscope() {
    "$kvscope" bench --json --threads "$threads" --model "$model" > "$work/kv_$r.json"
    [ -z "$baseline" ] || "$baseline" bench --json --threads "$threads" --model "$model" > "$work/base_$r.json"
  }
  run_llama() {
    for t in "${counts[@]}"; do
      "$py" "$work/llama_bench.py" "$model" "$t" "$extra" 2>> "$work/llama.log"
    done > "$work/ll_$r.jsonl" || { echo "bench_vs_llamacpp: llama.cpp run failed:" >&2; tail -5 "$work/llama.log" >&2; exit 1; }
  }
  if [ $((r % 2)) -eq 1 ]; then run_kvscope; run_llama; else run_llama; run_kvscope; fi
  echo "  round $r done (load $(cut -d' ' -f1-3 /proc/loadavg))"
done

"$py" - "$work" "$rounds" "$extra" "$json_out" "$baseline" "${isa:-best}" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$work/table.md"
import json, os, statistics, sys
work, rounds, extra, json_out, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5]
isa, load = sys.argv[6], sys.argv[7]
kv, base, ll = {}, {}, {}  # (threads, measure) -> [values]
depth = {}  # threads -> [(decode@2048 / tg128, its memory-speed bound, read GB/s)] per round
floor = {}  # threads -> [(read GB/s, weight MB, floor tok/s, 512 MiB GB/s, ceiling tok/s)] per round

def read_kvscope(path, into):
    doc = json.load(open(path))
    for run in doc["runs"]:
        t = run["threads"]
        into.setdefault((t, "pp512"), []).append(run["prefill_tok_s"])
        for d, v in run["decode_tok_s"].items():
            into.setdefault((t, "tg128" if d == "0" else f"decode@{d}"), []).append(v)
        for n, ms in run["nocache_step_ms"].items():
            into.setdefault((t, f"nocache {n}"), []).append(ms)
        if into is kv and "decode_floor_tok_s" in run:
            floor.setdefault(t, []).append((run["memory_read_gb_s"], run["decode_weight_mb"],
                                            run["decode_floor_tok_s"],
                                            run.get("memory_read_512mib_gb_s", 0),
                                            run.get("decode_ceiling_tok_s", 0)))
        if into is kv and "memory_read_gb_s" in run:
            d = run["decode_tok_s"]
            depth.setdefault(t, []).append((d["2048"] / d["0"], run["decode_depth_bound"]["2048"],
                                            run["memory_read_gb_s"]))
    return doc

for r in range(1, rounds + 1):
    doc = read_kvscope(os.path.join(work, f"kv_{r}.json"), kv)
    if baseline:
        read_kvscope(os.path.join(work, f"base_{r}.json"), base)
    for line in open(os.path.join(work, f"ll_{r}.jsonl")):
        run = json.loads(line)
        t = run["threads"]
        ll.setdefault((t, "pp512"), []).append(run["prefill_tok_s"])
        for d, v in run["decode_tok_s"].items():
            ll.setdefault((t, "tg128" if d == "0" else f"decode@{d}"), []).append(v)
print(f"\nkvscope: {doc['runs'][0]['backend']} on {doc['cpu']}; llama.cpp: llama-cpp-python "
      f"{__import__('llama_cpp').__version__}, extra buffer types {'on' if extra else 'off (they fail on this CPU)'}; "
      f"isa {isa}; load at the end {load}")
print("tokens/s (NO CACHE: ms), best and median of", rounds, "rounds; ratio = kvscope / llama.cpp")
if baseline:
    print(f"baseline: {baseline}, measured in the same rounds; its ratios in the last columns")
print()
head = "| threads | measure | kvscope best | kvscope median | llama.cpp best | llama.cpp median | ratio (best) | ratio (median) |"
rule = "|---|---|---|---|---|---|---|---|"
if baseline:
    head += " baseline median | baseline ratio (median) | kvscope / baseline (median) |"
    rule += "---|---|---|"
print(head)
print(rule)
rows = []
order = ["pp512", "tg128", "decode@512", "decode@2048", "nocache 64", "nocache 128", "nocache 256", "nocache 512"]
for t in sorted({k[0] for k in kv}):
    for m in order:
        if (t, m) not in kv:
            continue
        a = kv[(t, m)]
        lower_better = m.startswith("nocache")
        kb, km = (min(a) if lower_better else max(a)), statistics.median(a)
        row = {"threads": t, "measure": m, "kvscope_best": kb, "kvscope_median": km}
        if (t, m) in ll:
            b = ll[(t, m)]
            lb, lm = max(b), statistics.median(b)
            row.update(llama_best=lb, llama_median=lm, ratio_best=kb / lb, ratio_median=km / lm)
            line = f"| {t} | {m} | {kb:.1f} | {km:.1f} | {lb:.1f} | {lm:.1f} | {kb / lb:.2f}x | {km / lm:.2f}x |"
        else:
            line = f"| {t} | {m} (ms) | {kb:.1f} | {km:.1f} | | | | |"
        if baseline and (t, m) in base:
            bm = statistics.median(base[(t, m)])
            speedup = bm / km if lower_better else km / bm  # above 1: kvscope faster
            row.update(baseline_median=bm, speedup_over_baseline=speedup)
            line += f" {bm:.1f} | {(f'{bm / lm:.2f}x') if (t, m) in ll else ''} | {speedup:.2f}x |"
        print(line)
        rows.append(row)
if depth:
    print("\ndecode after 2,048 tokens / decode from an empty cache (median of rounds); the bound")
    print("is the ratio if the K/V rows the deeper step adds came at the memory read speed that")
    print("kvscope bench measures with the same threads (see app/cli/bench.cpp):\n")
    print("| threads | kvscope | llama.cpp | bound at memory speed | memory read |")
    print("|---|---|---|---|---|")
    for t in sorted(depth):
        v = depth[t]
        lr = ""
        if (t, "decode@2048") in ll and (t, "tg128") in ll:
            lr = f"{statistics.median(ll[(t, 'decode@2048')]) / statistics.median(ll[(t, 'tg128')]):.2f}x"
        print(f"| {t} | {statistics.median(x[0] for x in v):.2f}x | {lr} | "
              f"{statistics.median(x[1] for x in v):.2f}x | {statistics.median(x[2] for x in v):.1f} GB/s |")
        rows.append({"threads": t, "measure": "decode@2048 / tg128",
                     "kvscope_median": statistics.median(x[0] for x in v),
                     "bound_median": statistics.median(x[1] for x in v),
                     "memory_read_gb_s_median": statistics.median(x[2] for x in v)})
if floor:
    print("\ndecode tg128 as a share of the memory floor: the speed at which kvscope bench's")
    print("threads read a buffer of a decode step's weight bytes, pass after pass, over those")
    print("bytes; and the read of 512 MiB, past the caches; the ceiling that kvscope's products")
    print("put on its decode with every weight in cache (kvscope bench: 'ceiling'), and its share")
    print("of that; medians of rounds\n")
    print("| threads | read of the weights' size | 512 MiB read | weights per step | floor | kvscope tg128 | share | llama.cpp tg128 | share | kvscope ceiling | kvscope share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in sorted(floor):
        v = floor[t]
        gb, mb, fl, big, ce = (statistics.median(x[i] for x in v) for i in range(5))
        k = statistics.median(kv[(t, "tg128")])
        line = (f"| {t} | {gb:.1f} GB/s | {big:.1f} GB/s | {mb:.1f} MB | {fl:.1f} tok/s | {k:.1f} | "
                f"{100 * k / fl:.0f}% |")
        row = {"threads": t, "measure": "tg128 / floor", "memory_read_gb_s_median": gb,
               "memory_read_512mib_gb_s_median": big,
               "decode_weight_mb": mb, "floor_tok_s_median": fl, "kvscope_share": k / fl}
        if (t, "tg128") in ll:
            l = statistics.median(ll[(t, "tg128")])
            line += f" {l:.1f} | {100 * l / fl:.0f}% |"
            row["llama_share"] = l / fl
        else:
            line += " | |"
        if ce > 0:
            line += f" {ce:.1f} tok/s | {100 * k / ce:.0f}% |"
            row.update(ceiling_tok_s_median=ce, kvscope_ceiling_share=k / ce)
        else:
            line += " | |"
        print(line)
        rows.append(row)
if json_out:
    json.dump({"rounds": rounds, "extra_buffer_types": extra, "baseline": baseline, "isa": isa,
               "load": load, "rows": rows},
              open(json_out, "w"), indent=1)
PY
