#!/usr/bin/env bash
# all_options.sh KVSCOPE — every option of the app and of every subcommand, given a bad
# value (out of range, malformed, or missing), is refused with exactly one line on stderr
# that starts with "kvscope:" and names the option, nothing on stdout, exit status 1; a
# bad value of an option that several commands share gives the same line from each (one
# bound, one message). The options come from the commands themselves
# (`kvscope [COMMAND] --list-options`): one with no bad value in the table below fails the
# test. Runs with no display: the app must refuse before it opens a window, a GL context
# or a model, so each run gets a few seconds.
set -u
kvscope=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'some text\n' > "$dir/text.txt"

# The bad value of each option. MISSING: the option is given last, without its value.
# =WORD: a flag given a value it cannot take (--json=maybe).
declare -A bad=(
  [--threads]=-1 [--model]=MISSING [--backend]=metal [--mode]=fast [--max-tokens]=-1
  [--temp]=-1 [--top-k]=-1 [--top-p]=1.5 [--min-p]=2 [--seed]=-1 [--stop]=MISSING
  [--prompt]=MISSING [--prompt-file]=MISSING [--chat]==maybe [--json]==maybe
  [--progress]==maybe [--file]=MISSING [--out]=MISSING [--csv]=MISSING [--attention]=f8
  [--kv-type]=q5 [--kv-type-k]=q5 [--kv-type-v]=q5 [--ctx]=-1 [--ctx-full]=wrap
  [--n-keep]=-1 [--kv-sink]=-1 [--kv-window]=-1 [--kv-keep]=some
  [--samples]=65 [--layers]=0 [--frames]=0 [--size]=1280x720junk [--passes]==maybe
  [--screenshot]=MISSING [--replay]=MISSING [--steps]=0 [--camera]=sideways
  [--layer]=4096 [--head]=xyz [--all-layers]==maybe [--no-sink]==maybe
  [--scene-only]==maybe [--highlight]=-1 [--compare-modes]==maybe
  [--compare-interleaved]==maybe [--view-step]=0 [--sections]=MISSING [--speed]=31
  [--look-at]=-1 [--anim-time]=61 [--kv-error]==maybe [--cache-quality]=0 [--play]==maybe
  [--window-shot]=MISSING [--measure]=0 [--ui-nice]=20
  [--prompts-file]=MISSING [--prompts-dir]=MISSING [--arrival]=sometimes
  [--kv-pool-mib]=0 [--max-seqs]=0 [--max-batch-tokens]=0 [--no-prefix-cache]==maybe
  [--batch]=0 [--repeat-penalty]=0 [--repeat-last-n]=-2 [--frequency-penalty]=3
  [--presence-penalty]=-3 [--no-repeat-ngram]=65 [--logit-bias]=7 [--stop-id]=-1
  [--min-tokens]=-1 [--kv-block]=12 [--n]=0 [--speculative]=lookahead [--draft-max]=0
  [--beams]=0 [--length-penalty]=11 [--kv-layout]=striped
  [--serving]=16by1000 [--view]=sideways [--record]=MISSING [--requests]=-1 [--kv-pool-blocks]=0 [--no-shared-prefix]==maybe
  [--host]=MISSING [--port]=70000 [--max-queue]=0 [--max-body-kib]=0 [--shutdown-grace]=-1
)
for o in ctx ctx-full n-keep kv-sink kv-window kv-keep kv-block kv-type kv-type-k kv-type-v; do
  bad[--ref-$o]=${bad[--$o]}
done
# A shared option whose line may differ in one command, and why.
declare -A differs=(
  ["perplexity --max-tokens"]="0 means the whole text there, and it has no upper bound"
)

# What each command needs besides the option under test (so the option is what fails).
declare -A base=(
  [app]="" [generate]="--prompt hi" [record]="--out $dir/r.kvs --prompt hi"
  [compare]="--prompt hi" [perplexity]="--file $dir/text.txt" [bench]="" [bench-render]=""
  [export]="$dir/none.kvs" [batch]="--prompts-file $dir/text.txt" [serve]=""
)
commands=(generate record compare perplexity bench export batch)
if "$kvscope" serve --list-options >/dev/null 2>&1; then
  commands+=(serve)
