"""The wire format seen through raw HTTP: SSE framing, error objects, auth, cancellation, health
and metrics. Expected text follows the fake engine's docstring (output cycles CYCLE_TEXT)."""

import json
import socket
import threading

import pytest

from helios_jax.serve.fake import FakeEngine

from .helpers import get, live_server, metric_value, open_stream, post, request, send_and_hang_up

MAX_MODEL_LEN = 64
CHAT = [{"role": "user", "content": "hi"}]  # "user: hi\nassistant: ": 20 prompt tokens


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


def assert_still_serving(server):
    r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2})
    assert (r.status, r.json()["choices"][0]["text"]) == (200, "Th")


# -- SSE framing ----------------------------------------------------------------------------------


def test_chat_stream_framing_and_include_usage(server):
    r = post(
        server,
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["transfer-encoding"] == "chunked"
    data = r.sse_data()
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [c["choices"][0]["delta"] if c["choices"] else None for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "T"},
        {"content": "h"},
        {"content": "e"},
        {},
        None,
    ]
    assert [c["choices"][0]["finish_reason"] if c["choices"] else None for c in chunks] == [
        None,
        None,
        None,
        None,
        "length",
        None,
    ]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["usage"] for c in chunks[:-1]] == [None] * 5
    assert chunks[-1]["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}


def test_completion_stream_without_usage(server):
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "stream": True})
    data = r.sse_data()
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [
        ("T", None),
        ("h", None),
        ("", "length"),
    ]
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)


def test_keep_alive_connection_serves_several_requests(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for stream in (True, False, True):
            conn.request(
                "POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 2, "stream": stream})
            )
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read()
    finally:
        conn.close()


def test_non_streaming_responses_carry_usage(server):
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4})
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "The "},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}


def test_token_id_prompts_and_text_parts(server):
    r = post(server, "/v1/completions", {"prompt": [72, 105], "max_tokens": 1, "echo": True})
    assert r.json()["choices"][0]["text"] == "HiT"
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
            ],
            "max_tokens": 1,
        },
    )
    assert r.json()["usage"]["prompt_tokens"] == 21  # "user: h\ni\nassistant: ": parts joined by "\n"


# -- errors ---------------------------------------------------------------------------------------

