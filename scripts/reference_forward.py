#!/usr/bin/env python3
"""Independent fp32 reference forward pass for kvscope's golden forward-pass data.

This is a second source of golden logits next to tests/golden/forward.json (which comes
from llama.cpp, whose CPU matmuls quantize activations to 8 bits). It is written from the
GGUF format description and the llama architecture as GGUF files expect it (see
ENGINE_FACTS.md, "Forward pass"), not from kvscope's code:

  * every weight is dequantized to float32 with the `gguf` Python package
    (`gguf.GGUFReader` + `gguf.quants.dequantize`);
  * activations, matmuls and the KV values are float32 (K/V are NOT rounded to f16);
    the RMSNorm mean of squares and the softmax sums are accumulated in float64;
  * RoPE rotates adjacent pairs (2i, 2i+1) with theta = pos * base^(-2i/n_rot) computed
    in float64 (positions start at 0); GQA maps query head h to KV head
    h // (n_head // n_kv); SwiGLU FFN; tied output projection (token_embd) unless the file
    has output.weight; rms eps, rope base and all sizes are read from the file.

The whole token sequence is processed at once with a causal mask. For each prompt of
forward.json the sequence prompt_ids + greedy_ids is run teacher-forced, and the logits
after the prompt and after greedy tokens 1..32 are kept (33 positions, the same indexing
as forward.json's top5).

Output: tests/golden/forward_fp32.json with, per prompt (same names as forward.json):
  top5          33 lists of [id, logit] (logits rounded to 4 decimals), this reference's
                own top-5 at each position;
  at_llama_top5 33 lists of [id, logit]: this reference's logits for the ids in
                forward.json's top5 at the same position, so a test can compare both
                sources on the same ids;
  greedy_ids    forward.json's greedy ids (the teacher-forced continuation);
plus metadata (script, versions, model sha256, "kv": "fp32") and a summary of how this
reference compares with llama.cpp (top-1 agreement, logit differences).

How to run (from the repository root; needs numpy and gguf, as in the /opt/kvref venv):
  /opt/kvref/bin/python scripts/reference_forward.py \
      [--model assets/models/SmolLM2-135M-Instruct.Q4_1.gguf] \
      [--golden tests/golden/forward.json] [--out tests/golden/forward_fp32.json]
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time

import gguf
import numpy as np


def field_value(reader, key):
    """Scalar or string value of a GGUF metadata key (None when absent)."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    return part[0].item()


