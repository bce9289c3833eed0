#!/usr/bin/env python3
"""serve_test.py KVSCOPE — `kvscope serve` on the default model, driven over HTTP.

Starts the server on a free local port (--port 0) and checks, with the standard library's
HTTP client:
  - a non-streamed completion at temperature 0 equals `kvscope generate` (greedy) for the
    same prompt and max_tokens: a sequence served in the batch is the sequence alone; the
    same for a chat completion against `generate --chat`;
  - streamed chunks (server-sent events) concatenate to the non-streamed text and end with
    a finish_reason and `data: [DONE]`; chat chunks carry the assistant role, then deltas;
  - n=2 with a seed gives two choices, and the same seed the same two texts;
  - a stop string ends the text before it (trimmed, finish_reason "stop");
  - logprobs (completions) and logprobs/top_logprobs (chat) come in OpenAI's shapes;
  - 32 concurrent streaming requests all complete, each with the greedy text;
  - a burst of 32 new connections while the server cannot accept (SIGSTOP): the kernel
    completes every handshake (the listen backlog holds them all), and each is served;
  - each bad request is a 4xx in OpenAI's error shape (malformed JSON, wrong types, a body
    over --max-body-kib, max_tokens beyond the context, an unknown model, an empty prompt,
    invalid UTF-8, n out of range, ...), and the server serves the next request;
  - the queue limit: with --max-queue requests in flight, one more gets 429;
  - a client that disconnects mid-stream, or while a whole answer is computed, is
    cancelled: the pool's used blocks return to 0 (GET /health) and its invariants hold;
  - presence, frequency and repetition penalties change a greedy completion;
  - SIGTERM with a request in flight: the process exits 0 (under ASan: with no leak);
  - --host 0.0.0.0 listens with a warning; SIGINT on an idle server exits 0.
Exit status 0 when every check passed, 1 otherwise, 77 when kvscope was built without serve.
"""
import http.client
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from serve_common import SLOW, check, failures, start_server

KVSCOPE = sys.argv[1]


class Client:
    def __init__(self, port):
        self.port = port

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout * SLOW)

    def request(self, method, path, body=None, raw=None):
        c = self.conn()
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        try:
            return r.status, json.loads(text)
        except json.JSONDecodeError:
            return r.status, text

    def post(self, path, body):
        return self.request("POST", path, body)

    def health(self):
        return self.request("GET", "/health")[1]

    def stream(self, path, body):
        """Opens a streamed request; returns (connection, response)."""
        c = self.conn()
        c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
                  headers={"Content-Type": "application/json"})
        return c, c.getresponse()


def read_events(resp):
    """The JSON objects of a server-sent event stream, and whether it ended with [DONE]."""
    events, done = [], False
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        events.append(json.loads(data))
    return events, done


def generate(prompt, max_tokens, chat=False):
    cmd = [KVSCOPE, "generate", "--prompt", prompt, "--max-tokens", str(max_tokens),
           "--threads", "2", "--kv-keep", "full", "--json"]
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["text"]


def wait_pool_empty(cl, what):
    deadline = time.time() + 60 * SLOW
    h = cl.health()
    while time.time() < deadline:
        h = cl.health()
        if h["pool"]["used"] == 0 and h["in_flight"] == 0 and h["running"] == 0:
            break
        time.sleep(0.1)
    check(h["pool"]["used"] == 0 and h["in_flight"] == 0,
          f"{what}: blocks still used or requests in flight: {h}")
    check(h["pool_check"] == "ok", f"{what}: pool invariants: {h['pool_check']}")
    return h


