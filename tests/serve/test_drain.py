"""Graceful drain (HeliosServer.drain, what SIGTERM and SIGINT run): new requests get 503, the
requests in flight finish, and past the timeout each open stream ends with an error event."""

import json
import threading
import time

from helios_jax.serve.fake import CYCLE_TEXT, FakeEngine

from .helpers import get, live_server, open_stream, post

STREAM = {"prompt": "a", "stream": True}


def read_rest(sock, received: bytes) -> list[str]:
    """The SSE data payloads of a response whose start is `received` (read to its last chunk)."""
    while not received.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(65536)):
        received += chunk
    sock.close()
    body = received.partition(b"\r\n\r\n")[2].decode()
    return [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]


def start_drain(server, timeout_s: float) -> tuple[threading.Thread, dict]:
    out = {}
    thread = threading.Thread(target=lambda: out.update(drained=server.drain(timeout_s)))
    thread.start()
    while not server.draining:
        time.sleep(0.001)
    return thread, out


def test_a_stream_in_flight_finishes_while_new_requests_get_503():
    engine = FakeEngine(token_delay_s=0.01, max_model_len=4096)
    with live_server(engine) as server:
        sock, received = open_stream(server, "/v1/completions", {**STREAM, "max_tokens": 60})
        drain, out = start_drain(server, timeout_s=10.0)
        r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert (r.status, r.json()["error"]["code"]) == (503, "server_shutting_down")
        assert r.headers["connection"] == "close"
        assert (get(server, "/health").status, get(server, "/health").json()) == (503, {"status": "draining"})
        assert get(server, "/metrics").status == 200
        data = read_rest(sock, received)
        drain.join()
    assert out["drained"] is True
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == (CYCLE_TEXT * 2)[:60]
    assert engine.cancelled == ()


def test_past_the_timeout_open_streams_end_with_an_error_event_and_done():
    engine = FakeEngine(token_delay_s=0.01, max_model_len=4096)
    with live_server(engine) as server:
        sock, received = open_stream(
            server,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "stream": True},
        )
        waiting = {}
        plain = threading.Thread(
            target=lambda: waiting.update(
                r=post(server, "/v1/completions", {"prompt": "a", "max_tokens": 4000})
            )
        )
        plain.start()
        while len(engine.submitted) < 2:
            time.sleep(0.001)
        drain, out = start_drain(server, timeout_s=0.2)
        data = read_rest(sock, received)
        plain.join()
        drain.join()
    assert out["drained"] is False
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert (error["code"], error["type"]) == ("server_shutting_down", "server_error")
    assert all("choices" in json.loads(d) for d in data[:-2])  # text until the error event
    r = waiting["r"]
    assert (r.status, r.json()["error"]["code"]) == (503, "server_shutting_down")
    assert sorted(engine.cancelled) == sorted(s.request_id for s in engine.submitted)
