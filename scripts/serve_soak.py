#!/usr/bin/env python3
"""serve_soak.py KVSCOPE [MINUTES] [CLIENTS] — a soak of `kvscope serve`: CLIENTS threads
send short completions (streamed and not, chat and not, some with n=2, some cut off by
their client) for MINUTES, and the server's resident memory (VmRSS) is printed at the
start and every half minute. Ends with the counts, the RSS growth and /health, and exit
status 1 if a request failed or blocks were left in use."""
import http.client
import json
import random
import subprocess
import sys
import threading
import time

kvscope = sys.argv[1]
minutes = float(sys.argv[2]) if len(sys.argv) > 2 else 2
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 8
proc = subprocess.Popen([kvscope, "serve", "--port", "0", "--threads", "2", "--ctx", "1024"],
                        stdout=subprocess.PIPE, text=True)
port = int(proc.stdout.readline().split("http://", 1)[1].split(" ")[0].rsplit(":", 1)[1])


def rss_mib():
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0


def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("GET", path)
    return json.loads(c.getresponse().read())


counts = {"ok": 0, "cut": 0, "failed": 0}
lock = threading.Lock()
stop_at = time.time() + minutes * 60
prompts = ["The capital of France is", "1, 2, 3, 4, 5, 6,", "List three colors:",
           "Once upon a time, in a small village by the sea,", "def fibonacci(n):"]


def client(seed):
    rng = random.Random(seed)
    while time.time() < stop_at:
        chat = rng.random() < 0.3
        body = {"max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.8]),
                "seed": rng.randint(0, 1000), "n": rng.choice([1, 1, 1, 2]),
                "stream": rng.random() < 0.5}
        p = rng.choice(prompts)
        if chat:
            body["messages"] = [{"role": "user", "content": p}]
        else:
            body["prompt"] = p
        cut = rng.random() < 0.1
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                      body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if cut:
                r.readline()
                c.sock.close()
                kind = "cut"
            else:
                data = r.read()
                kind = "ok" if r.status == 200 and (b"[DONE]" in data or b"choices" in data) else "failed"
            c.close()
        except Exception:  # noqa: BLE001
            kind = "failed"
        with lock:
            counts[kind] += 1


start_rss = rss_mib()
print(f"start: {start_rss:.1f} MiB resident", flush=True)
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
t0 = time.time()
for t in threads:
    t.start()
next_print = t0 + 30
while any(t.is_alive() for t in threads):
    time.sleep(0.5)
    if time.time() >= next_print:
        next_print += 30
        print(f"{(time.time() - t0) / 60:.1f} min: {rss_mib():.1f} MiB resident, {counts}",
              flush=True)
for t in threads:
    t.join()
time.sleep(1)
h = get("/health")
end_rss = rss_mib()
print(f"end: {end_rss:.1f} MiB resident ({end_rss - start_rss:+.1f}), {counts}, health {h}")
proc.terminate()
proc.wait()
print(f"exit status {proc.returncode}")
sys.exit(1 if counts["failed"] or h["pool"]["used"] or proc.returncode else 0)