else
  echo "note: built without serve (cpp-httplib); serve is not checked"
fi
if env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" --list-options >/dev/null 2>&1; then
  commands=(app "${commands[@]}" bench-render)
else
  echo "note: built without the app; the app and bench-render are not checked"
fi

failures=0
passed=0
declare -A line_of=()  # "command option" -> the error line, "(see ...)" removed
declare -A counts=()
for cmd in "${commands[@]}"; do
  sub=()
  [ "$cmd" != app ] && sub=("$cmd")
  if ! env -u DISPLAY -u WAYLAND_DISPLAY timeout 10 "$kvscope" "${sub[@]}" --list-options \
      >"$dir/opts" 2>"$dir/err" || [ -s "$dir/err" ] || [ ! -s "$dir/opts" ]; then
    echo "FAIL: $cmd --list-options"
    failures=$((failures + 1))
    continue
  fi
  # --help: the help on stdout, nothing on stderr, exit 0.
  if env -u DISPLAY -u WAYLAND_DISPLAY timeout 10 "$kvscope" "${sub[@]}" --help \
      >"$dir/out" 2>"$dir/err" && [ -s "$dir/out" ] && [ ! -s "$dir/err" ]; then
    passed=$((passed + 1))
  else
    echo "FAIL: $cmd --help"
    failures=$((failures + 1))
  fi
  n=0
  while read -r opt; do
    case $opt in --*) ;; *) continue ;; esac  # positional arguments (export's run file)
    if [ -z "${bad[$opt]+x}" ]; then
      echo "FAIL: $cmd $opt has no bad value in all_options.sh"
      failures=$((failures + 1))
      continue
    fi
    read -r -a args <<<"${base[$cmd]}"
    # Leave out the base's own value of the option under test (record --out, ...).
    kept=()
    for ((i = 0; i < ${#args[@]}; ++i)); do
      if [ "${args[$i]}" = "$opt" ]; then ((++i)); else kept+=("${args[$i]}"); fi
    done
    v=${bad[$opt]}
    case $v in
      MISSING) run=("${kept[@]}" "$opt") ;;
      =*) run=("${kept[@]}" "$opt$v") ;;
      *) run=("$opt" "$v" "${kept[@]}") ;;
    esac
    start=$(date +%s%N)
    env -u DISPLAY -u WAYLAND_DISPLAY timeout 10 "$kvscope" "${sub[@]}" "${run[@]}" \
      >"$dir/out" 2>"$dir/err"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    lines=$(wc -l <"$dir/err")
    if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [ -s "$dir/out" ] ||
       ! grep -q '^kvscope: ' "$dir/err" || ! grep -q -- "$opt" "$dir/err" ||
       { [ "$cmd" = app ] && [ "$ms" -gt 3000 ]; }; then
      echo "FAIL: $cmd ${run[*]} (exit $rc, $lines stderr lines, ${ms} ms)"
      sed 's/^/  stderr: /' "$dir/err" | head -3
      sed 's/^/  stdout: /' "$dir/out" | head -3
      failures=$((failures + 1))
      continue
    fi
    passed=$((passed + 1))
    n=$((n + 1))
    line=$(sed 's/ (see kvscope[a-z -]* --help)$//' "$dir/err")
    line_of["$cmd $opt"]=$line
    echo "ok:   $cmd $opt $v -> $line"
  done <"$dir/opts"
  counts[$cmd]=$n
done

# One bound, one message: the same bad value gives the same line in every command.
declare -A first=()
for key in "${!line_of[@]}"; do
  opt=${key#* }
  [ -n "${differs[$key]+x}" ] && continue
  if [ -z "${first[$opt]+x}" ]; then
    first[$opt]=$key
  elif [ "${line_of[$key]}" != "${line_of[${first[$opt]}]}" ]; then
    echo "FAIL: $opt: '${line_of[$key]}' ($key) differs from '${line_of[${first[$opt]}]}' (${first[$opt]})"
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
done

for cmd in "${commands[@]}"; do echo "options checked: $cmd ${counts[$cmd]:-0}"; done
echo "all_options: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