class Model:
    """Dequantized float32 weights of a llama-architecture GGUF file.

    Matrices are stored [n_out, n_in] (row o is the weights of output o), vectors [n].
    """

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        arch = field_value(reader, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'llama'")

        def req(key):
            v = field_value(reader, f"{arch}.{key}")
            if v is None:
                raise ValueError(f"{path}: missing metadata key {arch}.{key}")
            return v

        self.n_layer = int(req("block_count"))
        self.n_embd = int(req("embedding_length"))
        self.n_ff = int(req("feed_forward_length"))
        self.n_head = int(req("attention.head_count"))
        self.n_kv = int(req("attention.head_count_kv"))
        self.eps = float(req("attention.layer_norm_rms_epsilon"))
        base = field_value(reader, f"{arch}.rope.freq_base")
        self.rope_base = float(base) if base is not None else 10000.0
        self.head_dim = self.n_embd // self.n_head
        rot = field_value(reader, f"{arch}.rope.dimension_count")
        self.n_rot = int(rot) if rot is not None else self.head_dim
        if self.n_head % self.n_kv != 0 or self.n_rot % 2 != 0 or self.n_rot > self.head_dim:
            raise ValueError(f"{path}: inconsistent head counts / rope dims")

        self.w = {}
        for t in reader.tensors:
            # t.shape is ggml's ne (ne[0] first); the result is row-major [ne[1], ne[0]].
            shape = tuple(int(d) for d in reversed(t.shape))
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.ascontiguousarray(a, dtype=np.float32).reshape(shape)
        self.tok_embd = self.w["token_embd.weight"]  # [n_vocab, n_embd]
        self.output = self.w.get("output.weight", self.tok_embd)  # tied when absent
        self.n_vocab = self.tok_embd.shape[0]

    def rms_norm(self, x, weight):
        """x [T, n] float32 -> x / sqrt(mean(x^2) + eps) * weight; mean in float64."""
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        scale = (1.0 / np.sqrt(ms + self.eps)).astype(np.float32)
        return (x * scale) * weight

    def rope(self, x, pos):
        """x [T, H, head_dim]; rotate adjacent pairs (2i, 2i+1) of the first n_rot dims."""
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        inv = self.rope_base ** (-2.0 * i / self.n_rot)  # [n_rot/2]
        theta = pos.astype(np.float64)[:, None] * inv[None, :]  # [T, n_rot/2]
        cos = np.cos(theta).astype(np.float32)[:, None, :]  # [T, 1, n_rot/2]
        sin = np.sin(theta).astype(np.float32)[:, None, :]
        out = x.copy()
        x0 = x[:, :, 0:self.n_rot:2]
        x1 = x[:, :, 1:self.n_rot:2]
        out[:, :, 0:self.n_rot:2] = x0 * cos - x1 * sin
        out[:, :, 1:self.n_rot:2] = x0 * sin + x1 * cos
        return out

    def forward(self, ids, keep):
        """ids: T token ids at positions 0..T-1. Returns float32 logits [len(keep), n_vocab]
        for the positions listed in keep (logits after the token at that position)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token id out of range [0, {self.n_vocab})")
        T, hd, H, KV = len(ids), self.head_dim, self.n_head, self.n_kv
        pos = np.arange(T)
        x = self.tok_embd[ids].copy()  # [T, n_embd]
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)  # [T, T] causal
        group = H // KV
        for L in range(self.n_layer):
            p = f"blk.{L}."
            h = self.rms_norm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, H, hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, KV, hd)  # kept fp32
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, KV, hd)  # kept fp32
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)  # [H, T, hd]; head h -> h//group
            vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)  # [H, T, hd]
            qh = q.transpose(1, 0, 2)  # [H, T, hd]
            scores = (qh @ kh.transpose(0, 2, 1)) * np.float32(1.0 / np.sqrt(hd))  # [H, T, T]
            scores = scores + mask
            scores = scores - scores.max(axis=-1, keepdims=True)
            e = np.exp(scores)
            s = np.sum(e, axis=-1, keepdims=True, dtype=np.float64)
            prob = (e / s).astype(np.float32)
            att = (prob @ vh).transpose(1, 0, 2).reshape(T, H * hd)  # [T, n_head*hd]
            x = x + att @ self.w[p + "attn_output.weight"].T
            h = self.rms_norm(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T  # [T, n_ff]
            u = h @ self.w[p + "ffn_up.weight"].T
            act = (g / (np.float32(1.0) + np.exp(-g))) * u  # SiLU(g) * u
            x = x + act @ self.w[p + "ffn_down.weight"].T
        xo = self.rms_norm(x[keep], self.w["output_norm.weight"])
        return xo @ self.output.T  # [len(keep), n_vocab]


def top5(logits):
    idx = np.argsort(-logits, kind="stable")[:5]
    return [[int(i), round(float(logits[i]), 4)] for i in idx]


def to_json(obj, indent=0):
    """JSON with dicts indented and lists of numbers (or of number lists) on one line."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {to_json(v, indent + 1).lstrip()}'
                 for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return pad + "[\n" + ",\n".join(to_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return pad + json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--golden", default="tests/golden/forward.json")
    ap.add_argument("--out", default="tests/golden/forward_fp32.json")
    args = ap.parse_args()

    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(args.golden, encoding="utf-8") as f:
        golden = json.load(f)
    if golden["model"]["sha256"] != sha:
        sys.exit(f"{args.golden} was made from model sha256 {golden['model']['sha256']}, "
                 f"but {args.model} has {sha}")

    t0 = time.time()
    model = Model(args.model)
    print(f"loaded {args.model} in {time.time() - t0:.1f}s: {model.n_layer} layers, "
          f"n_embd {model.n_embd}, heads {model.n_head}/{model.n_kv}, eps {model.eps}, "
          f"rope base {model.rope_base}, n_rot {model.n_rot}")

    results = []
    all_diffs = []
    agree_total = steps_total = 0
    for pr in golden["prompts"]:
        prompt_ids, greedy = pr["prompt_ids"], pr["greedy_ids"]
        ref_top5 = pr["top5"]
        seq = prompt_ids + greedy
        keep = np.arange(len(prompt_ids) - 1, len(prompt_ids) + len(ref_top5) - 1)
        if keep[-1] >= len(seq):
            sys.exit(f"{pr['name']}: top5 has more entries than greedy_ids + 1")
        t0 = time.time()
        logits = model.forward(seq, keep)  # [33, n_vocab]
        dt = time.time() - t0
        tops, at_ref = [], []
        diffs = []
        agree = 0
        for j, row in enumerate(logits):
            tops.append(top5(row))
            at_ref.append([[int(i), round(float(row[i]), 4)] for i, _ in ref_top5[j]])
            diffs += [abs(float(row[i]) - lg) for i, lg in ref_top5[j]]
            agree += int(np.argmax(row)) == ref_top5[j][0][0]
        all_diffs += diffs
        agree_total += agree
        steps_total += len(logits)
        results.append({
            "name": pr["name"],
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy,
            "top5": tops,
            "at_llama_top5": at_ref,
            "top1_agrees_with_llama": agree,
            "max_abs_diff_vs_llama": round(max(diffs), 4),
            "mean_abs_diff_vs_llama": round(float(np.mean(diffs)), 4),
        })
        print(f"{pr['name']}: {len(seq)} tokens in {dt:.2f}s, top-1 agrees {agree}/{len(logits)}, "
              f"|diff| mean {np.mean(diffs):.4f} max {max(diffs):.4f}")

    mean_d, max_d = float(np.mean(all_diffs)), float(max(all_diffs))
    print(f"all: top-1 agrees {agree_total}/{steps_total}, |diff| vs llama.cpp on its top-5 ids: "
          f"mean {mean_d:.4f} max {max_d:.4f}")
    if agree_total < 0.9 * steps_total or max_d > 1.5:
        sys.exit("reference disagrees with llama.cpp more than expected; not writing output")

    out = {
        "source": "scripts/reference_forward.py: numpy fp32 forward pass, weights dequantized "
                  "with the gguf package (independent of kvscope and llama.cpp)",
        "script": "scripts/reference_forward.py",
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "gguf": importlib.metadata.version("gguf")},
        "model": {"file": os.path.basename(args.model), "sha256": sha},
        "kv": "fp32",
        "settings": {"compute": "float32 (float64 for the RMSNorm mean of squares and the "
                                "softmax sums)",
                     "rope": "adjacent pairs (2i, 2i+1), theta = pos * base^(-2i/n_rot) in "
                             "float64, positions from 0",
                     "rms_eps": model.eps, "rope_base": model.rope_base, "n_rot": model.n_rot,
                     "eval": "whole sequence prompt_ids + greedy_ids at once, causal mask "
                             "(teacher-forced along forward.json's greedy_ids)",
                     "logits_rounding": 4},
        "notes": "top5[0] follows the last prompt token; top5[k] follows greedy token k (same "
                 "indexing as forward.json). at_llama_top5[k] holds this reference's logits "
                 "for the ids of forward.json's top5[k].",
        "vs_llama": {"top1_agrees": agree_total, "steps": steps_total,
                     "mean_abs_diff": round(mean_d, 4), "max_abs_diff": round(max_d, 4)},
        "prompts": results,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(to_json(out))
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
