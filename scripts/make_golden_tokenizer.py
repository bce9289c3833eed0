#!/usr/bin/env python3
"""Produce golden tokenizer ids for a SentencePiece-style GGUF (Gemma 3) from llama.cpp.

The ids come from an independent implementation (llama.cpp through llama-cpp-python),
never from kvscope, so tests/engine/test_tokenizer_gemma.cpp can check kvscope's
SentencePiece-style tokenizer against them. (scripts/make_golden.py does the same for the
default model's byte-level BPE tokenizer, plus the forward pass.)

Output (a small JSON file, committed):
  tests/golden/tokenizer_gemma3.json -- varied strings (whitespace runs, tabs, newlines,
      HTML-like tags, CJK, emoji, digits, special-token text with and without special
      parsing, the checked id lists of docs/engine.md) and, for each:
        ids:  llama.cpp tokenize(add_bos=True, special=<case>) -- BOS first, as the
              file's tokenizer.ggml.add_bos_token asks;
        text: llama.cpp detokenize(ids without the BOS, special=True) -- the text the
              ids stand for, control tokens written out.

Only the vocabulary is loaded (vocab_only): no weights, no forward pass.

How to run (from the repository root):
  /opt/kvref/bin/python scripts/make_golden_tokenizer.py \
      [--model assets/models/gemma-3-270m-q4_k_m.gguf] [--out tests/golden/tokenizer_gemma3.json]

Package versions used for the committed file: Python 3.11, llama-cpp-python 0.3.36 (its
bundled llama.cpp, built from source for CPU). The script records the versions it ran with.
"""

import argparse
import hashlib
import json
import os
import platform

import llama_cpp

# (text, special): special=True parses control-token text like <start_of_turn> as tokens.
# User-defined tokens (Gemma's newline / space / tab runs, HTML tags, <start_of_image>)
# are split out either way.
CASES = [
    # The checked id lists of docs/engine.md and its greedy-check prompt.
    ("Hello  world\n\nfoo\tbar", False),
    ("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", True),
    ("\U0001D518", False),
    ("The capital of France is", False),
    # Plain text.
    ("Hello world", False),
    ("", False),
    ("a", False),
    ("The quick brown fox jumps over the lazy dog.", False),
    ("I'm sure it's what they're saying we'll do, isn't it?", False),
    ("supercalifragilisticexpialidocious antidisestablishmentarianism", False),
    ("Café résumé naïve façade jalapeño über", False),
    ("A" * 50, False),
    ("ab " * 20, False),
    # Whitespace: spaces (runs of 2-31 are user-defined tokens), tabs, newlines.
    (" ", False),
    ("  ", False),
    ("   leading spaces", False),
    ("trailing spaces   ", False),
    ("two  spaces and   three    four", False),
    ("a" + " " * 31 + "b", False),
    (" " * 40, False),
    ("\t", False),
    ("\t\tdouble tab", False),
    ("tab\tseparated\tvalues", False),
    ("mixed \t \t whitespace", False),
    ("\n", False),
    ("line one\nline two\n", False),
    ("\n\n\nthree newlines first", False),
    ("\n" * 35, False),
    ("windows\r\nline\r\nendings", False),
    ("  \t \n mixed whitespace run \t\t\n", False),
    ("\u00a0non-breaking\u00a0space", False),
    ("zero\u200bwidth\u200djoiner", False),
    # HTML-like tags (many are user-defined tokens in Gemma's vocabulary).
    ("<html><body><p class=\"x\">Hi</p></body></html>", False),
    ("<table><tr><td>1</td><td>2</td></tr></table>", False),
    ("<h1>Title</h1>\n<strong>bold</strong> and <em>em</em>", False),
    ("<div><span>nested</span></div>", False),
    ("<bogus>tag</bogus>", False),
    # CJK and other scripts.
    ("日本語のテキストです。", False),
    ("中文字符测试：你好，世界！", False),
    ("한국어 문장입니다", False),
    ("Привет, как дела? Всё хорошо.", False),
    ("مرحبا بالعالم", False),
    ("नमस्ते दुनिया", False),
    # Emoji (some fall back to byte tokens).
    ("Emoji: 😀😃😄 👍🏽 🎉", False),
    ("Family 👨‍👩‍👧‍👦 and flag 🏳️‍🌈 and 🇫🇷", False),
    ("❤️ ✨ ☃ ★ ♥", False),
    # Digits.
    ("0", False),
    ("1234567890", False),
    ("3.14159265358979", False),
    ("The year 2024 had 366 days and 8784 hours.", False),
    ("x1 = y22 + z333", False),
    ("Unicode digits ٣٤٥ and ½ ² Ⅻ", False),
    # Code.
    ("def add(a, b):\n    return a + b\n", False),
    ("for (int i = 0; i < n; ++i) {\n\tsum += v[i];\n}\n", False),
    ('{"key": [1, 2, 3], "nested": {"a": null}}', False),
    # Odd input: the SentencePiece space mark itself, byte-token text, control bytes.
    ("\u2581already\u2581marked", False),
    ("<0x41> is byte-token text", False),
    ("control\x01chars\x7f", False),
    # Special-token text with and without special parsing.
    ("<start_of_turn>user\nHi<end_of_turn>", True),
    ("<start_of_turn>user\nHi<end_of_turn>", False),
    ("<bos>text<eos>", True),
    ("<bos>text<eos>", False),
    ("<pad><unk><mask>", True),
    ("<unused0> and <unused99>", True),
    ("[multimodal] marker", False),
    ("<start_of_image><end_of_image>", False),
    ("<<start_of_turn>>", True),
    ("not special: <start_of_turn", True),
    ("<start_of_turn>model\n<b>bold</b>\n\n<end_of_turn>\n", True),
]


def to_json(obj, indent=0):
    """JSON with one line per leaf record (lists of numbers stay on one line)."""
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f'{pad} {json.dumps(k)}: {to_json(v, indent + 1).lstrip()}' for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return pad + "[\n" + ",\n".join(to_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return pad + json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--out", default="tests/golden/tokenizer_gemma3.json")
    args = ap.parse_args()

    with open(args.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    bos = llm.token_bos()

    cases = []
    for text, special in CASES:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)]
        body = ids[1:] if ids and ids[0] == bos else ids
        back = llm.detokenize(body, special=True).decode("utf-8", "replace")
        cases.append({"text": text, "special": special, "ids": ids, "text_back": back})

    doc = {
        "source": "llama.cpp tokenize(add_bos=True, special=<case>); text_back = "
                  "detokenize(ids after the BOS, special=True)",
        "versions": {"python": platform.python_version(),
                     "llama_cpp_python": llama_cpp.__version__},
        "model": {"file": os.path.basename(args.model), "sha256": sha, "bos": int(bos)},
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(to_json(doc))
        f.write("\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
