"""serve_common.py — what the `kvscope serve` tests share (serve_test.py, openai_client_test.py).

Each test runs as `python3 tests/cli/NAME.py KVSCOPE ...`, so this folder is on sys.path and
`import serve_common` finds this file (openai_client_test.py re-runs itself in the openai
venv by its absolute path: the same folder).
  - SLOW: how much longer every wait may be (KVSCOPE_TEST_SLOW; sanitizer builds run the
    model 10-60x slower);
  - check(cond, what): a check that fails the test at its end (failures) without stopping it;
  - start_server(kvscope, *args): `kvscope serve` on a free local port, exit 77 (skipped)
    when kvscope was built without serve;
  - wait_health(port): GET /health until the server answers.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

SLOW = float(os.environ.get("KVSCOPE_TEST_SLOW", "1"))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def start_server(kvscope, *args):
    """Starts `kvscope serve --port 0 --threads 2 ARGS`; returns (process, port, context)
    from the line it prints when it listens. Exits the test when it does not start."""
    proc = subprocess.Popen([kvscope, "serve", "--port", "0", "--threads", "2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        err = proc.stderr.read()
        if "built without cpp-httplib" in err:
            print("[  SKIPPED ] kvscope was built without serve:", err.strip())
            sys.exit(77)
        print("FAIL: the server did not start:", line, err)
        sys.exit(1)
    port = int(line.split("http://", 1)[1].split(" ", 1)[0].rsplit(":", 1)[1])
    context = int(line.rsplit("context ", 1)[1].split(")", 1)[0])
    return proc, port, context


def wait_health(port):
    """GET /health until it answers (the server prints its line before it accepts); its JSON."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.time() + 30 * SLOW
    while True:
        try:
            with direct.open(f"http://127.0.0.1:{port}/health", timeout=10 * SLOW) as r:
                return json.loads(r.read())
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
