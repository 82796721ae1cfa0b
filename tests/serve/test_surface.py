"""vLLM's request surface over the fake engine: chat templates and their fields, per-request
stop control, n > 1 and lists of prompts, continuous usage, prompt_logprobs, proposal_source."""

import http.client
import json
import time

import pytest

from helios_jax.serve.fake import CharTokenizer, FakeEngine

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
    body = {"messages": [{"role": "user", "content": parts}], "add_generation_prompt": False}
    r = post(server, "/tokenize", {**body, "chat_template_kwargs": {"x": 1}})
    assert "".join(map(chr, r.json()["tokens"])) == "user: a\nb\nx=1\n"


class RecordingTokenizer(CharTokenizer):
    def render_chat(self, messages, add_generation_prompt=True, template_kwargs=None):
        self.seen = messages
        return super().render_chat(messages, add_generation_prompt, template_kwargs)


def test_a_messages_name_and_reasoning_reach_the_template():
    engine = FakeEngine()
    engine.tokenizer = RecordingTokenizer()
    turn = {"role": "assistant", "content": "4", "name": "bot", "reasoning_content": "2+2", "extra": 1}
    with live_server(engine) as plain:
        assert post(plain, CHAT, {"messages": [*HI, turn, *HI], "max_tokens": 1}).status == 200
    assert engine.tokenizer.seen[1] == {
        "role": "assistant",
        "content": "4",
        "name": "bot",
        "reasoning_content": "2+2",
    }


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


# -- per-request stop control --------------------------------------------------------------------


def test_stop_token_ids_end_the_output_and_keep_the_token(server):
    body = {"prompt": "a", "max_tokens": 30, "stop_token_ids": [ord("q"), ord("z")]}
    r = post(server, COMPLETIONS, body).json()
    assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"]) == ("The q", "stop")
    assert r["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("include, text", [(False, "The "), (True, "The qu")])
def test_include_stop_str_in_output_keeps_the_matched_stop_string(server, engine, include, text):
    body = {"prompt": "a", "max_tokens": 30, "stop": ["quick", "qu"], "include_stop_str_in_output": include}
    r = post(server, COMPLETIONS, body).json()
    assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"]) == (
        text if not include else "The qu",
        "stop",
    )
    assert last_submitted(engine).sampling.include_stop_str_in_output is include


def test_skip_special_tokens_reaches_the_engine(server, engine):
    for value, want in ((False, False), (True, True), (None, True)):
        body = {"messages": HI, "max_tokens": 2, **({} if value is None else {"skip_special_tokens": value})}
        assert post(server, CHAT, body).status == 200
        assert last_submitted(engine).sampling.skip_special_tokens is want
    r = post(server, CHAT, {"messages": HI, "skip_special_tokens": 0})
    assert r.status == 400 and r.json()["error"]["param"] == "skip_special_tokens"


def test_stop_ids_beyond_the_device_capacity_are_refused_unless_eos_is_ignored(server, engine):
    ids = [ord(c) for c in "wxyz"]  # with the EOS id: 5 stop ids, one more than a lane holds
    r = post(server, COMPLETIONS, {"prompt": "a", "stop_token_ids": ids})
    assert r.status == 400 and "at most 4 stop tokens" in r.json()["error"]["message"]
    r = post(server, COMPLETIONS, {"prompt": "a", "max_tokens": 2, "stop_token_ids": ids, "ignore_eos": True})
    assert r.status == 200
    sampling = last_submitted(engine).sampling
    assert (sampling.stop_token_ids, sampling.ignore_eos) == (tuple(ids), True)
    for bad in ({"stop_token_ids": [-1]}, {"stop_token_ids": ["7"]}, {"ignore_eos": 0}):
        r = post(server, CHAT, {"messages": HI, **bad})
        assert r.status == 400 and r.json()["error"]["param"].startswith(next(iter(bad)))


# -- n > 1 and lists of prompts ------------------------------------------------------------------


