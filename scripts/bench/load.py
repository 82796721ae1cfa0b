"""Load test of the live server with the `openai` package's AsyncOpenAI client.

    python scripts/bench/load.py [--concurrency=1,4,8,16] [--requests_per_worker=2]
        [--max_tokens=64] [--server_args=--concurrency=16] [--server_url=URL]
        [--startup_timeout_s=1500] [--seed=0] [--json_out=FILE] [--plot_dir=DIR] [--tag=NAME]

Starts `python -m helios_jax.serve --port=<free port> <--server_args>` in a subprocess (the
embedded default model, everything else at the server's defaults unless --server_args says
otherwise), waits for `/health`, then, per concurrency level c, runs c asyncio tasks that each
send --requests_per_worker streaming requests back to back (at least 4 requests per level),
alternating completions (`client.completions.create(stream=True)`, a held-out stdlib window as
the prompt) and chat (`client.chat.completions.create(stream=True)`, a question built from a
held-out function). Greedy unless --temperature > 0 (then seeded per request), with
`stream_options={"include_usage": True}` so that output tokens come from the server's usage.

Per level: requests/s and output tokens/s over the level's wall time, time to first content
chunk, the gaps between content chunks, end-to-end latency, and failures (an exception, an
error event, or a finish reason other than "stop"/"length"). A sampler thread reads the server
process's resident set size (psutil, children included) every 0.25 s: after startup (idle), the
peak under load, and at the end. --server_url skips the subprocess (RSS is then not measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
from absl import app, flags
from bench_common import held_out_texts, percentile, summary

FLAGS = flags.FLAGS
flags.DEFINE_list("concurrency", ["1", "4", "8", "16"], "concurrent client tasks per level")
flags.DEFINE_integer("requests_per_worker", 2, "requests each task sends per level (at least 4 per level)")
flags.DEFINE_integer("max_tokens", 64, "max_tokens of every request")
flags.DEFINE_float("temperature", 0.0, "sampling temperature (0: greedy)")
flags.DEFINE_integer("prompt_tokens", 64, "approximate prompt length of the completion requests (tokens)")
flags.DEFINE_string("server_args", "--concurrency=16", "extra flags for python -m helios_jax.serve")
flags.DEFINE_string("server_url", None, "use this running server (http://host:port) instead of starting one")
flags.DEFINE_integer("startup_timeout_s", 1500, "how long to wait for /health (cold compiles take minutes)")
flags.DEFINE_integer("seed", 0, "seed of the prompt choice")
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_string("plot_dir", None, "write PNG plots here (e.g. docs/img)")
flags.DEFINE_string("server_log", "/tmp/helios_load_server.log", "the server's stdout and stderr")
flags.DEFINE_string("tag", "", "suffix of the plot's file name (load_<tag>.png)")

MODEL = "helios-default"  # replaced by the id /v1/models reports


def request_specs(count: int, seed: int) -> list[dict]:
    """Alternating completion and chat requests from held-out text (seeded)."""
    from tokenizers import Tokenizer

    from helios_jax.model.default import default_model_path

    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    rng = np.random.default_rng(seed)
    files = held_out_texts()
    functions = []
    for rel, text in files:
        module = rel[:-3].replace("/", ".")
        for m in re.finditer(r'^\s*def (\w+)\(.*?\):\n\s+"""(.+?)\n', text, re.M):
            functions.append((module, m.group(1), m.group(2).strip().rstrip(".")))
    specs = []
    for i in range(count):
        if i % 2 == 0:
            rel, text = files[int(rng.integers(len(files)))]
            ids = tokenizer.encode(text).ids
            start = int(rng.integers(0, max(1, len(ids) - FLAGS.prompt_tokens)))
            prompt = tokenizer.decode(ids[start : start + FLAGS.prompt_tokens])
            specs.append(dict(kind="completion", prompt=prompt))
        else:
            module, name, doc = functions[int(rng.integers(len(functions)))]
            specs.append(
                dict(
                    kind="chat",
                    messages=[
                        {
                            "role": "user",
                            "content": f"Write the Python function `{name}` of `{module}`: {doc}.",
                        }
                    ],
                )
            )
    return specs


