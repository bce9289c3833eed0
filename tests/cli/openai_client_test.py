#!/usr/bin/env python3
"""openai_client_test.py KVSCOPE VENV_PYTHON — `kvscope serve` driven by OpenAI's own client.

The `openai` package from PyPI (pinned with hashes in scripts/openai-requirements.txt,
installed by scripts/setup.sh into the venv whose python is VENV_PYTHON; this script
re-runs itself there) talks to `kvscope serve`, started here on a free local port with
the default model. It checks, through the client's own types:
  - models.list() names the served model, and requests naming it are served;
  - completions at temperature 0, whole and streamed (the deltas joined), on two prompts:
    the text equals `kvscope generate --temp 0` for the same prompt and token count, with
    finish_reason and usage as they should be;
  - chat completions, whole and streamed: the text equals `kvscope generate --chat`'s;
    a stream with stream_options.include_usage ends with a usage chunk;
  - logprobs come back in the client's shapes (completions: tokens / token_logprobs /
    top_logprobs; chat: content[].top_logprobs), the chosen token the most likely one;
  - 32 concurrent streams (AsyncOpenAI) all complete with the greedy text and a
    finish_reason;
  - errors raise the client's exceptions with the server's message, param and code
    (max_tokens beyond the context: BadRequestError, streamed or not; an unknown model:
    NotFoundError), and the server then serves the next request;
  - SIGTERM on the idle server: exit status 0.
Exit status 0 when every check passed, 1 otherwise (a missing venv included: scripts/setup.sh
makes it), 77 when kvscope was built without serve.
"""
import os
import signal
import subprocess
import sys

KVSCOPE, VENV_PYTHON = sys.argv[1], sys.argv[2]

# Run in the venv (its pinned openai), whatever python3 ctest started.
if os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(VENV_PYTHON))):
    if not os.path.exists(VENV_PYTHON):
        print(f"FAIL: no openai client venv at {os.path.dirname(os.path.dirname(VENV_PYTHON))}: "
              "scripts/setup.sh makes it (python3 -m venv, then pip install --require-hashes "
              "-r scripts/openai-requirements.txt); its output says why it could not", flush=True)
        sys.exit(1)
    os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__), *sys.argv[1:]])

import asyncio  # noqa: E402
import json  # noqa: E402

import openai  # noqa: E402

from serve_common import SLOW, check, failures, start_server, wait_health  # noqa: E402

ENDS = ("<|im_end|>", "<|endoftext|>")


def generate(prompt, max_tokens, chat=False):
    """`kvscope generate` greedy: (its text without the end-of-text token it shows, whether
    that token ended it)."""
    cmd = [KVSCOPE, "generate", "--prompt", prompt, "--max-tokens", str(max_tokens),
           "--temp", "0", "--threads", "2", "--kv-keep", "full", "--json"]
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    text = json.loads(out.strip().splitlines()[-1])["text"]
    for end in ENDS:
        if text.endswith(end):
            return text.removesuffix(end), True
    return text, False


def test_models(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(ids == ["SmolLM2-135M-Instruct.Q4_1"] and models.data[0].owned_by == "kvscope",
          f"models.list(): {models}")
    return ids[0] if ids else "smollm2-135m"


def test_completions(client, model, prompts, n):
    for prompt in prompts:
        want, stopped = generate(prompt, n)
        reason = "stop" if stopped else "length"
        r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0)
        c = r.choices[0]
        check(r.object == "text_completion" and len(r.choices) == 1 and r.model == model,
              f"completion shape: {r}")
        check(c.text == want, f"completion of {prompt!r}: served {c.text!r}, generate wrote {want!r}")
        check(c.finish_reason == reason, f"completion of {prompt!r}: finish_reason {c.finish_reason}")
        check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
              and (stopped or r.usage.completion_tokens == n), f"completion usage: {r.usage}")

        chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=n,
                                                temperature=0, stream=True))
        text = "".join(ch.choices[0].text for ch in chunks)
        check(text == want, f"streamed completion of {prompt!r}: {text!r}, generate wrote {want!r}")
        check(len(chunks) >= 2 and chunks[-1].choices[0].finish_reason == reason
              and all(ch.choices[0].finish_reason is None for ch in chunks[:-1]),
              f"streamed completion: finish_reason only on the last chunk: {chunks[-2:]}")


