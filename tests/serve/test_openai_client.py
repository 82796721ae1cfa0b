"""The official `openai` client against a live server over the fake engine.

Expected outputs follow from the fake's docstring: the output cycles CYCLE_TEXT
("The quick brown fox jumps over the lazy dog. "), one token per character, and the chat template
renders ``"{role}: {content}\\n"`` per message then ``"assistant: "``.
"""

import openai
import pytest

from helios_jax.serve.fake import FakeEngine

from .helpers import live_server

MODEL = "helios-fake"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]  # 38 prompt tokens


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=128, tokens_per_event=2)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    # No retries: a 5xx must surface at once rather than after back-off.
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


def submitted(engine: FakeEngine, request_id: str):
    (request,) = [r for r in engine.submitted if r.request_id == request_id]
    return request


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_text_and_usage(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=7)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("The qui", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 7, 12)


def test_completions_default_to_sixteen_tokens(client):
    r = client.completions.create(model=MODEL, prompt="Hello")
    assert r.choices[0].text == "The quick brown " and r.usage.completion_tokens == 16


def test_chat_renders_the_template_with_message_endpoints(client, engine):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=9)
    message = r.choices[0].message
    assert (message.role, message.content, r.choices[0].finish_reason) == ("assistant", "The quick", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (38, 9, 47)
    request = submitted(engine, r.id)
    assert request.message_endpoints == (18, 27)
    assert engine.tokenizer.decode(request.prompt_tokens) == "system: Be brief.\nuser: hi\nassistant: "


def test_chat_without_max_tokens_fills_the_context(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT)
    assert r.usage.completion_tokens == 128 - 38


def test_max_completion_tokens_takes_precedence(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, max_completion_tokens=3)
    assert r.choices[0].message.content == "The"


def test_stop_strings(client):
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=40, stop=[" brown", "zzz"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("The quick", "stop")
    assert r.usage.completion_tokens == 15  # the stop string's tokens were generated
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, stop="fox")
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("The quick brown ", "stop")


def test_sampling_parameters_reach_the_engine(client, engine):
    r = client.completions.create(
        model=MODEL,
        prompt="ab",
        max_tokens=3,
        temperature=0.25,
        top_p=0.5,
        seed=7,
        stop="q",
        extra_body={"top_k": 5},
    )
    sampling = submitted(engine, r.id).sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (0.25, 0.5, 5, 7)
    assert (sampling.max_tokens, sampling.stop) == (3, ("q",))
    assert not sampling.logprobs and not sampling.prompt_logprobs


def test_completion_logprobs_with_echo(client, engine):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, logprobs=0, echo=True)
    choice = r.choices[0]
    assert choice.text == "HiThe"
    lp = choice.logprobs
    assert lp.tokens == ["H", "i", "T", "h", "e"]
    assert lp.token_logprobs == [None, -1.0, -0.5, -0.5, -0.5]
    assert lp.top_logprobs == [None, {"i": -1.0}, {"T": -0.5}, {"h": -0.5}, {"e": -0.5}]
    assert lp.text_offset == [0, 1, 2, 3, 4]
    assert r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 3  # echo is not usage
    sampling = submitted(engine, r.id).sampling
    assert sampling.logprobs and sampling.prompt_logprobs


def test_completion_echo_with_top_logprobs(client, engine):
    """echo with logprobs: 2 gives every prompt token but the first its 2 alternatives (the fake's
    ids t, t + 1 at -1.0, -2.0), as OpenAI and vLLM do, streaming or not."""
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["H", "i", "T"] and lp.token_logprobs == [None, -1.0, -0.5]
    assert lp.top_logprobs == [None, {"i": -1.0, "j": -2.0}, {"T": -0.5, "U": -1.5}]
    chunks = list(
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, logprobs=2, echo=True, stream=True)
    )
    tops = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.top_logprobs]
    assert tops == lp.top_logprobs


