#!/bin/sh
# with_display.sh CMD... — runs CMD with an X display for OpenGL tests.
# Uses $DISPLAY when it answers; otherwise starts a private Xvfb through xvfb-run.
# Without either, runs CMD as is: the GL tests then skip with a message.
if [ -n "$DISPLAY" ] && command -v xdpyinfo >/dev/null 2>&1 && xdpyinfo >/dev/null 2>&1; then
  exec "$@"
fi
if command -v xvfb-run >/dev/null 2>&1; then
  exec xvfb-run -a -s "-screen 0 1920x1080x24 -nolisten tcp" "$@"
fi
echo "with_display.sh: no X display and no xvfb-run; OpenGL tests will skip" >&2
unset DISPLAY
exec "$@"
