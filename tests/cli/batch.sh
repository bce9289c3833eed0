#!/usr/bin/env bash
# batch.sh KVSCOPE — `kvscope batch` on the default model: every sequence finishes with
# the text that `kvscope generate` writes for the same prompt alone (greedy, every layer
# holding every position, as the pool does), --json gives one JSON object per step and a
# summary whose counts agree with the steps, prompts that share a prefix hit the prefix
# cache, parallel samples (`generate --n`, `batch --n`) fork off the prompt's blocks, and
# speculative decoding (ngram, early-exit:L) writes the plain run's text at temperature 0,
# beam search (--beams K) finds the hypotheses of `generate --beams K`,
# and bad input is one line and exit status 1.
set -u
kvscope=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

prompts=("The capital of France is" "Once upon a time, in a small village by the sea,"
         "List three colors:")
printf '%s\n' "${prompts[@]}" > "$dir/p.txt"
"$kvscope" batch --prompts-file "$dir/p.txt" --max-tokens 8 --threads 2 --arrival every:2 \
  > "$dir/out.txt" 2> "$dir/err.txt" || fail "batch exited $?: $(cat "$dir/err.txt")"
for i in 0 1 2; do
  grep -q "^\[$i\] (max_tokens, 8 tokens)" "$dir/out.txt" || fail "no text for sequence $i"
done
"$kvscope" batch --prompts-file "$dir/p.txt" --max-tokens 8 --threads 2 --arrival every:2 \
  --json > "$dir/texts.jsonl" 2> "$dir/err.txt" || fail "batch --json exited $?"
for i in 0 1 2; do
  "$kvscope" generate --prompt "${prompts[$i]}" --max-tokens 8 --threads 2 --kv-keep full \
    > "$dir/want$i.txt" || fail "generate exited $?"
  # The sequence's text: the "text" of its steps, in order.
  python3 -c '
import json, sys
i = int(sys.argv[2])
sys.stdout.write("".join(q.get("text", "") for l in open(sys.argv[1]) for q in json.loads(l).get("sequences", []) if q["seq"] == i))
' "$dir/texts.jsonl" $i > "$dir/got$i.txt"
  [ "$(cat "$dir/got$i.txt")" == "$(cat "$dir/want$i.txt")" ] ||
    fail "sequence $i wrote '$(cat "$dir/got$i.txt")', generate alone '$(cat "$dir/want$i.txt")'"
done

"$kvscope" batch --prompts-file "$dir/p.txt" --max-tokens 4 --threads 2 --json \
  > "$dir/out.jsonl" 2> "$dir/err.txt" || fail "batch --json exited $?"
python3 - "$dir/out.jsonl" <<'PY' || fail "batch --json lines"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps, summary = lines[:-1], lines[-1]
assert summary.get("summary") is True, summary
assert summary["requests"] == 3 and summary["finished"] == 3, summary
sampled = sum(1 for s in steps for q in s["sequences"] if q["token_id"] >= 0)
assert sampled == summary["decode_tokens"] == 12, (sampled, summary)
for s in steps:
    p = s["pool"]
    assert p["used"] + p["free"] + p["cached"] == p["total"], p
    for q in s["sequences"]:
        assert 0 <= q["seq"] < 3 and q["blocks"] == len(q["table"]), q
finishes = [e for s in steps for e in s["events"] if e["kind"] == "finish"]
assert sorted(e["seq"] for e in finishes) == [0, 1, 2], finishes
PY

# Four prompts with a shared 40-token start, one every 8 steps: the later ones find its
# blocks in the prefix cache.
shared="You are a helpful assistant who answers briefly and precisely. Always name the source of a fact, keep to the question, and say so when you do not know."
for q in "What is tea?" "Who wrote Hamlet?" "Why is the sky blue?" "What is two plus two?"; do
  echo "$shared $q"
