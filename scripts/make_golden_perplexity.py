#!/usr/bin/env python3
"""make_golden_perplexity.py — llama.cpp's perplexity of the default model on the project's
long text, for tests/engine/test_perplexity.cpp (tests/golden/perplexity_llamacpp.json).

llama.cpp (through llama-cpp-python, the version the other golden data were made with) reads
the same GGUF file, tokenizes the first TEXT_BYTES bytes of the text with no BOS (as the test
does), evaluates the tokens in one batch with every position's logits kept, and scores
tokens[1 ..] teacher-forced: nll[i] = -log softmax(logits after token i-1)[token i], in
float64. That is kvscope's perplexity over one chunk (engine/perplexity.h), so the test can
compare the mean over any prefix; both the ids and every token's nll are stored.

Not llama-perplexity's own scoring: that tool scores only the second half of each n_ctx
window; here every token of one window is scored, as `kvscope perplexity` does.

Usage (from the repository root; a python with llama-cpp-python==0.3.36 and numpy, e.g. the
venv scripts/bench_vs_llamacpp.sh builds at build/llamacpp-venv):
  build/llamacpp-venv/bin/python scripts/make_golden_perplexity.py \\
      [--model assets/models/SmolLM2-135M-Instruct.Q4_1.gguf] \\
      [--text /usr/share/common-licenses/GPL-3] [--out tests/golden/perplexity_llamacpp.json]
"""
import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import platform

import numpy as np

TEXT_BYTES = 1200  # about 256 tokens of the GPL's preamble
MAX_TOKENS = 256


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--out", default="tests/golden/perplexity_llamacpp.json")
    args = ap.parse_args()
    import llama_cpp

    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(args.text, "rb") as f:
        text = f.read()[:TEXT_BYTES]
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=512, n_batch=512, n_threads=2,
                          logits_all=True, verbose=False)
    ids = llm.tokenize(text, add_bos=False, special=False)[:MAX_TOKENS]
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)  # [T, n_vocab]
    nll = []
    for i in range(1, len(ids)):
        row = logits[i - 1]
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        nll.append(lse - row[ids[i]])
    mean = float(np.mean(nll))
    print(f"{len(ids)} tokens, {len(nll)} scored: mean nll {mean:.4f}, perplexity "
          f"{math.exp(mean):.3f}")
    out = {
        "source": "scripts/make_golden_perplexity.py: llama.cpp through llama-cpp-python, "
                  "one batch of the tokens, every position's logits, nll in float64",
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "llama_cpp_python": importlib.metadata.version("llama_cpp_python")},
        "model": {"file": os.path.basename(args.model), "sha256": sha},
        "text": {"file": args.text, "bytes": TEXT_BYTES},
        "ids": ids,
        "token_nll": [round(float(v), 5) for v in nll],
        "mean_nll": round(mean, 5),
        "perplexity": round(math.exp(mean), 4),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
