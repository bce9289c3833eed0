#!/usr/bin/env python3
"""png_content.py — what a screenshot shows, for tests/app/headless_capture.sh.

Usage: png_content.py FILE WIDTH HEIGHT

Decodes the PNG with the standard library only (zlib; 8-bit RGB or RGBA, not interlaced, the
five PNG row filters) and checks what a user would see, not just the header. The regions are
fractions of the window, from the app's layout at small sizes (toolbar on top, the 3D view
under it, the generated text below the view; side panels folded):
  - the size is WIDTH x HEIGHT, and it is a picture, not a blank: at least 64 colours;
  - toolbar (top 10%): light button labels (luma > 0.7, at least 1%) on the blue of the
    selected buttons (at least 3%);
  - 3D view (x 6-94%, y 12-50%): a dark background (luma < 0.2, at least 60%) with bright
    beams and labels (luma > 0.7, at least 0.1%) and coloured token boxes, KV blocks and
    write head (max - min channel above 0.3, at least 0.1%);
  - text (x 6-94%, y 58-80%): light text (luma > 0.7, at least 0.3%).
Prints the measures, exits 1 naming each check that failed.
"""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError(f"unhandled PNG: depth {depth}, colour type {ctype}, "
                                 f"interlace {interlace}")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if w is None:
        raise ValueError("no IHDR")
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
            elif f != 0:
                raise ValueError(f"row {y}: filter {f}")
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def luma(p):
    return (0.2126 * p[0] + 0.7152 * p[1] + 0.0722 * p[2]) / 255.0


def main(argv):
    path, want_w, want_h = argv[1], int(argv[2]), int(argv[3])
    w, h, rows = decode(path)

    def region(x0, x1, y0, y1):
        return [p for row in rows[int(y0 * h):int(y1 * h)] for p in row[int(x0 * w):int(x1 * w)]]

    def share(pixels, pred):
        return sum(1 for p in pixels if pred(p)) / max(1, len(pixels))

    light = lambda p: luma(p) > 0.7
    blue = lambda p: p[2] > 150 and p[2] > p[0] + 60
    dark = lambda p: luma(p) < 0.2
    vivid = lambda p: max(p) - min(p) > 0.3 * 255
    colours = len({p for row in rows for p in row})
    bar, view, text = region(0, 1, 0, 0.1), region(0.06, 0.94, 0.12, 0.5), region(0.06, 0.94, 0.58, 0.8)
    m = {"toolbar light": share(bar, light), "toolbar blue": share(bar, blue),
         "view dark": share(view, dark), "view bright": share(view, light),
         "view coloured": share(view, vivid), "text light": share(text, light)}
    want = {"toolbar light": 0.01, "toolbar blue": 0.03, "view dark": 0.6,
            "view bright": 0.001, "view coloured": 0.001, "text light": 0.003}
    print(f"png_content: {w}x{h}, {colours} colours; " +
          ", ".join(f"{k} {v:.2%}" for k, v in m.items()))
    fails = []
    if (w, h) != (want_w, want_h):
        fails.append(f"size {w}x{h}, want {want_w}x{want_h}")
    if colours < 64:
        fails.append(f"only {colours} colours: a blank or flat image")
    fails += [f"{k} {m[k]:.2%}, want at least {v:.1%}" for k, v in want.items() if m[k] < v]
    for f in fails:
        print(f"png_content: FAIL {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
