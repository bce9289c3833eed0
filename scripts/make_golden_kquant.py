#!/usr/bin/env python3
"""Golden dequantized values of K-quant blocks, from the `gguf` Python package.

Writes tests/golden/q5_k_dequant.json: 16 Q5_K blocks (176 bytes each) of random bytes
with their f16 scale d and min dmin set to finite values a model could hold (d in
[1e-4, 0.05), dmin in [0, 0.05)), and the 256 values of each as `gguf.quants.dequantize`
(llama.cpp's gguf-py, numpy) computes them. The blocks come from numpy's PCG64 seeded with
20261126, so the file is the same on every run. kvscope's dequantizer
(engine/quant.cpp) is tested against it in tests/engine/test_quant.cpp; the values are
written with 9 significant digits, enough to round-trip a float32.

Run: scripts/make_golden_kquant.sh (makes build/golden-venv with the pinned gguf and
numpy, then runs this).
"""
import json
import os
from importlib import metadata

import numpy as np
from gguf import GGMLQuantizationType, quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    rng = np.random.Generator(np.random.PCG64(20261126))
    n_blocks, block_bytes = 16, 176
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(1e-4, 0.05, size=n_blocks).astype(np.float16)
    dmin = rng.uniform(0.0, 0.05, size=n_blocks).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    raw[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    values = quants.dequantize(raw.reshape(-1), GGMLQuantizationType.Q5_K).astype(np.float32)
    values = values.reshape(n_blocks, 256)
    assert np.all(np.isfinite(values))
    out = {
        "source": "gguf " + metadata.version("gguf") + ", numpy " + np.__version__ +
                  ": quants.dequantize (scripts/make_golden_kquant.py)",
        "type": "Q5_K",
        "blocks": [bytes(b).hex() for b in raw],
        "values": [[float("%.9g" % v) for v in row] for row in values],
    }
    path = os.path.join(ROOT, "tests", "golden", "q5_k_dequant.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print(f"wrote {path}: {n_blocks} Q5_K blocks")


if __name__ == "__main__":
    main()
