"""What the HTTP layer costs, measured against the fake engine, for one or more checkouts at once.

    python scripts/bench/http_overhead.py [--checkouts=LABEL=PATH,...] [--requests=200]
        [--clients=300] [--big_prompt_mb=10] [--json_out=FILE]

For each checkout, starts ``python -m helios_jax.serve --engine=fake --port=<free>`` with that
checkout first on PYTHONPATH (so ``--checkouts=before=/work/main,after=.`` compares two versions
of the server in one run, with the same client and machine state), then measures:

1. **Reused connection**: the median (and p90) latency of a tiny non-streaming completion
   (``max_tokens=1``) through the ``openai`` client, which keeps its connection alive, over
   --requests requests after 20 warm-up ones; the same completion and ``GET /health`` with a
   bare ``http.client`` connection (no client library to speak of). The fake engine's own part
   (submit to final event, measured in this process) is printed too: the rest of the bare
   completion's latency is what the HTTP layer adds.
2. **A burst of clients**: --clients asyncio connections opened at once, each sending a
   streaming completion (16 tokens, ``Connection: close``) and reading to the end; a connection
   that is reset or refused, or ends without ``data: [DONE]``, counts as failed.
3. **The HTTP layer alone** (checkouts whose ``HeliosServer`` has ``start()``): the same bare
   ``http.client`` completion against a server whose engine answers inside ``submit`` (no
   thread, no waiting: :data:`INSTANT_SERVER`), so the latency is the HTTP layer's and the
   client's only. The fake engine starts a thread per request, which costs about 0.5 ms more
   inside a busy server process than it does alone.
4. **A huge prompt**: a --big_prompt_mb MB prompt is posted while ``/health`` is polled every
   5 ms; the largest ``/health`` latency during it says how long the huge request stalled
   everything else, and its status how it was answered.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("checkouts", ["this=."], "LABEL=PATH pairs: each PATH goes first on PYTHONPATH")
flags.DEFINE_integer("requests", 200, "measured requests on the reused connection")
flags.DEFINE_integer("clients", 300, "connections of the burst")
flags.DEFINE_float("big_prompt_mb", 10.0, "size of the huge prompt, in MB (0: skip)")
flags.DEFINE_string("json_out", None, "write the results here as JSON")


def start_server(path: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "helios_jax.serve", "--engine=fake", "--port=0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=os.path.abspath(path),
    )
    url = None
    for line in proc.stdout:
        match = re.search(r"listening on (http://\S+)", line)
        url = match.group(1) if match else url
        if "[3/3] ready" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, url
    raise RuntimeError(f"the server at {path} did not start")


def engine_latency_ms(n: int = 200) -> float:
    """The fake engine's own median time from submit to the final event, in this process."""
    from helios_jax.runtime.api import GenerationRequest, SamplingParams
    from helios_jax.serve.fake import FakeEngine

    engine, times = FakeEngine(), []
    for i in range(n):
        start = time.perf_counter()
        list(engine.submit(GenerationRequest(str(i), (97,), SamplingParams(max_tokens=1))))
        times.append(time.perf_counter() - start)
    engine.shutdown()
    return statistics.median(times) * 1e3


INSTANT_SERVER = """
import sys, time
from helios_jax.runtime.api import RequestStream, StreamEvent
from helios_jax.serve.app import HeliosServer, make_server
from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.flags import ServerConfig

class Instant(FakeEngine):
    def submit(self, request):
        stream = RequestStream(request.request_id)
        stream.put(StreamEvent("T", (84,), "length", len(request.prompt_tokens), 1))
        return stream

if not hasattr(HeliosServer, "start"):
    print("unsupported", flush=True)
    sys.exit(0)
server = make_server(ServerConfig(port=0, engine="fake"), Instant())
server.start()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
"""