# ---------------------------------------------------------------------------------------------
# The server process and its memory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 0.25):
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process(pid)
        self.period_s = period_s
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def rss(self) -> int:
        total = self.process.memory_info().rss
        for child in self.process.children(recursive=True):
            with contextlib.suppress(Exception):
                total += child.memory_info().rss
        return total

    def run(self):
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append((time.perf_counter(), self.rss()))
            self.stop.wait(self.period_s)

    def peak_between(self, t0: float, t1: float) -> int | None:
        values = [r for t, r in self.samples if t0 <= t <= t1]
        return max(values) if values else None


def start_server(port: int):
    cmd = [
        sys.executable,
        "-m",
        "helios_jax.serve",
        f"--port={port}",
        "--host=127.0.0.1",
        *shlex.split(FLAGS.server_args),
    ]
    log = open(FLAGS.server_log, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return proc, cmd


# ---------------------------------------------------------------------------------------------
# The client


async def one_request(client, spec: dict, index: int) -> dict:
    extra = dict(
        max_tokens=FLAGS.max_tokens,
        temperature=FLAGS.temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    if FLAGS.temperature > 0:
        extra["seed"] = FLAGS.seed * 100003 + index
    record = dict(
        kind=spec["kind"],
        ok=False,
        error=None,
        finish_reason=None,
        completion_tokens=None,
        chunks=0,
        text_chars=0,
    )
    start = time.perf_counter()
    stamps = []
    try:
        if spec["kind"] == "completion":
            stream = await client.completions.create(model=MODEL, prompt=spec["prompt"], **extra)
        else:
            stream = await client.chat.completions.create(model=MODEL, messages=spec["messages"], **extra)
        async for chunk in stream:
            if chunk.usage is not None:
                record["completion_tokens"] = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text = choice.text if spec["kind"] == "completion" else (choice.delta.content or "")
                if text:
                    stamps.append(time.perf_counter())
                    record["chunks"] += 1
                    record["text_chars"] += len(text)
                if choice.finish_reason:
                    record["finish_reason"] = choice.finish_reason
        record["ok"] = record["finish_reason"] in ("stop", "length")
        if not record["ok"]:
            record["error"] = f"finish_reason {record['finish_reason']!r}"
    except Exception as e:  # counted as a failed request
        record["error"] = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    record.update(
        start=start,
        end=end,
        e2e_ms=(end - start) * 1e3,
        ttft_ms=(stamps[0] - start) * 1e3 if stamps else None,
        gaps_ms=list(np.diff(stamps) * 1e3),
    )
    return record


async def level(url: str, concurrency: int, specs: list[dict]) -> dict:
    import openai

    # No retries: a failed request must be counted, not hidden behind back-off. The client's
    # default connection pool (far above 16) keeps one connection per task.
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        queue: asyncio.Queue = asyncio.Queue()
        for i, s in enumerate(specs):
            queue.put_nowait((i, s))
        records = []

        async def worker():
            while True:
                try:
                    i, s = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                records.append(await one_request(client, s, i))

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - start
    ok = [r for r in records if r["ok"]]
    tokens = sum(r["completion_tokens"] or 0 for r in ok)
    return dict(
        concurrency=concurrency,
        requests=len(records),
        failed=len(records) - len(ok),
        errors=sorted({r["error"] for r in records if r["error"]}),
        wall_s=wall,
        requests_per_s=len(ok) / wall,
        output_tokens=tokens,
        output_tokens_per_s=tokens / wall,
        ttft_ms=summary([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]),
        gap_ms=summary([g for r in ok for g in r["gaps_ms"]]),
        e2e_ms=summary([r["e2e_ms"] for r in ok]),
        by_kind={
            k: dict(
                requests=sum(r["kind"] == k for r in records),
                ttft_ms_p50=percentile([r["ttft_ms"] for r in ok if r["kind"] == k and r["ttft_ms"]], 50),
                tokens=sum(r["completion_tokens"] or 0 for r in ok if r["kind"] == k),
            )
            for k in ("completion", "chat")
        },
        finish_reasons={
            f: sum(r["finish_reason"] == f for r in records)
            for f in sorted({str(r["finish_reason"]) for r in records})
        },
        window=(start, start + wall),
    )


def scrape_metrics(url: str) -> dict:
    """A few engine counters from /metrics (selections, speculative programs, executions and device
    seconds per program)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return dict(error=str(e))
    keep = (
        "helios_scheduler_selections_total",
        "helios_speculative_",
        "helios_graph_executions_total",
        "helios_graph_device_seconds_total",
        "helios_scheduler_executions_total",
    )
    out = {}
    for line in text.splitlines():
        if line.startswith(keep):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                if float(value):
                    out[name] = float(value)
    return out


def main(argv) -> int:
    del argv
    import logging

    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)  # not one line per request
    started = time.perf_counter()
    levels = [int(c) for c in FLAGS.concurrency]
    results = dict(
        command=" ".join(sys.argv),
        machine=dict(cpus=os.cpu_count(), python=platform.python_version(), loadavg_at_start=os.getloadavg()),
        flags={
            k: FLAGS[k].value
            for k in (
                "concurrency",
                "requests_per_worker",
                "max_tokens",
                "temperature",
                "prompt_tokens",
                "server_args",
                "seed",
            )
        },
    )
    import openai

    results["openai_version"] = openai.__version__
    proc = sampler = None
    url = FLAGS.server_url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc, cmd = start_server(port)
        results["server_command"] = " ".join(cmd)
        sampler = RssSampler(proc.pid)
        sampler.start()
    try:
        t0 = time.perf_counter()
        while health(url) != 200:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}; see {FLAGS.server_log}")
            if time.perf_counter() - t0 > FLAGS.startup_timeout_s:
                raise TimeoutError(f"/health not ready after {FLAGS.startup_timeout_s} s")
            time.sleep(0.5)
        results["startup_s"] = round(time.perf_counter() - t0, 1)
        global MODEL
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
            MODEL = json.loads(r.read())["data"][0]["id"]
        results["model"] = MODEL
        print(f"server ready in {results['startup_s']} s at {url}", flush=True)
        if sampler:
            time.sleep(1.0)
            results["rss_idle_mib"] = round(sampler.rss() / 2**20, 1)
        # Warm-up: one request of each kind, untimed.
        warm = asyncio.run(level(url, 2, request_specs(2, FLAGS.seed + 1)))
        results["warmup"] = dict(failed=warm["failed"], errors=warm["errors"])
        rows = []
        for i, c in enumerate(levels):
            n = max(4, c * FLAGS.requests_per_worker)
            row = asyncio.run(level(url, c, request_specs(n, FLAGS.seed + 10 + i)))
            if sampler:
                peak = sampler.peak_between(*row["window"])
                row["rss_peak_mib"] = round(peak / 2**20, 1) if peak else None
            del row["window"]
            rows.append(row)
            print(
                f"c={c:2d} requests {row['requests']:3d} failed {row['failed']} "
                f"{row['requests_per_s']:6.2f} req/s {row['output_tokens_per_s']:7.1f} tok/s "
                f"ttft p50 {row['ttft_ms'].get('p50') or 0:8.1f} ms p90 "
                f"{row['ttft_ms'].get('p90') or 0:8.1f} "
                f"gap p50 {row['gap_ms'].get('p50') or 0:7.1f} ms p99 {row['gap_ms'].get('p99') or 0:7.1f} "
                f"rss peak {row.get('rss_peak_mib')} MiB",
                flush=True,
            )
        results["levels"] = rows
        results["failed_total"] = sum(r["failed"] for r in rows)
        results["metrics"] = scrape_metrics(url)
        if sampler:
            results["rss_end_mib"] = round(sampler.rss() / 2**20, 1)
            results["rss_peak_mib"] = round(max(r for _, r in sampler.samples) / 2**20, 1)
    finally:
        if sampler:
            sampler.stop.set()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print(
        f"failed requests: {results['failed_total']}; RSS idle {results.get('rss_idle_mib')} MiB, "
        f"peak {results.get('rss_peak_mib')} MiB; wall {results['wall_s']} s"
    )
    if FLAGS.plot_dir:
        results["plots"] = plots(results, FLAGS.plot_dir)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(results, f, indent=1, default=float)
            f.write("\n")
    return 0 if results["failed_total"] == 0 else 1


def plots(results, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    rows = results["levels"]
    cs = [r["concurrency"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.0))
    fig.suptitle(f"python -m helios_jax.serve {FLAGS.server_args}", fontsize=9)
    axes[0].plot(cs, [r["output_tokens_per_s"] for r in rows], "o-")
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_xlabel("client concurrency")
    for key, style in (("p50", "o-"), ("p90", "s--")):
        axes[1].plot(cs, [r["ttft_ms"].get(key) for r in rows], style, label=f"TTFT {key}")
        axes[1].plot(cs, [r["gap_ms"].get(key) for r in rows], style, label=f"gap {key}")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("ms")
    axes[1].set_xlabel("client concurrency")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(folder, f"load_{FLAGS.tag}.png" if FLAGS.tag else "load.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [path]


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