COMPLETIONS, CHAT_PATH = "/v1/completions", "/v1/chat/completions"
BAD_REQUESTS = [
    # (path, body or raw bytes, status, param, code)
    (COMPLETIONS, b'{"prompt": ', 400, None, "invalid_json"),
    (COMPLETIONS, b"\xff\xfe", 400, None, "invalid_json"),
    (COMPLETIONS, b"[1, 2]", 400, None, "invalid_json"),
    (COMPLETIONS, b'{"prompt": "a", "temperature": NaN}', 400, None, "invalid_json"),
    (COMPLETIONS, b"", 400, None, "invalid_json"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": "5"}, 400, "max_tokens", "invalid_type"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": 2.0}, 400, "max_tokens", "invalid_type"),
    (COMPLETIONS, {"prompt": "a", "temperature": True}, 400, "temperature", "invalid_type"),
    (COMPLETIONS, {"prompt": "a", "stream": "yes"}, 400, "stream", "invalid_type"),
    (COMPLETIONS, {"prompt": "a", "stop": 5}, 400, "stop", "invalid_type"),
    (COMPLETIONS, {"prompt": "a", "stop": [""]}, 400, "stop", None),
    (COMPLETIONS, {"prompt": "a", "top_p": 0}, 400, "top_p", None),
    (COMPLETIONS, {"prompt": "a", "temperature": -1}, 400, "temperature", None),
    (COMPLETIONS, {"prompt": "a", "top_k": -2}, 400, "top_k", None),
    (COMPLETIONS, {"prompt": "a", "model": 3}, 400, "model", "invalid_type"),
    (COMPLETIONS, {"max_tokens": 1}, 400, "prompt", "missing_field"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": {"text": "a"}}, 400, "prompt", "invalid_type"),
    (COMPLETIONS, {"prompt": ["a", 5]}, 400, "prompt", "invalid_type"),
    (COMPLETIONS, {"prompt": [1, -1]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [1, 0x110000]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": "a", "model": "gpt-4"}, 404, "model", "model_not_found"),
    (COMPLETIONS, {"prompt": "a" * MAX_MODEL_LEN, "max_tokens": 1}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "a" * 60, "max_tokens": 5}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "a" * 60}, 400, "prompt", "context_length_exceeded"),  # the default 16 counts
    (COMPLETIONS, {"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": -3}, 400, "max_tokens", "invalid_value"),
    (COMPLETIONS, {"prompt": "a", "n": 65}, 400, "n", None),
    (COMPLETIONS, {"prompt": "a", "n": 0}, 400, "n", None),
    (COMPLETIONS, {"prompt": "a", "n": 2, "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "a", "logprobs": 21}, 400, "logprobs", None),
    (COMPLETIONS, {"prompt": "a", "seed": 2**64}, 400, "seed", None),
    (COMPLETIONS, {"prompt": "a", "seed": -(2**63) - 1}, 400, "seed", None),
    (COMPLETIONS, {"prompt": "a", "logprobs": -1}, 400, "logprobs", None),
    (COMPLETIONS, {"prompt": "a", "suffix": "z"}, 400, "suffix", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "a", "logit_bias": {"50": 101}}, 400, "logit_bias", None),
    (COMPLETIONS, {"prompt": "a", "presence_penalty": 2.5}, 400, "presence_penalty", None),
    (COMPLETIONS, {"prompt": "a", "frequency_penalty": -2.01}, 400, "frequency_penalty", None),
    (COMPLETIONS, {"prompt": "a", "guided_json": {}}, 400, "guided_json", "unsupported_parameter"),  # fake
    (COMPLETIONS, {"prompt": "a", "guided_regex": "a("}, 400, "guided_regex", "invalid_grammar"),
    (
        CHAT_PATH,
        {
            "messages": CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 1}}},
        },
        400,
        "response_format",
        "invalid_grammar",
    ),
    (COMPLETIONS, {"prompt": "a", "grammar": "root ::= x"}, 400, "grammar", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    (CHAT_PATH, {"max_tokens": 1}, 400, "messages", "missing_field"),
    (CHAT_PATH, {"messages": []}, 400, "messages", None),
    (CHAT_PATH, {"messages": "hi"}, 400, "messages", "invalid_type"),
    (CHAT_PATH, {"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role", None),
    (CHAT_PATH, {"messages": [{"role": "user"}]}, 400, "messages[0].content", "missing_field"),
    (
        CHAT_PATH,
        {"messages": [{"role": "user", "content": None}]},
        400,
        "messages[0].content",
        "invalid_type",
    ),
    (
        CHAT_PATH,
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
            ]
        },
        400,
        "messages[0].content",
        "unsupported_parameter",
    ),
    (
        CHAT_PATH,
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
        400,
        "messages[0].tool_calls",
        None,
    ),
    (CHAT_PATH, {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools[0]", None),
    (CHAT_PATH, {"messages": CHAT, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    (CHAT_PATH, {"messages": CHAT, "tool_choice": "auto"}, 400, "tool_choice", None),
    (
        CHAT_PATH,
        {"messages": CHAT, "response_format": {"type": "json_schema"}},
        400,
        "response_format",
        "missing_field",
    ),
    (CHAT_PATH, {"messages": CHAT, "n": 3, "best_of": 1}, 400, "best_of", "unsupported_parameter"),
    (CHAT_PATH, {"messages": CHAT, "logprobs": 1}, 400, "logprobs", "invalid_type"),
    (CHAT_PATH, {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    (CHAT_PATH, {"messages": CHAT, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs", None),
    (CHAT_PATH, {"messages": CHAT, "top_logprobs": 0}, 400, "top_logprobs", None),
    (
        CHAT_PATH,
        {"messages": CHAT, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        "invalid_value",
    ),
    (CHAT_PATH, {"messages": CHAT, "max_tokens": 45}, 400, "messages", "context_length_exceeded"),
    (
        CHAT_PATH,
        {"messages": [{"role": "user", "content": "x" * 60}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (CHAT_PATH, {"messages": CHAT, "model": "other"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize("path, body, status, param, code", BAD_REQUESTS)
def test_bad_requests_get_the_openai_error_object(server, engine, path, body, status, param, code):
    submitted = len(engine.submitted)
    if isinstance(body, bytes):
        r = post(server, path, raw=body)
    else:
        r = post(server, path, body)
    assert r.status == status, r.body
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    assert len(engine.submitted) == submitted  # rejected before the engine saw it
    assert_still_serving(server)


def test_unknown_paths_and_methods(server):
    r = get(server, "/v1/nothing")
    assert (r.status, r.json()["error"]["code"]) == (404, "not_found")
    r = get(server, "/v1/completions")
    assert (r.status, r.json()["error"]["code"], r.headers["allow"]) == (405, "method_not_allowed", "POST")
    r = request(server, "DELETE", "/health")
    assert r.status == 405
    assert_still_serving(server)


@pytest.mark.parametrize(
    "raw, status, error_object",
    [
        (b"BOGUS / HTTP/1.1\r\nHost: x\r\n\r\n", 404, True),  # a method token: routed, no such path
        (b"BOGUS /health HTTP/1.1\r\nHost: x\r\n\r\n", 405, True),
        (b"this is not http\r\n\r\n", 400, False),  # uvicorn's own plain-text 400
        (b"GET / HTTP/9.9\r\n\r\n", 404, True),  # h11 takes any 1-digit version: routed
    ],
)
def test_malformed_http_is_refused_and_the_server_keeps_serving(server, raw, status, error_object):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(raw)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
        if b"\r\n\r\n" in received and not error_object:
            break
        if error_object and received.endswith(b"}}"):
            break
    sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode()
    if error_object:
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert_still_serving(server)


def test_oversized_bodies_are_refused_and_chunked_ones_read(server):
    from helios_jax.serve.flags import MAX_BODY_BYTES

    r = post(server, "/v1/completions", raw=b"{}", headers={"Content-Length": str(MAX_BODY_BYTES + 1)})
    assert (r.status, r.json()["error"]["code"]) == (413, "request_too_large")
    body = json.dumps({"prompt": "a", "max_tokens": 2}).encode()
    r = post(server, "/v1/completions", raw=iter([body[:5], body[5:]]))  # http.client: chunked
    assert (r.status, r.json()["choices"][0]["text"]) == (200, "Th")
    assert_still_serving(server)


def test_engine_errors_are_500s(server, engine):
    engine.inject_failure("submit", "out of pages")
    r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2})
    assert r.status == 500
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_error")
    assert "out of pages" not in r.body.decode()  # the engine's text stays in the server's log
    engine.inject_failure("stream", "device lost")
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert r.status == 500 and r.json()["error"]["code"] == "engine_error"
    assert "device lost" not in r.body.decode()
    assert_still_serving(server)


def test_an_engine_error_mid_stream_is_an_error_event_then_done(server, engine):
    engine.inject_failure("stream", "device lost")
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "stream": True})
    assert r.status == 200
    data = r.sse_data()
    assert json.loads(data[0])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(data[1])["error"]["code"] == "engine_error" and "device lost" not in data[1]
    assert data[2:] == ["[DONE]"]
    assert_still_serving(server)


def test_concurrent_streams_each_get_their_own_text(server):
    results = {}

    def one(k):
        r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 5 + k, "stream": True})
        results[k] = "".join(json.loads(d)["choices"][0]["text"] for d in r.sse_data()[:-1])

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results == {k: "The quick brown fox"[: 5 + k] for k in range(8)}


# -- cancellation ---------------------------------------------------------------------------------


@pytest.fixture()
def slow_server():
    engine = FakeEngine(token_delay_s=0.02, max_model_len=4096)
    with live_server(engine) as server:
        yield server, engine


@pytest.mark.parametrize(
    "path, body",
    [
        (COMPLETIONS, {"prompt": "a", "max_tokens": 4000, "stream": True}),
        (CHAT_PATH, {"messages": CHAT, "max_tokens": 4000, "stream": True}),
    ],
)
def test_a_client_leaving_mid_stream_cancels_the_request(slow_server, path, body):
    server, engine = slow_server
    sock, received = open_stream(server, path, body)
    assert b"200 OK" in received
    request_id = json.loads(received.split(b"data: ")[1].split(b"\n")[0])["id"]
    assert engine.cancelled == ()
    sock.close()
    assert engine.wait_for_cancel(request_id, timeout=5)
    assert engine.cancelled == (request_id,)
    r = get(server, "/metrics")
    assert metric_value(r.body.decode(), 'helios_requests_finished_total{reason="cancelled"}') == 1
    assert metric_value(r.body.decode(), "helios_requests_running") == 0
    assert_still_serving(server)


def test_a_client_leaving_a_non_streaming_request_cancels_it(slow_server):
    server, engine = slow_server
    send_and_hang_up(server, COMPLETIONS, {"prompt": "a", "max_tokens": 4000})
    assert engine.wait_for_cancel(timeout=5)
    (request_id,) = engine.cancelled
    assert request_id.startswith("cmpl-") and [r.request_id for r in engine.submitted] == [request_id]
    assert_still_serving(server)


# -- auth, health, metrics ------------------------------------------------------------------------


def test_api_key_guards_v1_only():
    with live_server(FakeEngine(), api_key="s3cret") as server:
        body = {"prompt": "a", "max_tokens": 1}
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret"},
            {"Authorization": "Basic s3cret"},
            {"Authorization": "Bearer s3cret0"},
        ):
            r = post(server, COMPLETIONS, body, headers=headers)
            assert r.status == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
        assert get(server, "/v1/models").status == 401
        assert get(server, "/v1/unknown").status == 401  # no probing of /v1 without the key
        assert post(server, COMPLETIONS, body, headers={"Authorization": "Bearer s3cret"}).status == 200
        assert get(server, "/v1/models", headers={"Authorization": "bearer s3cret"}).status == 200
        assert get(server, "/health").status == 200
        assert get(server, "/metrics").status == 200


def test_health_follows_readiness():
    engine = FakeEngine(ready=False)
    with live_server(None) as server:
        r = get(server, "/health")
        assert (r.status, r.json()) == (503, {"status": "starting"})
        r = post(server, COMPLETIONS, {"prompt": "a"})
        assert (r.status, r.json()["error"]["code"]) == (503, "engine_not_ready")
        assert get(server, "/metrics").status == 200
        server.attach_engine(engine)
        assert (get(server, "/health").status, get(server, "/health").json()) == (
            503,
            {"status": "not ready"},
        )
        assert post(server, COMPLETIONS, {"prompt": "a"}).status == 503
        engine.set_ready(True)
        assert (get(server, "/health").status, get(server, "/health").json()) == (200, {"status": "ok"})
        assert post(server, COMPLETIONS, {"prompt": "a", "max_tokens": 1}).status == 200


def test_metrics_after_traffic():
    engine = FakeEngine(tokens_per_event=2)
    with live_server(engine, served_model_name="tiny") as server:
        assert post(server, COMPLETIONS, {"model": "tiny", "prompt": "Hello", "max_tokens": 4}).status == 200
        assert (
            post(
                server, CHAT_PATH, {"model": "tiny", "messages": CHAT, "max_tokens": 3, "stream": True}
            ).status
            == 200
        )
        assert post(server, COMPLETIONS, {"model": "helios-fake", "prompt": "a"}).status == 404
        r = get(server, "/metrics")
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = r.body.decode()
    value = lambda sample: metric_value(text, sample)  # noqa: E731
    assert value('helios_http_requests_total{endpoint="/v1/completions",status="200"}') == 1
    assert value('helios_http_requests_total{endpoint="/v1/completions",status="404"}') == 1
    assert value('helios_http_requests_total{endpoint="/v1/chat/completions",status="200"}') == 1
    assert value('helios_requests_finished_total{reason="length"}') == 2
    assert value("helios_prompt_tokens_total") == 5 + 20
    assert value("helios_completion_tokens_total") == 4 + 3
    assert value("helios_time_to_first_token_seconds_count") == 2
    assert value('helios_time_to_first_token_seconds_bucket{le="+Inf"}') == 2
    # Bursts of two tokens: request 1 has bursts (2, 2), request 2 has (2, 1); the first burst of
    # each is the TTFT, the later ones observe their gap once per token.
    assert value("helios_inter_token_latency_seconds_count") == 2 + 1
    assert value("helios_e2e_request_latency_seconds_count") == 2
    assert value("helios_request_queue_time_seconds_count") == 2  # once per request (its first event)
    assert value("helios_requests_running") == 0
    assert value("helios_fake_engine_requests_total") == 2  # the engine's own text is appended
    for family in (
        "helios_time_to_first_token_seconds",
        "helios_inter_token_latency_seconds",
        "helios_e2e_request_latency_seconds",
    ):
        assert f"# TYPE {family} histogram" in text
