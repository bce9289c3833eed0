#!/usr/bin/env python3
"""Independent fp32 reference forward pass for kvscope's golden forward-pass data.

Two modes:
  * llama (default): golden logits for the default model along llama.cpp's greedy paths
    (tests/golden/forward_fp32.json), described below;
  * --family-golden: for another family's model (Gemma 3 270M by default), a few prompts
    tokenized by llama.cpp, a 16-token greedy continuation computed by this reference, and
    its top-5 logits after the prompt and after every greedy token
    (tests/golden/gemma3_fp32.json); llama.cpp's own greedy continuation is recorded next
    to it as a cross-check. See main_family().
  * --window-golden: Gemma 3 past its 512-position window: the first 640 tokens of a long
    text (llama.cpp's tokenization), then 8 greedy steps, with top-5 logits after the
    prompt and after each step (tests/golden/gemma3_window_fp32.json); also how far the
    same logits move when the reference ignores the window, so a test can show its
    tolerance tells the two apart. See main_window().
  * --tiny-golden: a tiny generated model (the qwen2 one of tests/cli/make_bad_models.cpp:
    random weights, q/k/v biases, NeoX RoPE), two fixed token sequences teacher-forced,
    and the top-5 logits after every position (tests/golden/qwen2_tiny_fp32.json); the
    file's FNV-1a 64 hash is recorded so the test knows it rebuilt the same file.
    scripts/make_golden_qwen2_tiny.sh builds the model writer, writes the model and runs
    this. See main_tiny().

Families (FAMILIES below, from docs/engine.md, "Model families"): gemma3 scales the embedding by
sqrt(n_embd), normalizes each q and k head (RMSNorm with attn_q_norm / attn_k_norm) before
RoPE, rotates NeoX halves (i, i + n_rot/2), uses base 10000 and a causal window of
attention.sliding_window keys on its local layers (layer l is local unless (l+1) % 6 == 0),
normalizes the attention and FFN outputs (post_attention_norm, post_ffw_norm) before adding
them to the residual, and gates with tanh-GELU; qwen2 adds q/k/v biases and rotates NeoX
halves.

This is a second source of golden logits next to tests/golden/forward.json (which comes
from llama.cpp, whose CPU matmuls quantize activations to 8 bits). It is written from the
GGUF format description and the llama architecture as GGUF files expect it (see
docs/engine.md, "The forward pass"), not from kvscope's code:

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

How to run (from the repository root; needs numpy and gguf, and llama-cpp-python for
--family-golden, as in the /opt/kvref venv):
  /opt/kvref/bin/python scripts/reference_forward.py \
      [--model assets/models/SmolLM2-135M-Instruct.Q4_1.gguf] \
      [--golden tests/golden/forward.json] [--out tests/golden/forward_fp32.json]
  /opt/kvref/bin/python scripts/reference_forward.py --family-golden \
      [--model assets/models/gemma-3-270m-q4_k_m.gguf] [--out tests/golden/gemma3_fp32.json]
  /opt/kvref/bin/python scripts/reference_forward.py --window-golden \
      [--model assets/models/gemma-3-270m-q4_k_m.gguf] [--text /usr/share/common-licenses/GPL-3] \
      [--out tests/golden/gemma3_window_fp32.json]
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


# What each architecture does beyond the llama block (docs/engine.md, "Model families").
FAMILIES = {
    "llama": dict(neox=False, gelu=False, embd_sqrt=False, qk_norm=False, post_norms=False,
                  bias=False, swa_period=0),
    "gemma3": dict(neox=True, gelu=True, embd_sqrt=True, qk_norm=True, post_norms=True,
                   bias=False, swa_period=6),
    "qwen2": dict(neox=True, gelu=False, embd_sqrt=False, qk_norm=False, post_norms=False,
                  bias=True, swa_period=0),
}


class Model:
    """Dequantized float32 weights of a llama, gemma3 or qwen2 GGUF file.

    Matrices are stored [n_out, n_in] (row o is the weights of output o), vectors [n].
    """

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        arch = field_value(reader, "general.architecture")
        if arch not in FAMILIES:
            raise ValueError(f"{path}: general.architecture is {arch!r}, expected one of "
                             f"{sorted(FAMILIES)}")
        self.arch = arch
        self.fam = FAMILIES[arch]

        def opt(key):
            return field_value(reader, f"{arch}.{key}")

        def req(key):
            v = opt(key)
            if v is None:
                raise ValueError(f"{path}: missing metadata key {arch}.{key}")
            return v

        self.n_layer = int(req("block_count"))
        self.n_embd = int(req("embedding_length"))
        self.n_ff = int(req("feed_forward_length"))
        self.n_head = int(req("attention.head_count"))
        self.n_kv = int(req("attention.head_count_kv"))
        self.eps = float(req("attention.layer_norm_rms_epsilon"))
        base = opt("rope.freq_base")
        self.rope_base = float(base) if base is not None else 10000.0
        kl = opt("attention.key_length")
        self.head_dim = int(kl) if kl is not None else self.n_embd // self.n_head
        rot = opt("rope.dimension_count")
        self.n_rot = int(rot) if rot is not None else self.head_dim
        if self.n_head % self.n_kv != 0 or self.n_rot % 2 != 0 or self.n_rot > self.head_dim:
            raise ValueError(f"{path}: inconsistent head counts / rope dims")
        for key in ("rope.scaling.type", "final_logit_softcapping", "attn_logit_softcapping"):
            if opt(key) not in (None, "none", 0.0):
                raise ValueError(f"{path}: {arch}.{key} is set; this reference does not run it")
        # Per layer: attention window (0 = global) and RoPE base. Gemma 3: a layer is local
        # unless (l + 1) % 6 == 0; local layers see the last sliding_window positions and
        # rotate with base 10000 unless rope.freq_base_swa says otherwise.
        self.window = [0] * self.n_layer
        self.base = [self.rope_base] * self.n_layer
        if self.fam["swa_period"]:
            if opt("attention.sliding_window_pattern") is not None:
                raise ValueError(f"{path}: sliding_window_pattern is not handled here")
            w = int(req("attention.sliding_window"))
            base_swa = opt("rope.freq_base_swa")
            for l in range(self.n_layer):
                if (l + 1) % self.fam["swa_period"] != 0:
                    self.window[l] = w
                    self.base[l] = float(base_swa) if base_swa is not None else 10000.0
        # Gemma 3 scales the embedding by sqrt(n_embd), computed in float32.
        self.embd_scale = np.float32(np.sqrt(np.float32(self.n_embd))) \
            if self.fam["embd_sqrt"] else np.float32(1.0)

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
        """x [..., n] float32 -> x / sqrt(mean(x^2) + eps) * weight; mean in float64."""
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        scale = (1.0 / np.sqrt(ms + self.eps)).astype(np.float32)
        return (x * scale) * weight

    def rope(self, x, pos, base):
        """x [T, H, head_dim]; rotate pairs of the first n_rot dims: adjacent (2i, 2i+1) for
        llama files, NeoX halves (i, i + n_rot/2) for gemma3 and qwen2."""
        half = self.n_rot // 2
        i = np.arange(half, dtype=np.float64)
        inv = base ** (-2.0 * i / self.n_rot)  # [n_rot/2]
        theta = pos.astype(np.float64)[:, None] * inv[None, :]  # [T, n_rot/2]
        cos = np.cos(theta).astype(np.float32)[:, None, :]  # [T, 1, n_rot/2]
        sin = np.sin(theta).astype(np.float32)[:, None, :]
        out = x.copy()
        if self.fam["neox"]:
            a, b = slice(0, half), slice(half, self.n_rot)
        else:
            a, b = slice(0, self.n_rot, 2), slice(1, self.n_rot, 2)
        x0, x1 = x[:, :, a], x[:, :, b]
        out[:, :, a] = x0 * cos - x1 * sin
        out[:, :, b] = x0 * sin + x1 * cos
        return out

    def forward(self, ids, keep):
        """ids: T token ids at positions 0..T-1. Returns float32 logits [len(keep), n_vocab]
        for the positions listed in keep (logits after the token at that position)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token id out of range [0, {self.n_vocab})")
        T, hd, H, KV, fam = len(ids), self.head_dim, self.n_head, self.n_kv, self.fam
        pos = np.arange(T)
        x = self.tok_embd[ids] * self.embd_scale  # [T, n_embd]
        dist = pos[:, None] - pos[None, :]  # query position - key position
        group = H // KV
        for L in range(self.n_layer):
            p = f"blk.{L}."
            w = self.w
            # Causal mask, and for windowed layers keys at least `window` back are masked.
            masked = dist < 0
            if self.window[L]:
                masked |= dist >= self.window[L]
            mask = np.where(masked, np.float32(-np.inf), np.float32(0.0))  # [T, T]
            h = self.rms_norm(x, w[p + "attn_norm.weight"])
            q = h @ w[p + "attn_q.weight"].T
            k = h @ w[p + "attn_k.weight"].T  # kept fp32
            v = h @ w[p + "attn_v.weight"].T  # kept fp32
            if fam["bias"]:
                q = q + w[p + "attn_q.bias"]
                k = k + w[p + "attn_k.bias"]
                v = v + w[p + "attn_v.bias"]
            q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
            if fam["qk_norm"]:  # RMSNorm over each head's hd values
                q = self.rms_norm(q, w[p + "attn_q_norm.weight"])
                k = self.rms_norm(k, w[p + "attn_k_norm.weight"])
            q = self.rope(q, pos, self.base[L])
            k = self.rope(k, pos, self.base[L])
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
            o = att @ w[p + "attn_output.weight"].T
            if fam["post_norms"]:
                o = self.rms_norm(o, w[p + "post_attention_norm.weight"])
            x = x + o
            h = self.rms_norm(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T  # [T, n_ff]
            u = h @ w[p + "ffn_up.weight"].T
            if fam["gelu"]:  # tanh-approximated GELU, in float32
                c = np.float32(np.sqrt(2.0 / np.pi))
                act = np.float32(0.5) * g * (np.float32(1.0) +
                                             np.tanh(c * (g + np.float32(0.044715) * g * g * g)))
            else:
                act = g / (np.float32(1.0) + np.exp(-g))  # SiLU(g)
            f = (act * u) @ w[p + "ffn_down.weight"].T
            if fam["post_norms"]:
                f = self.rms_norm(f, w[p + "post_ffw_norm.weight"])
            x = x + f
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


def reference_versions():
    return {"python": platform.python_version(), "numpy": np.__version__,
            "gguf": importlib.metadata.version("gguf")}


def write_golden(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(obj))
        f.write("\n")
    print(f"wrote {path}")


# Prompts of the family golden file: (name, text). The first is the greedy check of
# docs/engine.md, "Checked ids" ("The capital of France is" -> " the capital of the
# country of France.").
FAMILY_PROMPTS = [
    ("capital", "The capital of France is"),
    ("story", "Once upon a time, in a village at the edge of a great forest, there lived"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
]
FAMILY_STEPS = 16


def llama_cpp_greedy(path, prompt_ids, steps):
    """llama.cpp's greedy continuation (argmax of its raw logits, one token per eval)."""
    import ctypes
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2,
                          n_threads_batch=2, n_gpu_layers=0, flash_attn=False, verbose=False)
    n_vocab = llm.n_vocab()

    def step(tok):
        llm.eval([tok])
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(n_vocab,)).copy()

    out = []
    for ids in prompt_ids:
        llm.reset()
        logits = None
        for t in ids:
            logits = step(t)
        greedy = []
        for _ in range(steps):
            greedy.append(int(np.argmax(logits)))
            logits = step(greedy[-1])
        out.append(greedy)
    return llm, out


