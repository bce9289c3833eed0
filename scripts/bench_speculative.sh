#!/usr/bin/env bash
# bench_speculative.sh — speculative decoding against plain decoding on the same prompts,
# measured in one run with the order alternating.
#
#   scripts/bench_speculative.sh [--rounds N] [--threads T] [--max-tokens N] [--model PATH]
#                                [--drafters "ngram early-exit:10 draft:PATH"] [--temp T]
#
# For each prompt (the shipped ones under prompts/ and a code prompt that repeats its
# identifiers) and each drafter, `kvscope generate --json` runs plainly and with
# `--speculative D --draft-max 4`, greedy unless --temp is given. Reported per pair:
#   acceptance   accepted / drafted tokens;
#   mean kept    draft tokens kept per verification;
#   tok/fwd      generated tokens per target forward (plain decoding: 1);
#   speedup      plain wall time / speculative wall time (median over rounds; below 1:
#                speculation is slower), wall time = the sum of the steps' `ms` after the
#                first (the prompt's prefill is the same in both);
#   same         whether the tokens equal plain decoding's (greedy: they must).
# kvscope must be built first (scripts/build.sh; KVSCOPE_BIN names another executable).
# Raw results stay in build/bench_speculative/ next to the table (table.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3
threads=$(nproc)
max_tokens=128
model="$root/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"
drafters="ngram early-exit:10 draft:$model"
temp=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --max-tokens) max_tokens=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --drafters) drafters=$2; shift 2 ;;
    --temp) temp=$2; shift 2 ;;
    *) echo "bench_speculative.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bin=${KVSCOPE_BIN:-$root/build/app/kvscope}
[ -x "$bin" ] || { echo "bench_speculative.sh: $bin not built (scripts/build.sh)" >&2; exit 1; }
out="$root/build/bench_speculative"
mkdir -p "$out"
code="$out/code_prompt.txt"
cat > "$code" <<'EOF'
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    if n < 2:
        return 1
    return n * factorial(n - 1)


def
EOF
prompts=("$root"/prompts/*.txt "$code")
common=(--model "$model" --threads "$threads" --max-tokens "$max_tokens" --temp "$temp" --json)
for p in "${prompts[@]}"; do
  name=$(basename "$p" .txt)
  for r in $(seq 1 "$rounds"); do
    for d in plain $drafters; do
      tag=$(echo "$d" | tr ':/' '__')
      args=()
      [ "$d" != plain ] && args=(--speculative "$d" --draft-max 4)
      "$bin" generate --prompt-file "$p" "${common[@]}" "${args[@]}" > "$out/$name.$tag.$r.jsonl"
    done
  done
done
python3 - "$out" "$rounds" "$drafters" "${prompts[@]}" <<'EOF' | tee "$out/table.md"
import json, os, statistics, sys
out, rounds, drafters = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
prompts = [os.path.basename(p)[:-4] for p in sys.argv[4:]]
def load(path):
    steps, done = [], {}
    for line in open(path):
        j = json.loads(line)
        if 'step' in j: steps.append(j)
        if 'done' in j: done = j
    return steps, done
print("| prompt | drafter | acceptance | mean kept | tok/fwd | speedup | same |")
print("|---|---|---|---|---|---|---|")
for p in prompts:
    plain_ms, plain_ids = [], None
    for r in range(1, rounds + 1):
        s, _ = load(f"{out}/{p}.plain.{r}.jsonl")
        plain_ms.append(sum(x['ms'] for x in s[1:]))
        plain_ids = [x['token_id'] for x in s]
    for d in drafters:
        tag = d.replace(':', '_').replace('/', '_')
        ms, st, ids = [], {}, None
        for r in range(1, rounds + 1):
            s, done = load(f"{out}/{p}.{tag}.{r}.jsonl")
            ms.append(sum(x['ms'] for x in s[1:]))
            st, ids = done, [x['token_id'] for x in s]
        drafted, kept, fwd = st.get('drafted', 0), st.get('accepted', 0), st.get('verify_forwards', 0)
        gen = len(ids)
        # Target forwards: the prefill, each verification and each plain decode step.
        plain_steps = sum(1 for x in load(f"{out}/{p}.{tag}.{rounds}.jsonl")[0][1:]
                          if x['tokens_processed'] > 0 and 'accepted' not in x)
        forwards = 1 + fwd + plain_steps
        print(f"| {p} | {d.split('/')[-1]} | {kept}/{drafted} = {kept / max(drafted, 1):.2f} | "
              f"{kept / max(fwd, 1):.2f} | {gen / forwards:.2f} | "
              f"{statistics.median(plain_ms) / statistics.median(ms):.2f}x | "
              f"{'yes' if ids == plain_ids else 'no'} |")
EOF
