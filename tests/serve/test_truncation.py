"""vLLM's truncate_prompt_tokens (keep the prompt's last k tokens) and spaces_between_special_tokens."""

import pytest

from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.prompt_truncation import shift_endpoints

from .helpers import live_server, post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=64)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


def submitted_text(engine):
    return "".join(chr(t) for t in engine.submitted[-1].prompt_tokens)


def test_a_completion_prompt_keeps_its_last_k_tokens(server, engine):
    r = post(server, COMPLETIONS, {"prompt": "abcdefgh", "max_tokens": 1, "truncate_prompt_tokens": 3})
    assert r.status == 200 and submitted_text(engine) == "fgh"
    assert r.json()["usage"]["prompt_tokens"] == 3
    body = {"prompt": ["abcdef", "xy"], "max_tokens": 1, "truncate_prompt_tokens": 4}
    assert post(server, COMPLETIONS, body).status == 200
    assert [p for p in engine.submitted[-2:]][0].prompt_tokens == tuple(map(ord, "cdef"))
    assert submitted_text(engine) == "xy"  # shorter than k: unchanged


def test_minus_one_keeps_the_models_context_and_lets_a_long_prompt_in(server, engine):
    long = "a" * 70 + "bcd"  # 73 tokens: over the 64-token context
    assert post(server, COMPLETIONS, {"prompt": long, "max_tokens": 1}).status == 400
    r = post(server, COMPLETIONS, {"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": 60})
    assert r.status == 200 and submitted_text(engine) == long[-60:]
    r = post(server, COMPLETIONS, {"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert r.status == 400  # 64 kept tokens leave no room for one output token
    assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("value", [0, -2, 65])
def test_values_vllm_refuses_are_400(server, value):
    r = post(server, COMPLETIONS, {"prompt": "ab", "max_tokens": 1, "truncate_prompt_tokens": value})
    assert r.status == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_a_chat_prompt_is_cut_after_rendering_and_its_endpoints_move(server, engine):
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yo"}]
    whole = post(server, CHAT, {"messages": messages, "max_tokens": 1})
    assert whole.status == 200
    full_text, full_ends = submitted_text(engine), engine.submitted[-1].message_endpoints
    r = post(server, CHAT, {"messages": messages, "max_tokens": 1, "truncate_prompt_tokens": 20})
    assert r.status == 200 and submitted_text(engine) == full_text[-20:]
    cut = len(full_text) - 20
    assert engine.submitted[-1].message_endpoints == tuple(e - cut for e in full_ends if e > cut)


def test_endpoints_inside_the_cut_are_dropped():
    assert shift_endpoints((5, 9, 14), 9) == (5,)
    assert shift_endpoints((5, 9, 14), 0) == (5, 9, 14)


@pytest.mark.parametrize("value", [True, False])
def test_spaces_between_special_tokens_is_accepted(server, value):
    body = {"prompt": "ab", "max_tokens": 1, "spaces_between_special_tokens": value}
    assert post(server, COMPLETIONS, body).status == 200
    r = post(server, COMPLETIONS, {**body, "spaces_between_special_tokens": "no"})
    assert r.status == 400 and r.json()["error"]["param"] == "spaces_between_special_tokens"


def test_truncation_side_right_keeps_the_start_as_vllm_does(server, engine):
    body = {"prompt": "abcdefgh", "max_tokens": 1, "truncate_prompt_tokens": 3, "truncation_side": "right"}
    assert post(server, COMPLETIONS, body).status == 200 and submitted_text(engine) == "abc"
    r = post(server, COMPLETIONS, {**body, "truncation_side": "middle"})
    assert r.status == 400 and r.json()["error"]["param"] == "truncation_side"
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yo"}]
    chat = {"messages": messages, "max_tokens": 1, "truncate_prompt_tokens": 14, "truncation_side": "right"}
    assert post(server, CHAT, chat).status == 200
    assert submitted_text(engine) == "user: hello\nas"
    assert engine.submitted[-1].message_endpoints == (12,)  # the first message's, still whole