def instant_engine(path: str, n: int) -> dict | None:
    """Bare http.client latencies against INSTANT_SERVER run from `path` (None: unsupported)."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", INSTANT_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.abspath(path),  # `-c` puts the working directory first on sys.path
    )
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            return None
        tiny = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
        return {
            "raw_health_ms": raw_median_ms(url, "GET", "/health", None, n),
            "raw_completion_ms": raw_median_ms(url, "POST", "/v1/completions", tiny, n),
        }
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def raw_median_ms(url: str, method: str, path: str, body: bytes | None, n: int) -> float:
    """Median latency of one request on a reused http.client connection (no client library)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    times = []
    for i in range(n + 20):
        start = time.perf_counter()
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        if i >= 20:
            times.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(times) * 1e3


def reused_connection(url: str, n: int) -> dict:
    import openai

    tiny = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
    raw = {
        "raw_health_ms": raw_median_ms(url, "GET", "/health", None, n),
        "raw_completion_ms": raw_median_ms(url, "POST", "/v1/completions", tiny, n),
    }
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        times = []
        for i in range(n + 20):
            start = time.perf_counter()
            client.completions.create(model="helios-fake", prompt="a", max_tokens=1)
            if i >= 20:
                times.append(time.perf_counter() - start)
    times.sort()
    return {"median_ms": statistics.median(times) * 1e3, "p90_ms": times[int(0.9 * len(times))] * 1e3, **raw}


async def one_client(host: str, port: int, request: bytes) -> bool:
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1), timeout=120)
        writer.close()
        return b"data: [DONE]" in data
    except (TimeoutError, OSError):
        return False


async def burst(url: str, clients: int) -> dict:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"prompt": "a", "max_tokens": 16, "stream": True}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    start = time.perf_counter()
    results = await asyncio.gather(*(one_client(host, int(port), request) for _ in range(clients)))
    return {"failed": results.count(False), "of": clients, "seconds": time.perf_counter() - start}


def big_prompt(url: str, megabytes: float) -> dict:
    body = json.dumps({"prompt": "a" * int(megabytes * 1e6), "max_tokens": 1}).encode()
    outcome: dict = {}

    def post() -> None:
        req = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                outcome["status"] = r.status
        except urllib.error.HTTPError as e:
            outcome["status"] = e.code
            outcome["code"] = json.load(e).get("error", {}).get("code")
        outcome["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=post)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        start = time.perf_counter()
        urllib.request.urlopen(f"{url}/health", timeout=300).close()
        worst = max(worst, time.perf_counter() - start)
        time.sleep(0.005)
    thread.join()
    return {**outcome, "max_health_ms": worst * 1e3}


def measure(label: str, path: str) -> dict:
    proc, url = start_server(path)
    try:
        result = {"label": label, "path": path, "reused": reused_connection(url, FLAGS.requests)}
        result["burst"] = asyncio.run(burst(url, FLAGS.clients))
        if FLAGS.big_prompt_mb > 0:
            result["big_prompt"] = big_prompt(url, FLAGS.big_prompt_mb)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result["instant"] = instant_engine(path, FLAGS.requests)
    return result


def main(argv) -> None:
    del argv
    results = [measure(*pair.split("=", 1)) for pair in FLAGS.checkouts]
    print(f"fake engine alone: submit to final event, median {engine_latency_ms():.3f} ms")
    for r in results:
        reused, b = r["reused"], r["burst"]
        print(
            f"{r['label']:>8}: reused connection median {reused['median_ms']:.2f} ms "
            f"(p90 {reused['p90_ms']:.2f}); http.client: completion {reused['raw_completion_ms']:.2f} ms, "
            f"/health {reused['raw_health_ms']:.2f} ms; burst: {b['failed']} of {b['of']} connections "
            f"failed ({b['seconds']:.1f} s)"
        )
        if r["instant"] is not None:
            i = r["instant"]
            print(
                f"          engine answering in submit: completion {i['raw_completion_ms']:.2f} ms, "
                f"/health {i['raw_health_ms']:.2f} ms"
            )
        if "big_prompt" in r:
            big = r["big_prompt"]
            print(
                f"          {FLAGS.big_prompt_mb:g} MB prompt: {big.get('status')} {big.get('code') or ''} "
                f"after {big['seconds']:.2f} s; slowest /health meanwhile {big['max_health_ms']:.1f} ms"
            )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    app.run(main)
