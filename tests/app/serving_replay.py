#!/usr/bin/env python3
"""serving_replay.py KVSCOPE DIR — a recorded serving run replays as it was served.

Serves the default workload in the Serving view for 16 steps on the model, recording it
(`--record`), and captures the window at that step; then opens the recording without the
model (`--replay`) and captures its step 16, and the same for a beam search (its forked
and pruned lanes; right of the controls' column). The two captures must show the same thing:
below the toolbar (which says REPLAY in the second) at most 0.1% of the pixels may differ
by more than 8 levels (room for a rasterizer that rounds an edge differently). Also: the
recording is refused, with one line, as a single-sequence run (`--replay` without
`--view serving`), and a damaged copy is refused by the Serving view with one line naming
the file.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from png_content import decode  # noqa: E402


def run(args, expect_ok=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def same_replay(kvscope, rec, live_png, replay_png, extra, left=0):
    """Serves 16 steps recording them, replays the file, and compares the captures right
    of x = left (the left column holds the app's controls for its next run, not the
    recording's: a run with options other than the defaults shows them there live only)."""
    for f in (rec, live_png, replay_png):
        if os.path.exists(f):
            os.remove(f)
    live = run([kvscope, "--view", "serving", "--steps", "16", "--record", rec,
                "--screenshot", live_png] + extra)
    back = run([kvscope, "--view", "serving", "--replay", rec, "--steps", "16",
                "--screenshot", replay_png])
    line = [l for l in live.stdout.splitlines() if "serving step" in l]
    line2 = [l for l in back.stdout.splitlines() if "serving step" in l]
    print(line[0] if line else live.stdout)
    if not line or not line2 or line[0].split(";")[0:2] != line2[0].split(";")[0:2]:
        sys.exit(f"FAIL: the pool differs:\n  live   {line}\n  replay {line2}")
    w, h, a = decode(live_png)
    w2, h2, b = decode(replay_png)
    if (w, h) != (w2, h2):
        sys.exit(f"FAIL: sizes {w}x{h} and {w2}x{h2}")
    top = 41  # the toolbar (40 points at scale 1) and its border
    differ = sum(1 for y in range(top, h) for x in range(left, w)
                 if max(abs(a[y][x][c] - b[y][x][c]) for c in range(3)) > 8)
    share = differ / float((w - left) * (h - top))
    print(f"pixels differing below the toolbar: {differ} ({100 * share:.3f}%)")
    if share > 0.001:
        sys.exit(f"FAIL: the replayed capture differs from the live one ({' '.join(extra)})")


def main():
    kvscope, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rec = os.path.join(out, "serving-replay.kvs")
    live_png = os.path.join(out, "serving-live.png")
    replay_png = os.path.join(out, "serving-replayed.png")
    same_replay(kvscope, rec, live_png, replay_png, [])
    # A beam search: its forked and pruned lanes come back too.
    same_replay(kvscope, os.path.join(out, "serving-beams.kvs"),
                os.path.join(out, "beams-live.png"), os.path.join(out, "beams-replayed.png"),
                ["--beams", "4", "--requests", "2", "--no-shared-prefix", "--arrival", "all"],
                left=310)

    single = run([kvscope, "--replay", rec, "--screenshot", os.path.join(out, "x.png")], False)
    err = single.stderr.strip().splitlines()
    if single.returncode != 1 or len(err) != 1 or "--view serving" not in err[0]:
        sys.exit(f"FAIL: a serving run opened as a single-sequence one: {single.returncode} {err}")
    data = bytearray(open(rec, "rb").read())
    data[len(data) // 2] ^= 0x5A
    bad = os.path.join(out, "serving-damaged.kvs")
    open(bad, "wb").write(bytes(data))
    damaged = run([kvscope, "--view", "serving", "--replay", bad, "--screenshot",
                   os.path.join(out, "y.png")], False)
    err = damaged.stderr.strip().splitlines()
    if damaged.returncode != 1 or len(err) != 1 or "serving-damaged.kvs" not in err[0]:
        sys.exit(f"FAIL: a damaged recording: {damaged.returncode} {err}")
    print("ok:", err[0])


if __name__ == "__main__":
    main()
