"""Request bodies: unknown fields tolerated, known-but-unsupported ones refused, limits checked
before expensive work, and bodies that choke JSON parsers answered 400 (never 500)."""

import json
import threading
import time

import pytest

from helios_jax.serve.fake import CharTokenizer, FakeEngine
from helios_jax.serve.generation import INLINE_PARSE_BYTES

from .helpers import get, live_server, post

COMPLETIONS, CHAT_PATH = "/v1/completions", "/v1/chat/completions"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=64)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine, max_prompt_chars=100, max_body_bytes=4096) as server:
        yield server


@pytest.fixture(scope="module")
def uncapped(engine):
    with live_server(engine, shutdown_engine=False) as server:  # the default 16 MiB body cap
        yield server


def last_sampling(engine, response):
    (request,) = [r for r in engine.submitted if r.request_id == response.json()["id"]]
    return request.sampling


@pytest.mark.parametrize(
    "path, body",
    [
        (COMPLETIONS, {"prompt": "a", "max_tokens": 2, "frobnicate": 1, "messages": CHAT}),
        (CHAT_PATH, {"messages": CHAT, "max_tokens": 2, "prompt": "a", "x_trace": {"id": 7}}),
        (COMPLETIONS, {"prompt": "a", "max_tokens": 2, "min_p": 0.0, "ignore_eos": False, "min_tokens": 0}),
        (CHAT_PATH, {"messages": CHAT, "max_tokens": 2, "skip_special_tokens": True, "echo": False}),
        (CHAT_PATH, {"messages": CHAT, "max_tokens": 2, "add_generation_prompt": True, "user": "u1"}),
    ],
)
def test_unknown_fields_and_neutral_extensions_are_accepted(server, engine, path, body):
    r = post(server, path, body)
    assert r.status == 200, r.body
    assert last_sampling(engine, r).max_tokens == 2


@pytest.mark.parametrize(
    "path, body, param",
    [
        (CHAT_PATH, {"messages": CHAT, "response_format": {"type": "json_object"}}, "response_format"),
        (CHAT_PATH, {"messages": CHAT, "echo": True}, "echo"),
    ],
)
def test_named_fields_that_cannot_be_honoured_are_refused(server, engine, path, body, param):
    submitted = len(engine.submitted)
    r = post(server, path, body)
    assert r.status == 400, r.body
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, "unsupported_parameter")
    assert len(engine.submitted) == submitted


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",  # past Python's int conversion limit
        b'{"prompt": "a", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # parser recursion
        b'{"prompt": "a", "metadata": ' + b"[" * 40 + b"]" * 40 + b"}",  # past MAX_JSON_DEPTH
        b'{"prompt": "\\ud800"}',  # a lone surrogate, escaped: valid JSON, not Unicode
        b'{"prompt": "a", "\\udfff": 1}',  # in a key
    ],
)
def test_bodies_that_choke_json_parsers_are_400(uncapped, raw):
    r = post(uncapped, COMPLETIONS, raw=raw)
    assert r.status == 400, r.body[:300]
    assert r.json()["error"]["code"] == "invalid_json"


def test_a_body_over_the_cap_is_413(server):
    r = post(server, COMPLETIONS, {"prompt": "a", "metadata": "x" * 5000})
    assert (r.status, r.json()["error"]["code"]) == (413, "request_too_large")
    r = post(server, COMPLETIONS, raw=iter([b'{"prompt": "a", ', b'"metadata": "' + b"x" * 5000 + b'"}']))
    assert (r.status, r.json()["error"]["code"]) == (413, "request_too_large")  # chunked, counted


class CountingTokenizer(CharTokenizer):
    def __init__(self, delay_s: float = 0.0):
        self.calls, self.delay_s = 0, delay_s

    def encode(self, text):
        self.calls += 1
        time.sleep(self.delay_s)
        return super().encode(text)

    def render_chat(self, messages, add_generation_prompt=True, template_kwargs=None):
        self.calls += 1
        return super().render_chat(messages, add_generation_prompt, template_kwargs)


def test_prompt_characters_are_limited_before_tokenizing():
    engine = FakeEngine(max_model_len=64)
    engine.tokenizer = CountingTokenizer()
    with live_server(engine, max_prompt_chars=100) as server:
        r = post(server, COMPLETIONS, {"prompt": "a" * 101})
        assert (r.status, r.json()["error"]["param"], r.json()["error"]["code"]) == (
            400,
            "prompt",
            "prompt_too_long",
        )
        r = post(server, CHAT_PATH, {"messages": [{"role": "user", "content": "a" * 60}] * 2})
        assert (r.status, r.json()["error"]["param"], r.json()["error"]["code"]) == (
            400,
            "messages",
            "prompt_too_long",
        )
        assert engine.tokenizer.calls == 0
        assert post(server, COMPLETIONS, {"prompt": "a" * 50, "max_tokens": 1}).status == 200


def test_the_default_prompt_limit_is_64_characters_per_token_of_context():
    engine = FakeEngine(max_model_len=16)
    engine.tokenizer = CountingTokenizer()
    with live_server(engine) as server:
        r = post(server, COMPLETIONS, {"prompt": "a" * (64 * 16 + 1)})
        assert r.json()["error"]["code"] == "prompt_too_long" and engine.tokenizer.calls == 0
        r = post(server, COMPLETIONS, {"prompt": "a" * (64 * 16)})
        assert r.json()["error"]["code"] == "context_length_exceeded" and engine.tokenizer.calls == 1


def test_tokenizing_a_large_body_runs_off_the_event_loop():
    """A prompt that takes 0.5 s to tokenize does not hold up /health on the same server (bodies
    over INLINE_PARSE_BYTES are parsed in a worker thread)."""
    engine = FakeEngine(max_model_len=64)
    engine.tokenizer = CountingTokenizer(delay_s=0.5)
    prompt = "a" * (INLINE_PARSE_BYTES + 1)
    with live_server(engine, max_prompt_chars=len(prompt)) as server:
        slow = threading.Thread(target=post, args=(server, COMPLETIONS, {"prompt": prompt, "max_tokens": 1}))
        slow.start()
        while engine.tokenizer.calls == 0:
            time.sleep(0.01)
        start = time.monotonic()
        assert get(server, "/health").status == 200
        elapsed = time.monotonic() - start
        slow.join()
    assert elapsed < 0.25, elapsed


def test_no_internal_text_in_a_5xx(server, engine):
    engine.inject_failure("submit", "CUDA_ERROR_ILLEGAL_ADDRESS at 0xdeadbeef")
    r = post(server, COMPLETIONS, {"prompt": "a", "max_tokens": 2})
    assert r.status == 500 and "0xdeadbeef" not in r.body.decode()
    assert json.loads(r.body)["error"] == {
        "message": "the engine failed to accept the request",
        "type": "server_error",
        "param": None,
        "code": "engine_error",
    }