done > "$dir/shared.txt"
"$kvscope" batch --prompts-file "$dir/shared.txt" --max-tokens 2 --threads 2 --json \
  --arrival every:8 > "$dir/shared.jsonl" || fail "batch with a shared prefix exited $?"
python3 - "$dir/shared.jsonl" <<'PY' || fail "prefix cache hits"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
hits = [e for s in lines[:-1] for e in s["events"] if e["kind"] == "prefix_hit"]
assert len(hits) == 3 and all(e["n"] >= 16 for e in hits), hits
assert lines[-1]["prefix_hit_tokens"] == sum(e["n"] for e in hits), lines[-1]
PY

# Parallel samples: `generate --n 3` at temperature 0 forks three samples off the prompt's
# blocks, and each is the greedy text `generate` writes alone; `batch --n 2` numbers them
# prompt.sample and the summary says what sharing saved.
"$kvscope" generate --prompt "${prompts[1]}" --max-tokens 8 --threads 2 --n 3 --json \
  > "$dir/n.json" 2> "$dir/err.txt" || fail "generate --n exited $?: $(cat "$dir/err.txt")"
"$kvscope" generate --prompt "${prompts[1]}" --max-tokens 8 --threads 2 --kv-keep full --json \
  > "$dir/g.jsonl" 2> "$dir/err.txt" || fail "generate exited $?"
python3 - "$dir/n.json" "$dir/g.jsonl" <<'PY' || fail "generate --n samples"
import json, sys
n = json.load(open(sys.argv[1]))
g = [json.loads(l) for l in open(sys.argv[2])]
want = [x["token_id"] for x in g if "token_id" in x]
assert len(n["samples"]) == 3, n
assert all(s["tokens"] == want for s in n["samples"]), (n["samples"], want)
assert n["prefill_tokens"] == n["prompt_tokens"], n  # the prompt computed once
assert n["unshared_kv_bytes"] >= n["peak_kv_bytes"], n
PY
"$kvscope" batch --prompts-file "$dir/p.txt" --max-tokens 4 --threads 2 --n 2 \
  > "$dir/n.txt" 2> "$dir/err.txt" || fail "batch --n exited $?"
for i in 0 1 2; do
  for k in 0 1; do
    grep -q "^\[$i.$k\] (max_tokens, 4 tokens)" "$dir/n.txt" || fail "batch --n: no sample $i.$k"
  done
done

# Speculative decoding (--speculative ngram, early-exit:L or draft:PATH): at temperature 0 each
# sequence writes the text of the plain run; the steps carry the drafts and the summary
# their acceptance (a prompt that repeats itself gets drafts accepted). Gemma 3's windowed
# layers roll back too.
printf '%s\n' 'def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):' \
  'The cat sat on the mat. The dog sat on the log. The cat sat on the' "${prompts[1]}" \
  > "$dir/spec.txt"
spec_texts() {  # spec_texts OUT.jsonl: each sequence's text, one JSON list
  python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
texts = {}
for s in lines[:-1]:
    for q in s["sequences"]:
        texts[q["seq"]] = texts.get(q["seq"], "") + q.get("text", "")
print(json.dumps([texts[i] for i in sorted(texts)]))
' "$1"
}
for model in default gemma3-270m; do
  margs=()
  [ "$model" != default ] && margs=(--model "$model")
  "$kvscope" batch "${margs[@]}" --prompts-file "$dir/spec.txt" --max-tokens 40 --threads 2 \
    --json > "$dir/plain.jsonl" 2> "$dir/err.txt" || fail "batch ($model) exited $?: $(cat "$dir/err.txt")"
  specs=(ngram)
  # A draft model: the default model drafting for itself (same vocabulary).
  [ "$model" == default ] && specs+=(early-exit:12 draft:smollm2-135m)
  for sp in "${specs[@]}"; do
    "$kvscope" batch "${margs[@]}" --prompts-file "$dir/spec.txt" --max-tokens 40 --threads 2 \
      --json --speculative "$sp" --draft-max 6 > "$dir/sp.jsonl" 2> "$dir/err.txt" ||
      fail "batch --speculative $sp ($model) exited $?: $(cat "$dir/err.txt")"
    [ "$(spec_texts "$dir/sp.jsonl")" == "$(spec_texts "$dir/plain.jsonl")" ] ||
      fail "batch --speculative $sp ($model) wrote $(spec_texts "$dir/sp.jsonl"), plain $(spec_texts "$dir/plain.jsonl")"
    python3 - "$dir/sp.jsonl" "$sp" "$dir/plain.jsonl" <<'PY' || fail "batch --speculative $sp ($model) --json"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps, summary = lines[:-1], lines[-1]
