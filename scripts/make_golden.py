#!/usr/bin/env python3
"""Produce kvscope's golden test data from llama.cpp (via llama-cpp-python).

The data comes from an independent implementation (llama.cpp), never from kvscope, so
the C++ tests can check kvscope's tokenizer and forward pass against it.

Outputs (small JSON files, committed):
  tests/golden/tokenizer.json  -- varied strings and the token ids llama.cpp gives them
                                  (add_bos=False; `special` records whether special-token
                                  text was parsed as special tokens).
  tests/golden/forward.json    -- for a few prompts: the prompt ids, 32 greedy tokens
                                  (argmax over the raw logits llama.cpp returns, computed
                                  here, no repetition penalty, one token evaluated per
                                  decode call), and the top-5 (id, logit) after the prompt
                                  and after each greedy step (33 lists per prompt).

Settings: n_ctx 512, n_threads 2, flash attention off, KV cache f16 (llama.cpp default),
CPU only, every token (prompt included) evaluated one at a time. Note that llama.cpp's
CPU matmuls on Q4_1/Q8_0 weights quantize the activations to 8 bits first, so its logits
differ from an exact float computation by a small amount; compare with a tolerance.

How to run (from the repository root):
  /opt/kvref/bin/python scripts/make_golden.py \
      [--model assets/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out tests/golden]

Package versions used for the committed files: Python 3.11, llama-cpp-python 0.3.36
(its bundled llama.cpp, built from source for CPU), numpy 2.4.6, jinja2 3.1.6 (renders
the chat template stored in the GGUF). The script records the versions it ran with.
"""

import argparse
import ctypes
import hashlib
import json
import os
import platform
import sys

import jinja2
import llama_cpp
import numpy as np

# (text, special): special=True parses control-token text like <|im_start|> as tokens.
TOKENIZER_CASES = [
    ("Hello world", False),
    ("Hello, world!", False),
    ("The quick brown fox jumps over the lazy dog.", False),
    ("Once upon a time, in a kingdom far away, there lived a wise old queen.", False),
    ("", False),
    (" ", False),
    ("a", False),
    (" leading space", False),
    ("trailing space ", False),
    ("trailing spaces   ", False),
    ("two  spaces and   three", False),
    ("line one\nline two\n", False),
    ("\n\n\nthree newlines first", False),
    ("windows\r\nline\r\nendings", False),
    ("tab\tseparated\tvalues", False),
    ("  \t \n mixed whitespace run \t\t\n", False),
    ("I'm sure it's what they're saying we'll do, isn't it? I've, you'd", False),
    ("SHOUTING IT'S DON'T WE'LL", False),
    ("'s 're 've 'm 'll 'd 't", False),
    ("Café résumé naïve façade jalapeño über", False),
    ("Ångström, Øresund, Straße, Œuvre", False),
    ("日本語のテキストです。", False),
    ("中文字符测试：你好，世界！", False),
    ("한국어 문장입니다", False),
    ("Привет, как дела? Всё хорошо.", False),
    ("Γειά σου Κόσμε", False),
    ("مرحبا بالعالم", False),
    ("שלום עולם", False),
    ("नमस्ते दुनिया", False),
    ("สวัสดีชาวโลก", False),
    ("Emoji: 😀😃😄 👍🏽 🎉", False),
    ("Family 👨‍👩‍👧‍👦 and flag 🏳️‍🌈 and 🇫🇷", False),
    ("❤️ ✨ ☃ ★ ♥", False),
    ("0", False),
    ("42", False),
    ("1234567890", False),
    ("3.14159265358979", False),
    ("The year 2024 had 366 days and 8784 hours.", False),
    ("Phone: +1 (555) 123-4567, ID #00042", False),
    ("x1 = y22 + z333", False),
    ("Unicode digits ٣٤٥ and ½ ² Ⅻ", False),
    ("def add(a, b):\n    return a + b\n", False),
    ("for (int i = 0; i < n; ++i) {\n\tsum += v[i];\n}\n", False),
    ("if x:\n        deeply_indented()\n    else:\n\tpass", False),
    ('{"key": [1, 2, 3], "nested": {"a": null}}', False),
    ("<html><body><p class=\"x\">Hi</p></body></html>", False),
    ("SELECT * FROM users WHERE id = 7;", False),
    ("https://example.com/path?q=1&r=two#frag", False),
    ("user@example.org", False),
    ("!!!???...,,,;;;", False),
    ("--- *** === ~~~ ^^^", False),
    ("(((nested))) [[brackets]] {{braces}}", False),
    ("Wait... what?! Really?!?", False),
    ("snake_case camelCase PascalCase kebab-case", False),
    ("Mixed: English, français, 日本語, русский, العربية, 😀.", False),
    ("abc123def456", False),
    ("<|im_start|>user\nHi<|im_end|>", True),
    ("<|im_start|>user\nHi<|im_end|>", False),
    ("text before <|endoftext|> text after", True),
    ("text before <|endoftext|> text after", False),
    ("<|im_end|><|im_start|>", True),
    ("<filename>main.py<file_sep>print(1)", True),
    ("<jupyter_code>x = 1<jupyter_output>1<empty_output>", True),
    ("not special: <|im_start", True),
    ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
     "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     True),
    ("supercalifragilisticexpialidocious", False),
    ("pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism", False),
    ("A" * 50, False),
    ("ab " * 20, False),
    ("              ", False),
    ("\u00a0non-breaking\u00a0space", False),
    ("zero\u200bwidth\u200djoiner", False),
    ("control\x01chars\x7f", False),
    ("bytes without tokens \x04\x14 are dropped", False),
]