def main_family(args):
    """Golden data for a non-llama family: prompts tokenized by llama.cpp (BOS added as the
    file asks), greedy continuation and top-5 logits from this reference."""
    import llama_cpp
    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    tok = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    prompt_ids = [[int(i) for i in tok.tokenize(text.encode("utf-8"), add_bos=True, special=False)]
                  for _, text in FAMILY_PROMPTS]
    t0 = time.time()
    model = Model(args.model)
    print(f"loaded {args.model} ({model.arch}) in {time.time() - t0:.1f}s: {model.n_layer} "
          f"layers, n_embd {model.n_embd}, heads {model.n_head}/{model.n_kv} x {model.head_dim}, "
          f"windows {sorted(set(model.window))}, bases {sorted(set(model.base))}")
    llm, cpp_greedy = llama_cpp_greedy(args.model, prompt_ids, FAMILY_STEPS)
    results = []
    agree_total = steps_total = 0
    for (name, text), ids, cpp in zip(FAMILY_PROMPTS, prompt_ids, cpp_greedy):
        seq = list(ids)
        tops, greedy = [], []
        for k in range(FAMILY_STEPS + 1):  # after the prompt and after each greedy token
            logits = model.forward(seq, [len(seq) - 1])[0]
            tops.append(top5(logits))
            if k < FAMILY_STEPS:
                greedy.append(int(np.argmax(logits)))
                seq.append(greedy[-1])
        # Where llama.cpp's greedy path first leaves ours, and our top-2 margin there.
        same = next((k for k in range(FAMILY_STEPS) if greedy[k] != cpp[k]), FAMILY_STEPS)
        agree_total += same
        steps_total += FAMILY_STEPS
        text_out = llm.detokenize(greedy).decode("utf-8", "replace")
        print(f"{name}: prompt {ids}\n  greedy {text_out!r}\n  llama.cpp agrees for {same} of "
              f"{FAMILY_STEPS} tokens")
        results.append({
            "name": name, "prompt": text, "prompt_ids": ids, "greedy_ids": greedy,
            "greedy_text": text_out, "top5": tops, "llama_cpp_greedy_ids": cpp,
            "llama_cpp_agrees_for": same,
        })
    if agree_total < 0.5 * steps_total:
        sys.exit("reference and llama.cpp disagree more than expected; not writing output")
    out = {
        "source": "scripts/reference_forward.py --family-golden: numpy fp32 forward pass, "
                  "weights dequantized with the gguf package (independent of kvscope); "
                  "prompts tokenized by llama.cpp",
        "script": "scripts/reference_forward.py --family-golden",
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "gguf": importlib.metadata.version("gguf"),
                     "llama_cpp_python": importlib.metadata.version("llama_cpp_python")},
        "model": {"file": os.path.basename(args.model), "sha256": sha, "arch": model.arch},
        "kv": "fp32",
        "settings": {"compute": "float32 (float64 for the RMSNorm mean of squares and the "
                                "softmax sums)",
                     "windows": model.window, "rope_bases": model.base,
                     "eval": "the whole sequence at once for every step (causal + window mask)",
                     "greedy": "argmax of this reference's logits, first index on ties",
                     "logits_rounding": 4},
        "notes": "top5[0] follows the prompt, top5[k] follows greedy token k (17 lists). "
                 "llama_cpp_greedy_ids is llama.cpp's own greedy path (activations quantized "
                 "to 8 bits in its matmuls), for comparison only.",
        "prompts": results,
    }
    write_golden(args.out, out)


