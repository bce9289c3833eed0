#!/usr/bin/env bash
# bad_input.sh KVSCOPE MAKE_BAD_MODELS — every kind of bad input gives exactly one line on
# stderr starting with "kvscope:", nothing on stdout, and exit status 1 (not a crash).
set -u
kvscope=$1
make_bad=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_bad" "$dir" || { echo "FAIL: could not build the bad model files"; exit 1; }
long="$dir/long.txt"
for i in $(seq 1 9000); do printf 'word '; done > "$long"
printf 'abc\xff\xfedef' > "$dir/invalid.txt"

failures=0
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
  fi
}
check "missing model" "not found" generate --prompt hi --model "$dir/nope.gguf"
check "corrupt model" "magic" generate --prompt hi --model "$dir/corrupt.gguf"
check "truncated model" "past the end" generate --prompt hi --model "$dir/truncated.gguf"
check "unsupported type" "Q2_K" generate --prompt hi --model "$dir/unsupported.gguf"
check "empty prompt" "empty" generate --prompt "" --model "$dir/tiny.gguf"
check "invalid UTF-8" "UTF-8" generate --prompt-file "$dir/invalid.txt" --model "$dir/tiny.gguf"
check "prompt past the context" "context" generate --prompt-file "$long" --model "$dir/tiny.gguf"
check "missing prompt file" "prompt file" generate --prompt-file "$dir/none.txt" --model "$dir/tiny.gguf"
check "no prompt" "no prompt" generate --model "$dir/tiny.gguf"
check "cuda without a GPU" "cuda" generate --prompt hi --backend cuda --model "$dir/tiny.gguf"
check "unknown model name" "built-in model name" generate --prompt hi --model no-such-model
check "chat without a template" "no chat template" generate --prompt hi --chat --model "$dir/tiny.gguf"
# And a good run on the same tiny model works.
if ! "$kvscope" generate --prompt "the tin" --max-tokens 4 --backend cpu --model "$dir/tiny.gguf" >/dev/null 2>&1; then
  echo "FAIL: a valid tiny model did not generate"
  failures=$((failures + 1))
fi
# A built-in model name finds its fetched file (fine to be absent: then it says so).
if ! out=$("$kvscope" generate --prompt "Hi" --max-tokens 2 --backend cpu --model smollm2-135m 2>&1) &&
   ! grep -q "not fetched yet" <<<"$out"; then
  echo "FAIL: --model smollm2-135m did not generate: $out"
  failures=$((failures + 1))
fi
echo "$((12 + 2 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