def test_chat(client, model, n):
    question = "What is the capital of France?"
    want, stopped = generate(question, n, chat=True)
    reason = "stop" if stopped else "length"
    messages = [{"role": "user", "content": question}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=n, temperature=0)
    m = r.choices[0].message
    check(r.object == "chat.completion" and m.role == "assistant", f"chat shape: {r}")
    check(m.content == want, f"chat: served {m.content!r}, generate --chat wrote {want!r}")
    check(r.choices[0].finish_reason == reason, f"chat finish_reason: {r.choices[0].finish_reason}")

    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=n,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    with_choice = [ch for ch in chunks if ch.choices]
    check(all(ch.object == "chat.completion.chunk" for ch in chunks)
          and with_choice and with_choice[0].choices[0].delta.role == "assistant",
          f"chat stream: the first delta names the role: {chunks[:1]}")
    text = "".join(ch.choices[0].delta.content or "" for ch in with_choice)
    check(text == want, f"streamed chat: {text!r}, generate --chat wrote {want!r}")
    check(with_choice and with_choice[-1].choices[0].finish_reason == reason,
          f"streamed chat finish_reason: {with_choice[-1:]}")
    check(not chunks[-1].choices and chunks[-1].usage is not None
          and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          f"streamed chat: the last chunk carries the usage: {chunks[-1]}")


def test_logprobs(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    ok = (lp is not None and len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
          and len(lp.top_logprobs) == 4 and "".join(lp.tokens) == r.choices[0].text)
    if check(ok, f"completion logprobs: {lp}"):
        for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            check(len(top) == 2 and val <= 0 and abs(max(top.values()) - val) < 1e-4,
                  f"completion logprobs: greedy {tok!r} ({val}) is the most likely of {top}")
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=3, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    ok = content is not None and len(content) == r.usage.completion_tokens
    if check(ok, f"chat logprobs: {r.choices[0].logprobs}"):
        for t in content:
            check(len(t.top_logprobs) == 3 and t.logprob <= 0
                  and t.top_logprobs[0].token == t.token
                  and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4,
                  f"chat logprobs: {t}")


def test_concurrent_streams(port, model, count):
    prompt, n = "List three colors:", 6
    want, stopped = generate(prompt, n)
    reason = "stop" if stopped else "length"

    async def one(client):
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=n,
                                                 temperature=0, stream=True)
        text, finish = "", None
        async for ch in stream:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        return text, finish

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                      max_retries=0, timeout=120 * SLOW,
                                      http_client=openai.DefaultAsyncHttpxClient(trust_env=False)
                                      ) as client:
            return await asyncio.gather(*(one(client) for _ in range(count)),
                                        return_exceptions=True)

    results = asyncio.run(run_all())
    ok = sum(1 for r in results if r == (want, reason))
    check(ok == count, f"{count} concurrent streams: {ok} ended with {(want, reason)}; e.g. "
          f"{[r for r in results if r != (want, reason)][:2]}")


def test_errors(client, model, context):
    good = dict(model=model, prompt="Hello", max_tokens=2, temperature=0)
    for stream in (False, True):
        try:
            client.completions.create(**dict(good, max_tokens=context + 1, stream=stream))
            check(False, f"max_tokens beyond the context (stream {stream}): no error")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.param == "max_tokens" and "max_tokens" in e.message,
                  f"max_tokens beyond the context (stream {stream}): {e!r} {e.body}")
    try:
        client.chat.completions.create(model=model, max_tokens=context + 1,
                                       messages=[{"role": "user", "content": "Hi"}])
        check(False, "chat max_tokens beyond the context: no error")
    except openai.BadRequestError as e:
        check(e.param == "max_tokens" and e.message, f"chat max_tokens beyond the context: {e!r}")
    try:
        client.completions.create(**dict(good, model="gpt-4"))
        check(False, "an unknown model: no error")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found" and "gpt-4" in e.message,
              f"an unknown model: {e!r} {e.body}")
    # Still serving.
    r = client.completions.create(**good)
    check(r.choices[0].text and r.choices[0].finish_reason, f"after the errors: {r}")


def main():
    print(f"openai {openai.__version__} on Python {sys.version.split()[0]}", flush=True)
    proc, port, context = start_server(KVSCOPE)
    try:
        h = wait_health(port)
        check(h["status"] == "ok", f"/health at start: {h}")
        # No retries (a failure shows at once); no proxy from the environment (the
        # server is local).
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120 * SLOW,
                               http_client=openai.DefaultHttpxClient(trust_env=False))
        model = test_models(client)
        test_completions(client, model, ["The capital of France is", "Once upon a time, there was"],
                         24)
        test_chat(client, model, 24)
        test_logprobs(client, model)
        # 32 streams in the release build; 8 under a sanitizer (the same code paths, a
        # tenth of its time: the release stage runs the 32).
        test_concurrent_streams(port, model, 32 if SLOW == 1 else 8)
        test_errors(client, model, context)
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60 * SLOW)
        check(proc.returncode == 0, f"SIGTERM: exit status {proc.returncode}: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if failures:
        print(f"openai client: {len(failures)} checks failed")
        return 1
    print("openai client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
