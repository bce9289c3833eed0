#!/usr/bin/env bash
# measure_app_speed.sh — the engine's decode step time inside the app (window drawn under
# Xvfb, playing as fast as possible) against `kvscope generate` on the same prompt, in
# alternating rounds on the same machine, reported as ratios (app / CLI) per round.
#
#   scripts/measure_app_speed.sh [BUILD_DIR] [STEPS] [ROUNDS] [extra app options...]
#
# Each side's figure is the median engine time of the decode steps (the prefill step is
# left out), as both report it per step (StepTrace::ms). Extra options go to the app only,
# e.g. `--ui-nice 0` to see the effect of the UI thread's priority.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
steps=${2:-128}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
kvscope=$build/app/kvscope
prompt=$root/prompts/01_narrative.txt
size=${KVSCOPE_MEASURE_SIZE:-1280x720}

cli_median() {
  "$kvscope" generate --prompt-file "$prompt" --max-tokens "$((steps + 1))" --backend cpu --json |
    python3 -c '
import json, sys
ms = sorted(o["ms"] for o in map(json.loads, sys.stdin) if "ms" in o and o.get("step", 0) >= 2)
print("%.3f %d" % (ms[len(ms) // 2], len(ms)))'
}

app_line() {
  xvfb-run -a -s "-screen 0 ${size}x24 -nolisten tcp" "$kvscope" --prompt-file "$prompt" \
    --backend cpu --size "$size" --measure "$steps" "$@" | grep '"measure"'
}

printf "%-6s %12s %12s %8s %10s %14s\n" round cli_ms app_ms ratio app_fps frame_work_ms
for r in $(seq 1 "$rounds"); do
  read -r cli n_cli < <(cli_median)
  line=$(app_line "$@")
  app=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["engine_ms_median"])' "$line")
  fps=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["frames_per_s"])' "$line")
  work=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["frame_work_ms_mean"])' "$line")
  ratio=$(python3 -c "print('%.3f' % ($app / $cli))")
  printf "%-6s %12s %12s %8s %10s %14s\n" "$r" "$cli" "$app" "$ratio" "$fps" "$work"
done