def test_n_and_a_list_of_prompts_give_indexed_choices_and_summed_usage(server, engine):
    before = len(engine.submitted)
    body = {"prompt": ["ab", "xyz"], "n": 2, "best_of": 2, "max_tokens": 3, "seed": 2**64 - 1}
    r = post(server, COMPLETIONS, body).json()
    assert [(c["index"], c["text"]) for c in r["choices"]] == [(i, "The") for i in range(4)]
    assert r["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    submitted = engine.submitted[before:]
    assert [text_of(s) for s in submitted] == ["ab", "ab", "xyz", "xyz"]
    assert [s.sampling.seed for s in submitted] == [2**64 - 1, 0, 2**64 - 1, 0]  # (seed + j) mod 2**64
    assert len({s.request_id for s in submitted}) == 4


def test_streamed_choices_carry_their_index_and_one_summed_usage(server):
    body = {
        "messages": HI,
        "n": 3,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse_json(post(server, CHAT, body))
    by_index: dict = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        by_index.setdefault(choice["index"], []).append(choice)
    assert sorted(by_index) == [0, 1, 2]
    for deltas in by_index.values():
        assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(d["delta"].get("content", "") for d in deltas) == "Th"
        assert deltas[-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens"] == len("user: hi\nassistant: ")


def test_continuous_usage_stats_put_usage_on_every_chunk(server):
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": "ab", "max_tokens": 3, "stream": True, "stream_options": options}
    chunks = sse_json(post(server, COMPLETIONS, body))
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3, 3]
    assert all(c["usage"]["prompt_tokens"] == 2 for c in chunks)
    options = {"include_usage": False, "continuous_usage_stats": True}  # as vLLM: needs include_usage
    chunks = sse_json(post(server, COMPLETIONS, {**body, "stream_options": options}))
    assert all("usage" not in c for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_a_departed_client_cancels_every_choice(stream):
    engine = FakeEngine(token_delay_s=0.05, max_model_len=4096)
    with live_server(engine) as slow:
        conn = http.client.HTTPConnection("127.0.0.1", slow.port, timeout=5)
        body = json.dumps({"prompt": "a", "n": 3, "max_tokens": 2000, "stream": stream})
        conn.request("POST", COMPLETIONS, body=body, headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 5
        while len(engine.submitted) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        conn.close()
        ids = [s.request_id for s in engine.submitted]
        assert len(ids) == 3 and all(engine.wait_for_cancel(i, timeout=5) for i in ids)


class SecondRefused(FakeEngine):
    def submit(self, request):
        if len(self.submitted) == 1:
            raise ValueError("the second choice is refused")
        return super().submit(request)


def test_a_refused_choice_cancels_those_already_submitted():
    engine = SecondRefused(token_delay_s=0.05)
    with live_server(engine) as server:
        r = post(server, COMPLETIONS, {"prompt": "a", "n": 2, "max_tokens": 100})
        assert (r.status, r.json()["error"]["message"]) == (400, "the second choice is refused")
        (first,) = engine.submitted
        assert engine.wait_for_cancel(first.request_id, timeout=5)


# -- proposal_source -----------------------------------------------------------------------------


def test_proposal_source_reaches_the_engine_and_is_checked(server, engine):
    body = {"prompt": "a", "max_tokens": 1, "proposal_source": "copy"}
    assert post(server, COMPLETIONS, body).status == 200
    assert last_submitted(engine).proposal_source == "copy"
    assert post(server, CHAT, {"messages": HI, "max_tokens": 1, "proposal_source": "both"}).status == 200
    assert last_submitted(engine).proposal_source == "both"
    r = post(server, CHAT, {"messages": HI, "proposal_source": "oracle"})
    assert (r.status, r.json()["error"]["param"]) == (400, "proposal_source")


# -- prompt_logprobs -----------------------------------------------------------------------------


def entry(token: str, logprob: float, rank):
    return {str(ord(token)): {"logprob": logprob, "rank": rank, "decoded_token": token}}


def test_prompt_logprobs_on_the_choice_in_vllms_shape(server, engine):
    """The fake scores prompt token t (but the first) -1.0 with alternatives t, t + 1 at -1.0, -2.0."""
    r = post(server, COMPLETIONS, {"prompt": "abc", "max_tokens": 1, "prompt_logprobs": 2}).json()
    (choice,) = r["choices"]
    assert choice["prompt_logprobs"] == [
        None,
        {**entry("b", -1.0, 1), **entry("c", -2.0, 2)},
        {**entry("c", -1.0, 1), **entry("d", -2.0, 2)},
    ]
    assert choice["logprobs"] is None
    sampling = last_submitted(engine).sampling
    assert (sampling.prompt_logprobs, sampling.top_logprobs) == (True, 2)
    body = {"prompt": "abc", "max_tokens": 1, "prompt_logprobs": 1, "logprobs": 3}
    (choice,) = post(server, COMPLETIONS, body).json()["choices"]  # the engine holds 3 per token
    assert choice["prompt_logprobs"][1:] == [entry("b", -1.0, 1), entry("c", -1.0, 1)]
    assert len(choice["logprobs"]["top_logprobs"][0]) == 3


def test_chat_prompt_logprobs_on_the_response_and_each_count_shown_apart(server):
    body = {"messages": HI, "max_tokens": 2, "prompt_logprobs": 3, "logprobs": True, "top_logprobs": 1}
    r = post(server, CHAT, body).json()
    scores = r["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len("user: hi\nassistant: ")
    assert [len(s) for s in scores[1:]] == [3] * (len(scores) - 1)
    content = r["choices"][0]["logprobs"]["content"]
    assert [len(t["top_logprobs"]) for t in content] == [1, 1]  # the engine held 3
    r = post(server, CHAT, {"messages": HI, "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert r["prompt_logprobs"][1] == entry("s", -1.0, None)  # "user": the prompt token, no alternatives
    for bad in ({"prompt_logprobs": 21}, {"prompt_logprobs": 1, "stream": True}):
        r = post(server, CHAT, {"messages": HI, **bad})
        assert (r.status, r.json()["error"]["param"]) == (400, "prompt_logprobs")