WINDOW_PROMPT_TOKENS = 640
WINDOW_STEPS = 8


def main_window(args):
    """Golden data past the sliding window: WINDOW_PROMPT_TOKENS tokens of args.text
    (llama.cpp's ids, BOS first), WINDOW_STEPS greedy tokens from this reference, top-5
    after the prompt and after each greedy token; and the largest change of those logits
    when every layer attends to everything (the window ignored)."""
    import llama_cpp
    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(args.text, "rb") as f:
        text = f.read()
    tok = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    ids = [int(i) for i in tok.tokenize(text, add_bos=True, special=False)]
    if len(ids) < WINDOW_PROMPT_TOKENS:
        sys.exit(f"{args.text} has only {len(ids)} tokens")
    prompt = ids[:WINDOW_PROMPT_TOKENS]
    model = Model(args.model)
    windows = list(model.window)
    if not any(windows) or max(windows) >= WINDOW_PROMPT_TOKENS:
        sys.exit(f"windows {sorted(set(windows))}: the prompt does not pass them")
    seq, tops, greedy, no_window_diff = list(prompt), [], [], 0.0
    for k in range(WINDOW_STEPS + 1):
        t0 = time.time()
        logits = model.forward(seq, [len(seq) - 1])[0]
        tops.append(top5(logits))
        # The same position with the window ignored: how far the top-5 logits move.
        model.window = [0] * model.n_layer
        full = model.forward(seq, [len(seq) - 1])[0]
        model.window = windows
        moved = max(abs(float(full[i]) - float(logits[i])) for i, _ in tops[-1])
        no_window_diff = max(no_window_diff, moved)
        print(f"step {k}: {len(seq)} tokens, top {tops[-1][0]}, without the window the top-5 "
              f"logits move by up to {moved:.3f} ({time.time() - t0:.1f}s)")
        if k < WINDOW_STEPS:
            greedy.append(int(np.argmax(logits)))
            seq.append(greedy[-1])
    out = {
        "source": "scripts/reference_forward.py --window-golden: numpy fp32 forward pass, "
                  "weights dequantized with the gguf package (independent of kvscope); "
                  "prompt tokenized by llama.cpp",
        "script": "scripts/reference_forward.py --window-golden",
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "gguf": importlib.metadata.version("gguf"),
                     "llama_cpp_python": importlib.metadata.version("llama_cpp_python")},
        "model": {"file": os.path.basename(args.model), "sha256": sha, "arch": model.arch},
        "text": os.path.basename(args.text),
        "kv": "fp32",
        "settings": {"windows": windows, "rope_bases": model.base,
                     "eval": "the whole sequence at once for every step (causal + window mask)",
                     "logits_rounding": 4},
        "notes": f"prompt_ids: the first {WINDOW_PROMPT_TOKENS} tokens of the text; top5[0] "
                 "follows the prompt, top5[k] follows greedy token k. no_window_max_diff: the "
                 "largest change of those top-5 logits when the reference ignores the window.",
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "top5": tops,
        "no_window_max_diff": round(no_window_diff, 4),
    }
    write_golden(args.out, out)