def test_greedy_and_stream(cl):
    prompt, n = "The capital of France is", 12
    want = generate(prompt, n)
    st, r = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
    if check(st == 200, f"completion: status {st}: {r}"):
        check(r["object"] == "text_completion" and len(r["choices"]) == 1, f"completion shape: {r}")
        got = r["choices"][0]["text"]
        check(got == want, f"served '{got}' but generate alone wrote '{want}'")
        check(r["usage"]["completion_tokens"] == n and r["choices"][0]["finish_reason"] == "length",
              f"usage / finish_reason: {r}")
        check(r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + n, f"usage: {r['usage']}")
    c, resp = cl.stream("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
    check(resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream"),
          f"stream: status {resp.status} {resp.getheader('Content-Type')}")
    events, done = read_events(resp)
    c.close()
    text = "".join(e["choices"][0]["text"] for e in events)
    check(done, "stream: no data: [DONE]")
    check(text == want, f"stream chunks make '{text}', not '{want}'")
    check(len(events) >= 2 and events[-1]["choices"][0]["finish_reason"] == "length"
          and all(e["choices"][0]["finish_reason"] is None for e in events[:-1]),
          f"stream: finish_reason only on the last chunk: {events[-2:]}")

    # The answer ends within max_tokens: `generate` shows the end-of-text token that ends
    # it (<|im_end|>), the served text stops before it, with finish_reason "stop".
    question = "What is the capital of France?"
    shown = generate(question, n, chat=True)
    check(shown.endswith("<|im_end|>"), f"generate --chat ends with <|im_end|>: {shown!r}")
    want = shown.removesuffix("<|im_end|>")
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": question}],
            "max_tokens": n, "temperature": 0}
    st, r = cl.post("/v1/chat/completions", body)
    if check(st == 200, f"chat: status {st}: {r}"):
        check(r["object"] == "chat.completion", f"chat object: {r['object']}")
        m = r["choices"][0]["message"]
        check(m["role"] == "assistant" and m["content"] == want
              and r["choices"][0]["finish_reason"] == "stop",
              f"chat served {r['choices'][0]} but generate --chat wrote {shown!r}")
    c, resp = cl.stream("/v1/chat/completions", body)
    events, done = read_events(resp)
    c.close()
    check(done and events and events[0]["object"] == "chat.completion.chunk", "chat stream shape")
    check(events and events[0]["choices"][0]["delta"].get("role") == "assistant",
          f"chat stream: the first delta names the role: {events[:1]}")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    check(text == want, f"chat stream makes '{text}', not '{want}'")


def test_samples_stop_logprobs(cl):
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0.9, "seed": 42, "n": 2}
    st, r = cl.post("/v1/completions", body)
    if check(st == 200, f"n=2: status {st}: {r}"):
        check([c["index"] for c in r["choices"]] == [0, 1], f"n=2: choices {r['choices']}")
        st2, r2 = cl.post("/v1/completions", body)
        check(st2 == 200 and [c["text"] for c in r2["choices"]] == [c["text"] for c in r["choices"]],
              "n=2: the same seed gives the same texts")
        check(r["usage"]["completion_tokens"] == sum(1 for _ in range(2)) * 10
              or all(c["finish_reason"] == "stop" for c in r["choices"]), f"n=2 usage: {r['usage']}")
    c, resp = cl.stream("/v1/completions", body)
    events, done = read_events(resp)
    c.close()
    if st == 200:
        for k in (0, 1):
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == k)
            check(text == r["choices"][k]["text"], f"n=2 stream: choice {k} '{text}'")

    prompt = "The capital of France is"
    st, r = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})
    full = r["choices"][0]["text"] if st == 200 else ""
    stop = full[4:8] if len(full) >= 8 else ""
    if check(len(stop) == 4 and stop.strip(), f"a stop string from '{full}'"):
        want = full[: full.index(stop)]
        for stream in (False, True):
            body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stop": ["\u2603", stop]}
            if stream:
                c, resp = cl.stream("/v1/completions", body)
                events, _ = read_events(resp)
                c.close()
                text = "".join(e["choices"][0]["text"] for e in events)
                reason = events[-1]["choices"][0]["finish_reason"] if events else None
            else:
                st, r = cl.post("/v1/completions", body)
                text, reason = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
            check(text == want and reason == "stop",
                  f"stop '{stop}' (stream {stream}): '{text}' ({reason}), want '{want}'")

    st, r = cl.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                        "logprobs": 2})
    if check(st == 200, f"logprobs: {st} {r}"):
        lp = r["choices"][0]["logprobs"]
        check(len(lp["tokens"]) == 4 and len(lp["token_logprobs"]) == 4
              and all(len(t) == 2 for t in lp["top_logprobs"])
              and all(x <= 0 for x in lp["token_logprobs"])
              and "".join(lp["tokens"]) == r["choices"][0]["text"].lstrip() or
              "".join(lp["tokens"]).strip() == r["choices"][0]["text"].strip(),
              f"completion logprobs: {lp}")
    st, r = cl.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                             "max_tokens": 3, "temperature": 0,
                                             "logprobs": True, "top_logprobs": 3})
    if check(st == 200, f"chat logprobs: {st} {r}"):
        content = r["choices"][0]["logprobs"]["content"]
        check(len(content) == r["usage"]["completion_tokens"]
              and all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in content)
              and all(t["top_logprobs"][0]["logprob"] >= t["logprob"] for t in content),
              f"chat logprobs: {content}")