assert summary["speculative"] == sys.argv[2], summary
drafted = sum(q.get("drafted", 0) for s in steps for q in s["sequences"])
accepted = sum(q.get("accepted", 0) for s in steps for q in s["sequences"])
assert drafted == summary["drafted"] > 0 and accepted == summary["accepted"], (drafted, accepted, summary)
if sys.argv[2] == "ngram":
    assert accepted > 0 and summary["tokens_per_target_forward"] > 1, summary
plain = json.loads(open(sys.argv[3]).read().splitlines()[-1])
assert summary["decode_tokens"] == plain["decode_tokens"], (summary, plain)
rollbacks = sum(e["n"] for s in steps for e in s["events"] if e["kind"] == "rollback")
assert rollbacks == drafted - accepted, (rollbacks, drafted, accepted)
for s in steps:
    assert s["batch_tokens"] == sum(q["tokens"] for q in s["sequences"]), s
    for q in s["sequences"]:
        if "drafted" in q:
            assert q["tokens"] == q["drafted"] + 1 and 0 <= q["accepted"] <= q["drafted"], q
            assert len(q.get("tokens_out", [q["token_id"]])) == q["accepted"] + 1, q
PY
  done
done
"$kvscope" batch --prompts-file "$dir/spec.txt" --max-tokens 40 --threads 2 \
  --speculative ngram > "$dir/sp.txt" 2> "$dir/err.txt" || fail "batch --speculative ngram exited $?"
grep -q "^speculative ngram: .* accepted (.*%), .* tokens per target forward" "$dir/sp.txt" ||
  fail "batch --speculative: no acceptance line in '$(tail -n 2 "$dir/sp.txt")'"

# Beam search (--beams K): each prompt's hypotheses are those of `generate --beams K`,
# the engine's own beam search (checked against teacher forcing and exhaustive search),
# in the same order with the same scores, although here the beams run in one batch with
# the other prompt's.
printf '%s\n' "Once upon a time, in a small village by the sea, there lived" \
  "The capital of France is" > "$dir/beams.txt"
"$kvscope" batch --prompts-file "$dir/beams.txt" --max-tokens 16 --threads 2 --beams 4 \
  --length-penalty 0.5 --json > "$dir/beams.jsonl" 2> "$dir/err.txt" ||
  fail "batch --beams 4 exited $?: $(cat "$dir/err.txt")"
for i in 0 1; do
  "$kvscope" generate --prompt "$(sed -n "$((i + 1))p" "$dir/beams.txt")" --max-tokens 16 \
    --threads 2 --beams 4 --length-penalty 0.5 --json > "$dir/gen_beams$i.json" ||
    fail "generate --beams 4 exited $?"
  python3 - "$dir/beams.jsonl" "$i" "$dir/gen_beams$i.json" <<'PY' || fail "batch --beams 4, prompt $i"
import json, sys
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
got = summary["beams"][int(sys.argv[2])]["hypotheses"]
want = json.load(open(sys.argv[3]))["hypotheses"]
assert len(got) == len(want) == 4, (len(got), len(want))
for g, w in zip(got, want):
    assert g["tokens"] == w["tokens"], (g["tokens"], w["tokens"])
    assert abs(g["score"] - w["score"]) < 1e-3, (g["score"], w["score"])
    assert g["finished"] == w["finished"]