# The token sequences of the tiny golden file: fixed patterns over the vocabulary (the
# tiny model's tokens are bytes and a few merges; no text is needed to run it).
TINY_SEQUENCES = [
    ("stride37", lambda n_vocab: [(11 + 37 * i) % n_vocab for i in range(40)]),
    ("repeats", lambda n_vocab: [(3 + 5 * (i % 7)) % n_vocab for i in range(24)]),
]


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main_tiny(args):
    """Golden logits of a tiny generated model: every position of TINY_SEQUENCES."""
    with open(args.model, "rb") as f:
        data = f.read()
    model = Model(args.model)
    results = []
    for name, make in TINY_SEQUENCES:
        ids = make(model.n_vocab)
        logits = model.forward(ids, np.arange(len(ids)))
        results.append({"name": name, "ids": ids, "top5": [top5(row) for row in logits]})
        print(f"{name}: {len(ids)} tokens, top-1 after the last {int(np.argmax(logits[-1]))}")
    out = {
        "source": "scripts/reference_forward.py --tiny-golden: numpy fp32 forward pass, "
                  "weights dequantized with the gguf package (independent of kvscope)",
        "script": "scripts/make_golden_qwen2_tiny.sh",
        "versions": reference_versions(),
        "model": {"file": "qwen2.gguf of tests/cli/make_bad_models.cpp "
                          "(test::tiny_family(\"qwen2\", 4))",
                  "arch": model.arch, "bytes": len(data), "fnv1a64": fnv1a64(data)},
        "kv": "fp32",
        "notes": "top5[t] follows the token at position t (whole sequence at once, causal mask); "
                 "logits rounded to 4 decimals.",
        "sequences": results,
    }
    write_golden(args.out, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-golden", action="store_true",
                    help="Gemma 3 past its sliding window (first 640 tokens of --text)")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--family-golden", action="store_true",
                    help="golden data for a non-llama family (default model: Gemma 3 270M)")
    ap.add_argument("--model")
    ap.add_argument("--golden", default="tests/golden/forward.json")
    ap.add_argument("--out")
    ap.add_argument("--tiny-golden", action="store_true",
                    help="a tiny generated model (--model), fixed token sequences")
    args = ap.parse_args()
    if args.tiny_golden:
        if not args.model:
            sys.exit("--tiny-golden needs --model (scripts/make_golden_qwen2_tiny.sh)")
        args.out = args.out or "tests/golden/qwen2_tiny_fp32.json"
        main_tiny(args)
        return
    if args.window_golden:
        args.model = args.model or "assets/models/gemma-3-270m-q4_k_m.gguf"
        args.out = args.out or "tests/golden/gemma3_window_fp32.json"
        main_window(args)
        return
    if args.family_golden:
        args.model = args.model or "assets/models/gemma-3-270m-q4_k_m.gguf"
        args.out = args.out or "tests/golden/gemma3_fp32.json"
        main_family(args)
        return
    args.model = args.model or "assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    args.out = args.out or "tests/golden/forward_fp32.json"

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
        "versions": reference_versions(),
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
    write_golden(args.out, out)


if __name__ == "__main__":
    main()
