#!/usr/bin/env bash
# kv_options.sh KVSCOPE MAKE_BAD_MODELS — the KV cache options of generate, record, compare,
# perplexity and bench: every bad value gives exactly one line on stderr starting with "kvscope:"
# that names the option, nothing on stdout, exit status 1; and the good paths run
# (compare of identical configurations reports KL 0 and full agreement).
set -u
kvscope=$1
make_bad=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_bad" "$dir" || { echo "FAIL: could not build the tiny model"; exit 1; }
tiny="$dir/tiny.gguf"  # context 256
printf 'abc\xff\xfedef' > "$dir/invalid.txt"
printf 'The quick brown fox jumps over the lazy dog. ' > "$dir/text.txt"
for i in $(seq 1 6); do cat "$dir/text.txt" "$dir/text.txt" > "$dir/t2" && mv "$dir/t2" "$dir/text.txt"; done

failures=0
passed=0
check() {  # name, expected substring, args...
  local name=$1 want=$2
  shift 2
  "$kvscope" "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$dir/err")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [ -s "$dir/out" ] ||
     ! grep -q '^kvscope: ' "$dir/err" || ! grep -qi -- "$want" "$dir/err"; then
    echo "FAIL: $name (exit $rc, $lines stderr lines, want '$want')"
    sed 's/^/  stderr: /' "$dir/err"
    sed 's/^/  stdout: /' "$dir/out" | head -3
    failures=$((failures + 1))
  else
    echo "ok:   $name -> $(cat "$dir/err")"
    passed=$((passed + 1))
  fi
}
m=(--model "$tiny" --backend cpu --threads 1)
check "unknown cache type (generate)" "--kv-type: unknown cache type 'q5_0'" generate --prompt hi --kv-type q5_0 "${m[@]}"
check "unknown cache type (compare)" "--kv-type: unknown cache type" compare --prompt hi --kv-type F16 "${m[@]}"
check "unknown V type" "--kv-type-v: unknown cache type 'half'" generate --prompt hi --kv-type-v half "${m[@]}"
check "q8_0 on 16-dim heads" "q8_0 stores blocks of 32 values along the head dimension, but this model's heads have 16 dims" generate --prompt hi --kv-type-k q8_0 "${m[@]}"
check "unknown reference type" "--ref-kv-type: unknown cache type" compare --prompt hi --ref-kv-type int8 "${m[@]}"
check "unknown cache type (perplexity)" "unknown cache type" perplexity --file "$dir/text.txt" --kv-type fp8 "${m[@]}"
check "context past the trained one" "ctx: context size 1000 is outside \[2, 256\]" generate --prompt hi --ctx 1000 "${m[@]}"
check "negative context" "--ctx: -5 is outside 0..16777216" generate --prompt hi --ctx -5 "${m[@]}"
check "prompt past a small context" "context holds 4" generate --prompt "the tin can" --ctx 4 "${m[@]}"
check "window larger than the context" "kv-window: window 300 is larger than the context (256)" generate --prompt hi --kv-window 300 "${m[@]}"
check "window larger than a set context" "window 100 is larger than the context (64)" compare --prompt hi --ctx 64 --kv-window 100 "${m[@]}"
check "sink at the context" "kv-sink: sink 64 is not below the context (64)" perplexity --file "$dir/text.txt" --ctx 64 --kv-window 32 --kv-sink 64 "${m[@]}"
check "sink without a window" "need a window" generate --prompt hi --kv-sink 4 "${m[@]}"
check "negative window" "--kv-window: -1 is outside 0..16777216" generate --prompt hi --kv-window -1 "${m[@]}"
check "reference context too small" "reference's context" compare --prompt hi --ref-ctx 16 --max-tokens 64 "${m[@]}"
check "unknown --kv-keep value" "--kv-keep: unknown value 'some' (choose window or full)" generate --prompt hi --kv-keep some "${m[@]}"
check "unknown context policy" "--ctx-full: unknown policy 'wrap' (choose stop or shift)" generate --prompt hi --ctx-full wrap "${m[@]}"
check "n-keep without a shift" "n-keep: 4 only applies to a context shift" generate --prompt hi --n-keep 4 "${m[@]}"
check "n-keep filling the context" "n-keep: keeping 63 of a 64-position context leaves nothing to shift" generate --prompt hi --ctx 64 --ctx-full shift --n-keep 63 "${m[@]}"
check "shift with a window" "ctx-full: a context shift and a sink + window" generate --prompt hi --ctx-full shift --kv-window 16 "${m[@]}"
check "missing text file" "cannot read the text file" perplexity --file "$dir/none.txt" "${m[@]}"
check "invalid UTF-8 text" "UTF-8" perplexity --file "$dir/invalid.txt" "${m[@]}"

