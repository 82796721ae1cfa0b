"""vLLM's request surface over the fake engine: chat templates and their fields, per-request
stop control, n > 1 and lists of prompts, continuous usage, prompt_logprobs, proposal_source."""

import json

import pytest

from helios_jax.serve.fake import FakeEngine

from .helpers import live_server, post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=256)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


def last_submitted(engine):
    return engine.submitted[-1]


def text_of(request):
    return "".join(chr(t) for t in request.prompt_tokens)


# -- chat templates ------------------------------------------------------------------------------


def test_chat_renders_with_template_kwargs_and_generation_prompt(server, engine):
    body = {"messages": HI, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False}}
    assert post(server, CHAT, body).status == 200
    request = last_submitted(engine)
    assert text_of(request) == "user: hi\nenable_thinking=False\nassistant: "
    assert request.message_endpoints == (9,)
    body = {"messages": HI, "max_tokens": 1, "add_generation_prompt": False}
    assert post(server, CHAT, body).status == 200
    assert text_of(last_submitted(engine)) == "user: hi\n"


def test_chat_text_parts_are_joined_with_newlines(server, engine):
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 1}
    assert post(server, CHAT, body).status == 200
    assert text_of(last_submitted(engine)) == "user: a\nb\nassistant: "
    r = post(server, "/tokenize", {"messages": [{"role": "user", "content": parts}]})
    assert "".join(map(chr, r.json()["tokens"])) == "user: a\nb\nassistant: "


@pytest.mark.parametrize(
    "kwargs, says",
    [({"raise_exception": "no system role"}, "no system role"), ({"messages": []}, "cannot set")],
)
def test_template_refusals_are_400(server, kwargs, says):
    r = post(server, CHAT, {"messages": HI, "chat_template_kwargs": kwargs})
    error = r.json()["error"]
    assert (r.status, error["code"], error["param"]) == (400, "invalid_chat_template_input", "messages")
    assert says in error["message"]


def test_chat_field_types_are_checked(server):
    r = post(server, CHAT, {"messages": HI, "chat_template_kwargs": [1]})
    assert (r.status, r.json()["error"]["param"]) == (400, "chat_template_kwargs")
    r = post(server, CHAT, {"messages": HI, "add_generation_prompt": "no"})
    assert (r.status, r.json()["error"]["param"]) == (400, "add_generation_prompt")


def sse_json(r):
    return [json.loads(d) for d in r.sse_data() if d != "[DONE]"]