def test_concurrency(cl, count=32):
    prompt, n = "List three colors:", 6
    want = generate(prompt, n)
    results = [None] * count

    def one(i):
        try:
            c, resp = cl.stream("/v1/completions", {"prompt": prompt, "max_tokens": n,
                                                    "temperature": 0})
            events, done = read_events(resp)
            c.close()
            results[i] = ("".join(e["choices"][0]["text"] for e in events), done)
        except Exception as e:  # noqa: BLE001 (reported as a failure)
            results[i] = (repr(e), False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sum(1 for r in results if r and r[1] and r[0] == want)
    check(ok == count, f"{count} concurrent streams: {ok} ended with the greedy text "
          f"'{want}'; e.g. {[r for r in results if not r or r[0] != want][:2]}")
    wait_pool_empty(cl, "after the concurrent streams")


def test_connection_burst(proc, port, count=32):
    """A burst of new connections is queued by the kernel, none left waiting: with the server
    stopped (SIGSTOP: its accept loop cannot run) all `count` handshakes complete within half
    a second, since the listen backlog holds them (httplib's own backlog of 5 held 6 and
    left the rest to SYN retransmissions, and under load some of those clients were reset);
    after SIGCONT each connection gets its /health."""
    socks = []
    proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(count):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
        pending, deadline = set(socks), time.time() + 0.5
        while pending and time.time() < deadline:
            _, writable, _ = select.select([], list(pending), [], 0.05)
            for s in writable:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    pending.discard(s)
    finally:
        proc.send_signal(signal.SIGCONT)
    check(not pending, f"a burst of {count} connections to a stopped server: "
          f"{count - len(pending)} handshakes completed (the listen backlog is too short)")
    # Every request first (httplib closes a connection that sends nothing for 5 s), then
    # every answer.
    sent = []
    for s in socks:
        try:
            s.setblocking(True)
            s.settimeout(30 * SLOW)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            sent.append(s)
        except OSError as e:
            print("burst: send:", repr(e), flush=True)
    served = 0
    for s in sent:
        try:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            served += data.startswith(b"HTTP/1.1 200")
        except OSError as e:
            print("burst: receive:", repr(e), flush=True)
    for s in socks:
        s.close()
    check(served == count, f"a burst of {count} connections: {served} got /health")


def test_errors(cl, context):
    def expect(status, what, body=None, raw=None, path="/v1/completions", param=None, code=None):
        st, r = cl.request("POST", path, body=body, raw=raw)
        ok = (st == status and isinstance(r, dict) and isinstance(r.get("error"), dict)
              and isinstance(r["error"].get("message"), str) and r["error"]["message"]
              and {"type", "param", "code"} <= set(r["error"]))
        if ok and param is not None:
            ok = r["error"]["param"] == param
        if ok and code is not None:
            ok = r["error"]["code"] == code
        check(ok, f"{what}: want {status} (param {param}, code {code}), got {st}: {r}")

    good = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
    expect(400, "malformed JSON", raw=b'{"prompt": "Hello", "max_tokens": ')
    expect(400, "not an object", raw=b'[1, 2]')
    expect(400, "max_tokens a string", dict(good, max_tokens="8"), param="max_tokens")
    expect(400, "temperature a string", dict(good, temperature="hot"), param="temperature")
    expect(400, "temperature out of range", dict(good, temperature=-1), param="temperature")
    expect(400, "stream not a boolean", dict(good, stream="yes"), param="stream")
    expect(400, "stop a number", dict(good, stop=5), param="stop")
    expect(400, "five stop strings", dict(good, stop=["a", "b", "c", "d", "e"]), param="stop")
    expect(413, "a body over --max-body-kib", raw=json.dumps(dict(good, prompt="x" * 80000)).encode(),
           code="request_too_large")
    expect(400, "max_tokens beyond the context", dict(good, max_tokens=context + 1),
           param="max_tokens")
    expect(400, "max_tokens + prompt beyond the context",
           dict(good, prompt="Hello there, how are you", max_tokens=context - 2),
           param="max_tokens", code="context_length_exceeded")
    expect(400, "max_tokens 0", dict(good, max_tokens=0), param="max_tokens")
    expect(404, "an unknown model", dict(good, model="gpt-4"), param="model", code="model_not_found")
    expect(400, "an empty prompt", dict(good, prompt=""), param="prompt")
    expect(400, "no prompt", {"max_tokens": 2}, param="prompt")
    expect(400, "invalid UTF-8", raw=b'{"prompt": "caf\xe9 \xff", "max_tokens": 2}',
           code="invalid_utf8")
    expect(400, "a lone surrogate escape", raw=b'{"prompt": "a\\ud800b", "max_tokens": 2}')
    expect(400, "n = 0", dict(good, n=0), param="n")
    expect(400, "n = 100", dict(good, n=100), param="n")
    expect(400, "logprobs = 6", dict(good, logprobs=6), param="logprobs")
    expect(400, "presence_penalty = 3", dict(good, presence_penalty=3), param="presence_penalty")
    expect(400, "chat without messages", {"max_tokens": 2}, path="/v1/chat/completions",
           param="messages")
    expect(400, "chat message with a bad role",
           {"messages": [{"role": "wizard", "content": "hi"}]}, path="/v1/chat/completions",
           param="messages[0].role")
    expect(400, "chat content a number", {"messages": [{"role": "user", "content": 7}]},
           path="/v1/chat/completions", param="messages[0].content")
    expect(400, "chat logprobs a string",
           {"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"},
           path="/v1/chat/completions", param="logprobs")
    expect(404, "an unknown route", good, path="/v1/embeddings")
    # Still serving.
    st, r = cl.post("/v1/completions", good)
    check(st == 200 and r["choices"][0]["text"], f"after the bad requests: {st} {r}")
    st, r = cl.request("GET", "/v1/models")
    check(st == 200 and r["object"] == "list" and r["data"][0]["object"] == "model",
          f"/v1/models: {st} {r}")


def test_queue_limit_and_disconnect(cl, max_queue):
    # Counting goes on: no end-of-text token cuts these streams short.
    body = {"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 400, "temperature": 0}
    # One stream, read a few chunks, then gone: its blocks return.
    c, resp = cl.stream("/v1/completions", body)
    for _ in range(3):
        resp.readline()
    h = cl.health()
    check(h["pool"]["used"] > 0 and h["running"] == 1, f"a running stream holds blocks: {h}")
    before = h["cancelled"]
    c.sock.close()
    c.close()
    h = wait_pool_empty(cl, "after a client disconnected mid-stream")
    check(h["cancelled"] == before + 1, f"the disconnected request was cancelled: {h}")

    # max_queue requests in flight, then one more is refused with 429.
    open_streams = []
    for _ in range(max_queue):
        open_streams.append(cl.stream("/v1/completions", body))
    st, r = cl.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    check(st == 429 and r["error"]["code"] == "queue_full", f"over the queue limit: {st} {r}")
    for c, resp in open_streams:
        check(resp.status == 200, f"a stream within the queue limit: {resp.status}")
        c.sock.close()
        c.close()
    wait_pool_empty(cl, "after every queued client disconnected")
    st, r = cl.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0})
    check(st == 200, f"after the queue drained: {st} {r}")


