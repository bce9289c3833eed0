#!/usr/bin/env bash
# serving_cli.sh KVSCOPE OUTDIR — the Serving view's command line:
#   - `kvscope --view serving --screenshot OUT --steps 12` serves 12 steps on the model,
#     writes a PNG of the default size and prints the "serving step 12:" line;
#   - a Serving view option with the single view is refused in one line;
#   - a draft model (--speculative draft:PATH) that does not exist is refused in one line;
#   - `--view serving --replay` of a missing file is refused in one line.
# Refusals: exit status 1, exactly one stderr line starting with "kvscope:", nothing on
# stdout. Runs with no display server (EGL).
set -u
kvscope=$1
dir=$2/serving_cli
mkdir -p "$dir"
failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}
run() { env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" "$@" >"$dir/out" 2>"$dir/err"; }

# A screenshot of 12 steps.
out=$dir/serving.png
rm -f "$out"
run --view serving --screenshot "$out" --steps 12 --backend cpu
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "serving screenshot: exit $rc"
  cat "$dir/err"
elif [ ! -s "$out" ] || [ "$(od -An -tx1 -N8 "$out" | tr -d ' \n')" != "89504e470d0a1a0a" ]; then
  fail "serving screenshot: $out is not a PNG"
elif [ "$(od -An -tu1 -j16 -N8 "$out" | tr -s ' ' | sed 's/^ //')" != "0 0 5 0 0 0 2 208" ]; then
  fail "serving screenshot: not 1280x720"
elif ! grep -q '^kvscope: serving step 12: ' "$dir/out"; then
  fail "serving screenshot: no 'kvscope: serving step 12:' line"
  cat "$dir/out"
else
  grep '^kvscope: serving step' "$dir/out"
fi

refused() {  # name, the whole expected line, args...
  local name=$1 want=$2
  shift 2
  run "$@"
  local rc=$? lines
  lines=$(wc -l <"$dir/err")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [ -s "$dir/out" ] ||
     ! grep -q "^kvscope: " "$dir/err" || ! grep -qF -- "$want" "$dir/err"; then
    fail "$name (exit $rc, $lines stderr lines, want '$want')"
    sed 's/^/  stderr: /' "$dir/err"
    sed 's/^/  stdout: /' "$dir/out" | head -3
  else
    echo "ok: $name: $(cat "$dir/err")"
  fi
}
refused "--max-seqs with the single view" "kvscope: --max-seqs: only with --view serving" \
  --max-seqs 4 --screenshot "$dir/x.png"
[ -e "$dir/x.png" ] && fail "--max-seqs with the single view wrote $dir/x.png"
refused "--beams with the single view" "kvscope: --beams: only with --view serving" \
  --beams 4 --screenshot "$dir/x.png"
refused "--beams with samples" "kvscope: --beams: beam search draws no samples" \
  --view serving --beams 4 --n 2 --screenshot "$dir/x.png"
refused "--length-penalty without beams" "kvscope: --length-penalty: it scores beams" \
  --view serving --length-penalty 0.5 --screenshot "$dir/x.png"
[ -e "$dir/x.png" ] && fail "a refused beam option wrote $dir/x.png"
refused "a draft model file that does not exist" "kvscope: draft: model file not found" \
  --view serving --speculative draft:"$dir/missing.gguf" --screenshot "$dir/x.png"
[ -e "$dir/x.png" ] && fail "a missing draft model wrote $dir/x.png"
refused "--view serving --replay of a missing file" "$dir/missing.kvs" \
  --view serving --replay "$dir/missing.kvs" --screenshot "$dir/y.png"
[ -e "$dir/y.png" ] && fail "--replay of a missing file wrote $dir/y.png"

if [ "$failures" -ne 0 ]; then
  echo "serving_cli: $failures failed"
  exit 1
fi
echo "serving_cli: all passed"