# One parser for the cache types: a bad --kv-type-k is the same one line from every
# subcommand that takes it, and record writes no run file.
same=()
for cmd in "generate --prompt hi" "record --prompt hi --out $dir/bad.kvs" "bench" \
           "compare --prompt hi" "perplexity --file $dir/text.txt"; do
  read -r -a args <<<"$cmd"
  check "bad --kv-type-k (${args[0]})" "--kv-type-k: unknown cache type 'q3' (choose " \
    "${args[@]}" --kv-type-k q3 "${m[@]}"
  same+=("$(cat "$dir/err")")
done
if [ -e "$dir/bad.kvs" ]; then
  echo "FAIL: record wrote a run file despite a bad --kv-type-k"
  failures=$((failures + 1))
fi
if [ "$(printf '%s\n' "${same[@]}" | sort -u | wc -l)" -eq 1 ]; then
  echo "ok:   the bad --kv-type-k line is the same from all ${#same[@]} subcommands"
  passed=$((passed + 1))
else
  echo "FAIL: the bad --kv-type-k line differs between subcommands:"
  printf '  %s\n' "${same[@]}"
  failures=$((failures + 1))
fi

# Good paths.
good() {  # name, grep pattern for stdout, args...
  local name=$1 want=$2
  shift 2
  if "$kvscope" "$@" >"$dir/out" 2>"$dir/err" && grep -q -- "$want" "$dir/out"; then
    echo "ok:   $name"
    passed=$((passed + 1))
  else
    echo "FAIL: $name (want '$want')"
    sed 's/^/  stderr: /' "$dir/err"
    tail -3 "$dir/out" | sed 's/^/  stdout: /'
    failures=$((failures + 1))
  fi
}
good "compare identical configurations" '"mean_kl":0,"max_kl":0,"top1_agreement":1,"max_attn_diff":0' \
  compare --prompt "the tin" --max-tokens 8 --json "${m[@]}"
good "compare f32 against f16" '"steps":8' compare --prompt "the tin" --max-tokens 8 --kv-type f32 --json "${m[@]}"
good "K and V types apart" '"candidate":"kv k=f32,v=f16' compare --prompt "the tin" --max-tokens 2 --kv-type-k f32 --json "${m[@]}"
good "sink + window" '"config":"kv f16, ctx 256, sink 4 + window 16"' perplexity --file "$dir/text.txt" --max-tokens 60 --kv-window 16 --kv-sink 4 --json "${m[@]}"
good "perplexity in chunks" '"chunks":3' perplexity --file "$dir/text.txt" --max-tokens 100 --ctx 40 --json "${m[@]}"
# The model's own windows (tiny gemma3: window 5 on layers 0 and 1, layer 2 global), in
# blocks of 8 positions: by default a windowed layer gives back each block no later query
# can see; with --kv-keep full every layer holds all of them, and the greedy tokens are
# the same (the window still masks).
g=(--model "$dir/gemma3.gguf" --backend cpu --threads 1 --prompt "the tin can" --max-tokens 24 --temp 0 --json --kv-block 8)
if "$kvscope" generate "${g[@]}" >"$dir/win" 2>"$dir/err" &&
   "$kvscope" generate "${g[@]}" --kv-keep full >"$dir/full" 2>>"$dir/err"; then
  # Last step: seq_len n, so n - 1 positions went through; bytes per position per layer
  # P = 2 (K, V) x 1 kv head x 24 x 2 B. A windowed layer holds the blocks from the one
  # holding position n - 5 (the oldest key the next query sees) on.
  last_win=$(grep '"step":24,' "$dir/win")
  last_full=$(grep '"step":24,' "$dir/full")
  n=$(sed -E 's/.*"seq_len":([0-9]+).*/\1/' <<<"$last_win")
  p=96
  all=$(( (n - 1 + 7) / 8 ))
  win=$(( all - (n - 5) / 8 ))
  want_win="\"kv_bytes\":$(( (2 * win + all) * 8 * p )),"
  want_full="\"kv_bytes\":$(( 3 * all * 8 * p )),"
  if [ "$win" -lt "$all" ] && grep -qF "$want_win" <<<"$last_win" &&
     grep -qF "$want_full" <<<"$last_full" &&
     grep -qF "\"window\":5,\"held\":[[$(( (n - 5) / 8 * 8 ))," <<<"$last_win" &&
     [ "$(tail -1 "$dir/win")" = "$(tail -1 "$dir/full")" ]; then
    echo "ok:   --kv-keep window gives back blocks outside the window of 5, full holds all, same tokens"
    passed=$((passed + 1))
  else
    echo "FAIL: --kv-keep (want $want_win / $want_full and the same final line)"
    echo "$last_win" | head -c 600; echo
    echo "$last_full" | head -c 600; echo
    tail -1 "$dir/win" "$dir/full"
    failures=$((failures + 1))
  fi