def test_echo_without_logprobs_asks_for_no_prompt_scores(client, engine):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, echo=True)
    assert r.choices[0].text == "HiTh" and r.choices[0].logprobs is None
    assert not submitted(engine, r.id).sampling.prompt_logprobs


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, logprobs=True)
    content = r.choices[0].logprobs.content
    assert [(c.token, c.logprob, c.bytes, c.top_logprobs) for c in content] == [
        ("T", -0.5, [84], []),
        ("h", -0.5, [104], []),
    ]


def test_completion_top_logprobs(client, engine):
    """logprobs: N returns N alternatives per token (plus the sampled one, as OpenAI does)."""
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["T", "h"] and lp.token_logprobs == [-0.5, -0.5]
    assert lp.top_logprobs == [{"T": -0.5, "U": -1.5}, {"h": -0.5, "i": -1.5}]
    assert submitted(engine, r.id).sampling.top_logprobs == 2


def test_chat_top_logprobs(client, engine):
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=1, logprobs=True, top_logprobs=3
    )
    (entry,) = r.choices[0].logprobs.content
    assert [(a.token, a.logprob) for a in entry.top_logprobs] == [("T", -0.5), ("U", -1.5), ("V", -2.5)]
    assert submitted(engine, r.id).sampling.top_logprobs == 3


def test_streaming_chat_top_logprobs(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, logprobs=True, top_logprobs=1, stream=True
        )
    )
    entries = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [[(a.token, a.logprob) for a in e.top_logprobs] for e in entries] == [[("T", -0.5)], [("h", -0.5)]]


def test_streaming_chat_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The q"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 43
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_streaming_completion(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "The qu"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_streaming_stop_and_logprobs(client):
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=30, stream=True, stop="ick", logprobs=0, echo=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == "HiThe qu"
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert (
        tokens[:2] == ["H", "i"] and "".join(tokens[2:]) == "The quick"
    )  # the stop's tokens keep their scores
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "call, error, code",
    [
        (lambda c: c.completions.create(model="gpt-4", prompt="a"), openai.NotFoundError, "model_not_found"),
        (
            lambda c: c.completions.create(
                model=MODEL, prompt="a", extra_body={"guided_whitespace_pattern": " "}
            ),
            openai.BadRequestError,
            "unsupported_parameter",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="a", max_tokens=0),
            openai.BadRequestError,
            "invalid_value",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="a" * 120, max_tokens=10),
            openai.BadRequestError,
            "context_length_exceeded",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            ),
            openai.BadRequestError,
            "unsupported_parameter",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=CHAT, response_format={"type": "json_object"}
            ),
            openai.BadRequestError,
            "unsupported_parameter",
        ),
    ],
)
def test_errors_map_to_the_client_exceptions(client, call, error, code):
    with pytest.raises(error) as info:
        call(client)
    assert info.value.code == code
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == "T"


def test_engine_failure_is_a_500_and_the_server_keeps_serving(client, engine):
    engine.inject_failure("stream", "device lost")
    with pytest.raises(openai.InternalServerError, match="the engine failed") as info:
        client.completions.create(model=MODEL, prompt="a", max_tokens=3)
    assert "device lost" not in str(info.value)
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == "T"


def test_api_key_is_enforced_for_the_client():
    with live_server(FakeEngine(), api_key="s3cret") as server:
        url = f"{server.url}/v1"
        with openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0) as good:
            assert good.completions.create(model=MODEL, prompt="a", max_tokens=2).choices[0].text == "Th"


def test_n_choices_streamed_and_not(client):
    """n = 2 through the client: two indexed choices, and a stream whose chunks the client
    sorts by index into the same two texts."""
    r = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, max_tokens=4)
    assert [(c.index, c.message.content) for c in r.choices] == [(0, "The "), (1, "The ")]
    assert r.usage.completion_tokens == 8
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {0: "The", 1: "The"}
