"""The spec's HTTP scheduler scenarios against a live server running the real engine.

An idle server with four request slots and a 4096-token prefill capacity serves a tiny random
Qwen3 model (with an MTP head) under ordinary, fixed-width and adaptive speculative execution.
Each scenario asserts complete responses and prints the prompt/output token counts, the client's
SSE arrival gaps and the server's per-program execution deltas (these are not GPU timings).

The scenarios live here; each mode runs them from its own test module
(``test_scheduler_http_{off,fixed,adaptive}.py``, whose module fixture ``server`` compiles that
mode's engine), so that the two test workers of ``make test`` can build two engines at once.
"""

import http.client
import json
import re
import threading
import time

import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.engine import HeliosEngine

from ..runtime.helpers import model, tokenizer
from .helpers import get, live_server, open_stream, post

spec = pytest.mark.spec


def serve(mode: str):
    """The module fixture of one mode's test module: a live server over that mode's engine."""
    config, params = model()
    engine = HeliosEngine(
        model_config=config,
        params=params,
        tokenizer=tokenizer(),
        model_name="tiny",
        engine_config=EngineConfig(
            request_slots=4,
            prefill_chunks=(4096,),
            speculation=mode,
            draft_tokens=0 if mode == "off" else 3,
            max_model_len=4608,
        ),
        check_invariants=True,
    )
    with live_server(engine) as srv:
        srv.mode = mode
        yield srv


def graph_counts(server) -> dict:
    text = get(server, "/metrics").body.decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'helios_graph_executions_total\{graph="([^"]+)"\} (\S+)', text)
    }


def stream_completion(server, prompt: str, max_tokens: int, out: dict, key) -> None:
    """POST a streaming completion, reading events as they arrive (for the client's gaps)."""
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    events, arrivals = [], []
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
            arrivals.append(time.perf_counter() - start)
    conn.close()
    usage = json.loads(events[-2])["usage"] if events and events[-1] == "[DONE]" else None
    choices = [json.loads(e)["choices"] for e in events[:-1]]
    finish = [c[0]["finish_reason"] for c in choices if c and c[0]["finish_reason"]]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    out[key] = dict(
        status=resp.status,
        done=bool(events) and events[-1] == "[DONE]",
        usage=usage,
        finish=finish[-1] if finish else None,
        events=len(events),
        first=arrivals[0] if arrivals else None,
        max_gap=max(gaps, default=0.0),
    )


def run_concurrently(server, prompts: list[tuple[str, int]], delays=None) -> dict:
    out = {}
    threads = []
    for i, (prompt, n) in enumerate(prompts):
        if delays:
            time.sleep(delays[i])
        t = threading.Thread(target=stream_completion, args=(server, prompt, n, out, i))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=900)
    return out


def check_complete(results: dict, prompts) -> None:
    for i, (_prompt, n) in enumerate(prompts):
        r = results[i]
        assert r["status"] == 200 and r["done"] and r["finish"] in ("stop", "length"), r
        assert 1 <= r["usage"]["completion_tokens"] <= n and r["usage"]["prompt_tokens"] > 0
        print(
            f"  [{i}] prompt={r['usage']['prompt_tokens']} output={r['usage']['completion_tokens']} "
            f"events={r['events']} first event {r['first']:.3f}s, largest SSE gap {r['max_gap']:.3f}s, "
            f"finish={r['finish']}"
        )


def scenario(server, prompts, delays=None):
    before = graph_counts(server)
    results = run_concurrently(server, prompts, delays)
    after = graph_counts(server)
    print(
        f"\n[{server.mode}] graph executions:",
        {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0)},
    )
    check_complete(results, prompts)


LONG = "def f(x):\n    return x + 1\n" * 120  # about 1,700 tokens with the test tokenizer
SHORT = "import os\n"


@spec("verification/http-service-shape", "verification/http-concurrent-long", "verification/http-modes")
def test_concurrent_long_prompts(server):
    scenario(server, [(LONG, 8), (LONG * 2, 8), (LONG, 8)])


@spec("verification/http-decode-streams", "verification/http-modes")
@pytest.mark.parametrize("streams", [2, 4])
def test_decode_streams(server, streams):
    scenario(server, [(SHORT * (i + 1), 48) for i in range(streams)])


@spec("verification/http-long-during-decode", "verification/http-short-long")
def test_long_prompt_during_decode_and_short_long_contention(server):
    scenario(server, [(SHORT, 64), (SHORT * 2, 64), (LONG * 2, 16)], delays=[0, 0, 0.3])
    scenario(server, [(SHORT, 16), (LONG * 2, 16), (SHORT * 3, 16), (LONG, 16)])


@spec("verification/http-cancel-reuse")
def test_cancellation_then_slot_reuse(server):
    socks = []
    for _ in range(4):
        sock, _ = open_stream(
            server, "/v1/completions", {"model": "tiny", "prompt": LONG, "max_tokens": 2000, "stream": True}
        )
        socks.append(sock)
    for sock in socks:  # every slot busy; the clients go away
        sock.close()
    deadline = time.time() + 120
    engine = server.engine
    while engine.scheduler.requests and time.time() < deadline:
        time.sleep(0.1)
    assert not engine.scheduler.requests and not engine.scheduler.owned_pages()
    scenario(server, [(SHORT, 8) for _ in range(4)])


def test_greedy_output_over_http_equals_offline_greedy_decoding(server):
    """The HTTP path (tokenize, schedule, speculate, detokenize) returns plain greedy tokens."""
    from ..runtime.test_engine import offline_greedy

    tok = tokenizer()
    prompt = tok.encode("def f(x):\n    return x + 1\n" * 3)
    resp = post(
        server,
        "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 0},
        timeout=600,
    )
    assert resp.status == 200
    choice = resp.json()["choices"][0]
    expect = offline_greedy(prompt, resp.json()["usage"]["completion_tokens"])
    assert choice["text"] == tok.decode(expect)