def test_whole_answer_disconnect_and_penalties(cl):
    # A non-streamed request whose client leaves: the server's next write (a space while
    # the answer is computed) fails and the request is cancelled.
    before = cl.health()["cancelled"]
    c = cl.conn()
    c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 400,
                               "temperature": 0}).encode())
    deadline = time.time() + 30 * SLOW
    while time.time() < deadline and cl.health()["running"] == 0:
        time.sleep(0.05)
    c.sock.close()
    c.close()
    h = wait_pool_empty(cl, "after a client of a whole answer disconnected")
    check(h["cancelled"] == before + 1, f"the whole answer's request was cancelled: {h}")

    # The penalties reach the sampler: counting with a frequency penalty goes elsewhere.
    body = {"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 16, "temperature": 0}
    texts = []
    for extra in ({}, {"frequency_penalty": 2}, {"presence_penalty": 2},
                  {"repetition_penalty": 3}):
        st, r = cl.post("/v1/completions", dict(body, **extra))
        texts.append(r["choices"][0]["text"] if st == 200 else f"status {st}")
    check(all(t != texts[0] for t in texts[1:]) and not any(t.startswith("status") for t in texts),
          f"penalties change greedy counting: {texts}")


def test_sigterm(proc, cl):
    result = {}

    def long_request():
        try:
            result["r"] = cl.post("/v1/completions", {"prompt": "1, 2, 3, 4, 5, 6,",
                                                      "max_tokens": 300, "temperature": 0})
        except Exception as e:  # noqa: BLE001
            result["r"] = (0, repr(e))

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.time() + 30 * SLOW
    while time.time() < deadline and cl.health()["running"] == 0:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60 * SLOW)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        check(False, "SIGTERM: the server did not exit within a minute")
    t.join(timeout=30)
    check(proc.returncode == 0, f"SIGTERM: exit status {proc.returncode}; stderr: {err[-2000:]}")
    check("stopped" in out, f"SIGTERM: no 'stopped' line: {out!r}")
    st, r = result.get("r", (0, None))
    # Finished within the grace period, or ended by the shutdown with an error body.
    check(st == 200 and isinstance(r, dict) and ("choices" in r or "error" in r),
          f"SIGTERM: the request in flight got {st} {r}")