def chat_prompt(template_src, messages):
    env = jinja2.Environment()
    return env.from_string(template_src).render(messages=messages, add_generation_prompt=True)


def to_json(obj, indent=0):
    """JSON with one line per leaf record: dicts are indented, lists of numbers or of
    number lists stay on one line, so the files stay small and diff well."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {to_json(v, indent + 1).lstrip()}' for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return pad + "[\n" + ",\n".join(to_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return pad + json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def top5(logits):
    idx = np.argsort(-logits, kind="stable")[:5]
    return [[int(i), round(float(logits[i]), 4)] for i in idx]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()

    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()

    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=512,
        n_batch=512,
        n_threads=2,
        n_threads_batch=2,
        n_gpu_layers=0,
        flash_attn=False,
        logits_all=False,
        verbose=False,
    )
    n_vocab = llm.n_vocab()
    versions = {
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
        "numpy": np.__version__,
        "jinja2": jinja2.__version__,
    }
    model_info = {"file": os.path.basename(args.model), "sha256": sha}

    # --- tokenizer ---
    cases = []
    for text, special in TOKENIZER_CASES:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        cases.append({"text": text, "special": special, "ids": [int(i) for i in ids]})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(to_json({"source": "llama.cpp tokenize(add_bos=False, special=<case>)",
                         "versions": versions, "model": model_info, "cases": cases}))
        f.write("\n")

    # --- forward ---
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        sys.exit("model has no tokenizer.chat_template")
    prompts = [
        ("narrative", "Once upon a time, in a small kingdom by the sea, there lived", False),
        ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
        ("chat", chat_prompt(template, [{"role": "user",
                                         "content": "What is the capital of France?"}]), True),
        ("list", "Here is a list of the planets of the solar system, in order: Mercury,", False),
        ("chat_long", chat_prompt(template, [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Explain in two sentences why the sky is blue."},
        ]), True),
    ]
    get_logits = llama_cpp.llama_get_logits_ith
    results = []
    for name, text, special in prompts:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)]
        llm.reset()  # the next eval() drops every cached position

        def step(tok):
            llm.eval([tok])
            ptr = get_logits(llm._ctx.ctx, -1)
            return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                         shape=(n_vocab,)).copy()

        logits = None
        for t in ids:
            logits = step(t)
        tops = [top5(logits)]
        generated = []
        for _ in range(args.steps):
            nxt = int(np.argmax(logits))
            generated.append(nxt)
            logits = step(nxt)
            tops.append(top5(logits))
        results.append({
            "name": name,
            "prompt": text,
            "prompt_ids": ids,
            "special": special,
            "greedy_ids": generated,
            "greedy_text": llm.detokenize(generated, special=True).decode("utf-8", "replace"),
            "top5": tops,
            # Smallest top-1 minus top-2 logit over the 32 greedy choices: a reimplementation
            # can only be expected to reproduce the greedy ids where margins exceed its error.
            "min_top1_margin": round(min(t[0][1] - t[1][1] for t in tops[:-1]), 4),
        })
        print(f"{name}: {len(ids)} prompt tokens -> {results[-1]['greedy_text']!r}")

    with open(os.path.join(args.out, "forward.json"), "w", encoding="utf-8") as f:
        f.write(to_json({
            "source": "llama.cpp via llama-cpp-python, CPU",
            "versions": versions,
            "model": model_info,
            "settings": {"n_ctx": 512, "n_threads": 2, "flash_attn": False,
                         "kv_cache_type": "f16", "eval": "one token per decode call",
                         "greedy": "argmax over raw logits, first index on ties, "
                                   "no penalties, continues past EOS",
                         "logits_rounding": 4},
            "notes": "top5[0] follows the last prompt token; top5[k] follows greedy token k. "
                     "llama.cpp quantizes activations to 8 bits for quantized matmuls on "
                     "CPU, so compare logits with a tolerance.",
            "prompts": results,
        }))
        f.write("\n")


if __name__ == "__main__":
    main()
