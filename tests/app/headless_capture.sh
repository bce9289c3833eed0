#!/bin/sh
# headless_capture.sh KVSCOPE OUTDIR — `kvscope --screenshot` with no display server at all
# (DISPLAY and WAYLAND_DISPLAY unset, no Xvfb): it must render through EGL, exit 0 and
# write a PNG of the requested size that shows the app (tests/app/png_content.py: panels
# with text, the run's coloured scene). Then a screenshot with the Cache quality section
# (--cache-quality): a q4_0 cache against f16 must report a mean KL above 0.
set -eu
kvscope=$1
out=$2/headless_capture.png
rm -f "$out"
env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" --screenshot "$out" --steps 3 --size 640x400 \
  --backend cpu --camera top
[ -s "$out" ] || { echo "headless_capture: $out was not written" >&2; exit 1; }
# PNG signature, then the IHDR chunk's width and height (big-endian) at bytes 16..23.
sig=$(od -An -tx1 -N8 "$out" | tr -d ' \n')
[ "$sig" = "89504e470d0a1a0a" ] || { echo "headless_capture: not a PNG ($sig)" >&2; exit 1; }
size=$(od -An -tu1 -j16 -N8 "$out" | tr -s ' ' | sed 's/^ //')
[ "$size" = "0 0 2 128 0 0 1 144" ] || { echo "headless_capture: size bytes '$size', want 640x400" >&2; exit 1; }
# What the picture shows: panels with text, and the run's coloured scene in the 3D view.
python3 "$(dirname "$0")/png_content.py" "$out" 640 400 ||
  { echo "headless_capture: $out does not show the app" >&2; exit 1; }
echo "headless_capture: wrote $out (640x400) with no display"

# The Cache quality section's comparison, in a screenshot: q4_0 against f16.
log=$2/headless_compare.log
env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" --screenshot "$out" --steps 2 --size 640x400 \
  --backend cpu --kv-type q4_0 --cache-quality 4 >"$log"
line=$(grep '^kvscope: cache quality: ' "$log") || { echo "headless_capture: no cache quality line" >&2; cat "$log" >&2; exit 1; }
case "$line" in
  *"kv q4_0"*"4 steps, mean KL 0 nats"*) echo "headless_capture: q4_0 has KL 0: $line" >&2; exit 1 ;;
  *"kv q4_0"*"4 steps, mean KL "*) echo "headless_capture: $line" ;;
  *) echo "headless_capture: unexpected '$line'" >&2; exit 1 ;;
esac

# --measure with --screenshot: the app's frames drawn offscreen while the engine plays 6
# decode steps; one JSON line with 6 decode steps' engine times, and the last frame as a
# PNG of the requested size that shows the app.
log=$2/headless_measure.log
rm -f "$out"
env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" --screenshot "$out" --measure 6 --size 640x400 \
  --backend cpu >"$log"
line=$(grep '^{"measure": "app"' "$log") || { echo "headless_capture: no measure line" >&2; cat "$log" >&2; exit 1; }
python3 - "$line" <<'PY' || exit 1
import json, sys
m = json.loads(sys.argv[1])
if m["decode_steps"] != 6 or not m["engine_ms_median"] > 0 or m["rss_peak_mb"] <= 0:
    sys.exit("headless_capture: measure line %s" % sys.argv[1])
PY
python3 "$(dirname "$0")/png_content.py" "$out" 640 400 ||
  { echo "headless_capture: the measured run's last frame does not show the app" >&2; exit 1; }
echo "headless_capture: $line"
# ... of the single view only: with --view serving it is refused, in one line.
if msg=$(env -u DISPLAY -u WAYLAND_DISPLAY "$kvscope" --screenshot "$out" --measure 2 \
    --view serving --backend cpu 2>&1); then
  echo "headless_capture: --measure with --view serving was not refused" >&2; exit 1
fi
case "$msg" in
  *"--measure with --screenshot measures the single view"*) ;;
  *) echo "headless_capture: unexpected refusal '$msg'" >&2; exit 1 ;;
esac
