"""Chat tool calling: tools reach the template, hermes calls come out as tool_calls (vLLM's shape).

The fake engine in "reverse" mode answers with its prompt reversed, so a message holding a
reversed ``<tool_call>`` block makes the model "call" that tool."""

import json

import pytest

from helios_jax.serve import tool_calls
from helios_jax.serve.fake import FakeEngine

from .helpers import live_server, post

CHAT = "/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
STOP = " :resu"  # the reversed "user: ": the output ends with the reversed message
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=1024, mode="reverse", tokens_per_event=3)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine, shutdown_engine=False, tool_call_parser="hermes") as server:
        yield server


def calling(text: str = CALL) -> list[dict]:
    """Messages whose reversed rendering (the fake's output) holds `text`."""
    return [{"role": "user", "content": text[::-1]}]


def test_tools_reach_the_template_and_a_call_comes_back_parsed(server, engine):
    r = post(server, CHAT, {"messages": calling(), "tools": [WEATHER], "max_tokens": 600, "stop": STOP})
    assert r.status == 200, r.body
    choice = r.json()["choices"][0]
    assert "tools=[{'type': 'function', 'function': {'name': 'weather'" in "".join(
        map(chr, engine.submitted[-1].prompt_tokens)
    )
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    content = choice["message"]["content"]
    assert content is not None and "<tool_call>" not in content  # the text before the block


def test_tool_choice_none_leaves_the_output_as_content(server):
    body = {"messages": calling(), "tools": [WEATHER], "tool_choice": "none", "max_tokens": 600, "stop": STOP}
    choice = post(server, CHAT, body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert CALL in choice["message"]["content"]


def test_streamed_calls_arrive_as_one_delta_and_content_never_shows_the_block(server):
    body = {"messages": calling(), "tools": [WEATHER], "max_tokens": 600, "stop": STOP, "stream": True}
    chunks = [json.loads(d) for d in post(server, CHAT, body).sse_data()[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert "<tool_call" not in content and "<" not in content[-12:]
    (calls,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_block_that_is_not_a_call_streams_as_content(server):
    text = "<tool_call>not json</tool_call>"
    body = {"messages": calling(text), "tools": [WEATHER], "max_tokens": 600, "stop": STOP, "stream": True}
    chunks = [json.loads(d) for d in post(server, CHAT, body).sse_data()[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text in content and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_conversation_with_calls_and_results_renders(server, engine):
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    r = post(server, CHAT, {"messages": messages, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 1})
    assert r.status == 200, r.body
    assert "tool: sunny\n" in "".join(map(chr, engine.submitted[-1].prompt_tokens))


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),  # the fake: no grammars
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "weather"}}},
            "tool_choice",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tool_requests_are_400(server, body, param):
    r = post(server, CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **body})
    assert r.status == 400 and r.json()["error"]["param"] == param, r.body


def test_auto_needs_the_servers_parser_as_in_vllm():
    engine = FakeEngine()
    with live_server(engine) as server:
        r = post(server, CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]})
        assert r.status == 400 and "--enable_auto_tool_choice" in r.json()["error"]["message"]
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [WEATHER],
            "tool_choice": "none",
            "max_tokens": 1,
        }
        assert post(server, CHAT, body).status == 200


def test_extract_follows_vllms_hermes_parser():
    assert tool_calls.extract("plain") == ("plain", [])
    content, calls = tool_calls.extract(
        'hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}'
    )  # the last unterminated
    assert content == "hi " and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("f", {"a": 1}),
        ("g", {}),
    ]
    assert tool_calls.extract(CALL)[0] is None
    assert tool_calls.extract("<tool_call>[1]</tool_call>") == ("<tool_call>[1]</tool_call>", [])


def test_streaming_holds_only_what_could_begin_a_block():
    s = tool_calls.StreamingCalls()
    assert s.feed("ab<tool") == "ab"
    assert s.feed("x") == "<toolx"
    assert s.feed(" <tool_call>{") == " "
    assert s.feed('"name": "f"}</tool_call>') == ""
    rest, calls = s.finish()
    assert rest == "" and calls[0].name == "f"


def test_forced_schemas_are_vllms():
    """A named function's schema is its parameters; "required" a non-empty list of calls, each
    one tool's name and parameters (one call only without parallel tool calls)."""
    params = WEATHER["function"]["parameters"]
    assert tool_calls.forced_schema([WEATHER], "named:weather") == params
    listed = tool_calls.forced_schema([WEATHER], "required")
    assert listed["minItems"] == 1 and "maxItems" not in listed
    (call,) = listed["items"]["anyOf"]
    assert call["properties"] == {"name": {"type": "string", "enum": ["weather"]}, "parameters": params}
    assert tool_calls.forced_schema([WEATHER], "required", parallel=False)["maxItems"] == 1
    assert (
        tool_calls.extract_calls("required", '[{"name": "weather", "parameters": {"city": "Oslo"}}]')[1][
            0
        ].name
        == "weather"
    )
    assert tool_calls.extract_calls("required", '[{"name": "weather"')[1] == []  # cut short: content