else
  echo "FAIL: generate on the tiny gemma3 model"; cat "$dir/err"
  failures=$((failures + 1))
fi
check "n-keep on windowed layers" "n-keep: this model's windowed layers keep only their last 5 positions" generate --model "$dir/gemma3.gguf" --backend cpu --threads 1 --prompt hi --ctx 64 --ctx-full shift --n-keep 2
good "generate past a shifted context" '"stop_reason":"max_tokens","tokens":40' generate --prompt "the tin" --ctx 16 --ctx-full shift --n-keep 2 --max-tokens 40 --json "${m[@]}"
good "perplexity through shifts" '"config":"kv f16, ctx 32, shift keeping 4".*"chunks":1' perplexity --file "$dir/text.txt" --max-tokens 100 --ctx 32 --ctx-full shift --n-keep 4 --json "${m[@]}"
good "compare a shifted candidate" '"steps":30' compare --prompt "the tin" --max-tokens 30 --ctx 16 --ctx-full shift --json "${m[@]}"
# record sets up its session as generate does: with the same options the run file's steps
# (exported as CSV) have generate's tokens and KV bytes; step 1 holds the 4 prompt positions
# in one block of 16, of 2 layers x 32 values (Hkv 2 x D 16) in 4-byte K and 2-byte V.
r=(--prompt "the tin" --max-tokens 8 --kv-type-k f32 "${m[@]}")
if "$kvscope" record --out "$dir/run.kvs" "${r[@]}" >"$dir/out" 2>"$dir/err" &&
   grep -q '^kvscope: recorded 8 steps (max_tokens)' "$dir/out" &&
   "$kvscope" export "$dir/run.kvs" --csv "$dir/run.csv" 2>>"$dir/err" &&
   "$kvscope" generate --json "${r[@]}" >"$dir/gen" 2>>"$dir/err"; then
  rec=$(tail -n +2 "$dir/run.csv" | awk -F, '{print $1, $3, $12}')
  gen=$(grep '"step":' "$dir/gen" |
        sed -E 's/.*"step":([0-9]+),.*"token_id":([0-9]+),.*"kv_bytes":([0-9]+),.*/\1 \2 \3/')
  if [ "$(wc -l <<<"$rec")" -eq 8 ] && [ "$rec" = "$gen" ] &&
     [ "$(sed -n 1p <<<"$rec")" = "1 $(sed -n 1p <<<"$gen" | cut -d' ' -f2) $(( 16 * 2 * 32 * (4 + 2) ))" ]; then
    echo "ok:   record with --kv-type-k f32 has generate's 8 tokens and KV bytes"
    passed=$((passed + 1))
  else
    echo "FAIL: record and generate differ (step token kv_bytes):"
    paste <(echo "$rec") <(echo "$gen") | sed 's/^/  /'
    failures=$((failures + 1))
  fi
else
  echo "FAIL: record / export / generate on the tiny model"
  cat "$dir/err" "$dir/out"
  failures=$((failures + 1))
fi
echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