def test_host_warning_and_sigint():
    # Another address only when asked, and then a warning; SIGINT on an idle server
    # exits 0 at once.
    proc, port, _ = start_server(KVSCOPE, "--host", "0.0.0.0")
    h = Client(port).health()
    check(h["status"] == "ok", f"--host 0.0.0.0: /health {h}")
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30 * SLOW)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    check(proc.returncode == 0, f"SIGINT: exit status {proc.returncode}: {err[-2000:]}")
    check("warning: listening on 0.0.0.0" in err, f"--host 0.0.0.0 gives no warning: {err!r}")


def main():
    max_queue = 32
    proc, port, _ = start_server(KVSCOPE, "--max-queue", str(max_queue), "--max-body-kib", "64",
                                 "--max-seqs", "16", "--ctx", "1024", "--shutdown-grace", "1")
    cl = Client(port)
    try:
        h = cl.health()
        check(h["status"] == "ok" and h["pool"]["used"] == 0, f"/health at start: {h}")
        test_connection_burst(proc, port)
        test_greedy_and_stream(cl)
        test_samples_stop_logprobs(cl)
        test_errors(cl, 1024)
        # 32 streams in the release build; 8 under a sanitizer (the same code paths, a
        # tenth of its time: the release stage runs the 32).
        test_concurrency(cl, 32 if SLOW == 1 else 8)
        test_queue_limit_and_disconnect(cl, max_queue)
        test_whole_answer_disconnect_and_penalties(cl)
        wait_pool_empty(cl, "at the end")
        test_sigterm(proc, cl)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    test_host_warning_and_sigint()
    if failures:
        print(f"serve: {len(failures)} checks failed")
        return 1
    print("serve: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