PY
done
"$kvscope" batch --prompts-file "$dir/beams.txt" --max-tokens 16 --threads 2 --beams 4 \
  > "$dir/beams.txt.out" 2> "$dir/err.txt" || fail "batch --beams 4 (text) exited $?"
[ "$(grep -c '^\[[01]\] beam [1-4]/4 (score ' "$dir/beams.txt.out")" -eq 8 ] ||
  fail "batch --beams 4 printed $(grep -c '^\[[01]\] beam' "$dir/beams.txt.out") hypothesis lines, not 8"

# Bad input: one line on stderr starting with "kvscope:", nothing on stdout, status 1.
expect_refusal() {
  local what=$1; shift
  "$kvscope" batch "$@" > "$dir/o" 2> "$dir/e"
  local rc=$?
  if [ $rc -ne 1 ] || [ -s "$dir/o" ] || [ "$(wc -l < "$dir/e")" -ne 1 ] ||
     ! grep -q '^kvscope:' "$dir/e"; then
    fail "$what: status $rc, stdout '$(head -c 200 "$dir/o")', stderr '$(cat "$dir/e")'"
  fi
}
: > "$dir/empty.txt"
printf 'ok prompt\n\xff\xfe broken\n' > "$dir/bad_utf8.txt"
mkdir -p "$dir/nodir"
expect_refusal "no prompts given"
expect_refusal "missing file" --prompts-file "$dir/none.txt"
expect_refusal "empty file" --prompts-file "$dir/empty.txt"
expect_refusal "empty folder" --prompts-dir "$dir/nodir"
expect_refusal "invalid UTF-8" --prompts-file "$dir/bad_utf8.txt"
expect_refusal "bad arrival" --prompts-file "$dir/p.txt" --arrival poisson:0
expect_refusal "pool too small" --prompts-file "$dir/p.txt" --kv-pool-mib 1 --max-tokens 2000
expect_refusal "a draft model that is no model" --prompts-file "$dir/p.txt" --speculative draft:"$dir/p.txt"
expect_refusal "a draft model of another vocabulary" --prompts-file "$dir/p.txt" --speculative draft:gemma3-270m
expect_refusal "early exit past the layers" --prompts-file "$dir/p.txt" --speculative early-exit:99
expect_refusal "unknown drafter" --prompts-file "$dir/p.txt" --speculative lookahead
expect_refusal "beams and samples" --prompts-file "$dir/p.txt" --beams 2 --n 2
expect_refusal "beams and speculation" --prompts-file "$dir/p.txt" --beams 2 --speculative ngram
expect_refusal "beams and penalties" --prompts-file "$dir/p.txt" --beams 2 --repeat-penalty 1.3
expect_refusal "a length penalty without beams" --prompts-file "$dir/p.txt" --length-penalty 0.5
expect_refusal "more beams than run at once" --prompts-file "$dir/p.txt" --beams 8 --max-seqs 4

# Gemma 3's windowed and global layers keep their blocks in groups of their own: batched
# decode and a pool sized in MiB must use the grouped block (a pool of whole-model blocks
# was refused by the first cache made over it).
"$kvscope" bench --model gemma3-270m --backend cpu --threads 2 --batch 1,2 > "$dir/gb.txt" 2>&1 ||
  fail "bench --batch on gemma3-270m exited $?: $(tail -n 2 "$dir/gb.txt")"
grep -q "batch   2:" "$dir/gb.txt" || fail "bench --batch on gemma3-270m printed no batch 2 line"
"$kvscope" batch --model gemma3-270m --prompts-file "$dir/p.txt" --max-tokens 2 --threads 2 \
  --kv-pool-mib 4 > "$dir/gp.txt" 2>&1 || fail "batch on gemma3-270m with --kv-pool-mib 4 exited $?: $(tail -n 2 "$dir/gp.txt")"

[ $failures -eq 0 ] && echo "batch: all checks passed"
exit $((failures > 0))
