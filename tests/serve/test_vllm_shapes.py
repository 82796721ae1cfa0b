"""Request shapes from vLLM's own OpenAI-server tests, through the official client.

Each test ports one test of vLLM's ``tests/entrypoints/openai/completion/test_completion.py``
or ``chat_completion/test_chat.py`` (named in its docstring) onto the fake engine: the same
request, and vLLM's assertions wherever they do not depend on the model (the fake ignores
temperature and seeds, so vLLM's "the samples differ" checks have no counterpart here). A client
moving from vLLM sends exactly these shapes.
"""

import openai
import pytest

from helios_jax.serve.fake import FakeEngine

from .helpers import live_server

MODEL = "helios-fake"
MESSAGES = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is 1+1?"},
]
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]


@pytest.fixture(scope="module")
def client():
    with live_server(FakeEngine(max_model_len=512, tokens_per_event=2)) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10) as c:
            yield c


def test_single_completion(client):
    """test_single_completion: text and token-id prompts, usage."""
    completion = client.completions.create(
        model=MODEL, prompt="Hello, my name is", max_tokens=5, temperature=0.0
    )
    choice = completion.choices[0]
    assert completion.id and len(completion.choices) == 1 and len(choice.text) >= 5
    assert choice.finish_reason == "length"
    assert (completion.usage.completion_tokens, completion.usage.prompt_tokens) == (5, 17)
    assert completion.usage.total_tokens == 22
    completion = client.completions.create(model=MODEL, prompt=[1, 1, 1, 1, 1], max_tokens=5, temperature=0.0)
    assert len(completion.choices[0].text) >= 1


@pytest.mark.parametrize("logprobs, count", [(None, None), (0, 1), (5, 5)])
def test_no_zero_and_some_logprobs(client, logprobs, count):
    """test_no_logprobs, test_zero_logprobs, test_some_logprobs."""
    choice = client.completions.create(
        model=MODEL, prompt=[1, 1, 1, 1, 1], max_tokens=5, temperature=0.0, logprobs=logprobs
    ).choices[0]
    if count is None:
        assert choice.logprobs is None
    else:
        assert choice.logprobs.token_logprobs is not None
        assert count <= len(choice.logprobs.top_logprobs[0]) <= count + 1


def test_too_many_completion_logprobs(client):
    """test_too_many_completion_logprobs: 21 and 30 refused, streaming or not; serving goes on."""
    for logprobs, stream in ((21, False), (30, True)):
        with pytest.raises((openai.BadRequestError, openai.APIError)):
            out = client.completions.create(
                model=MODEL, prompt=[1, 1, 1, 1, 1], max_tokens=5, logprobs=logprobs, stream=stream
            )
            for _ in out if stream else ():
                pass
    assert client.completions.create(model=MODEL, prompt=[1, 1, 1, 1, 1], max_tokens=5).choices[0].text


@pytest.mark.parametrize("prompt_logprobs", [-1, 0, 1, None])
def test_prompt_logprobs_completion(client, prompt_logprobs):
    """test_prompt_logprobs_completion: a list of two prompts, vLLM's prompt_logprobs."""
    params = {"model": MODEL, "prompt": ["A robot may not injure another robot", "My name is"]}
    if prompt_logprobs is not None:
        params["extra_body"] = {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**params)
        return
    completion = client.completions.create(**params)
    for choice in completion.choices:
        logprobs = getattr(choice, "prompt_logprobs", None)
        assert (logprobs is not None and len(logprobs) > 0) == (prompt_logprobs is not None)


def test_completion_streaming(client):
    """test_completion_streaming: the stream's text equals the answer's; one finish reason."""
    single = client.completions.create(model=MODEL, prompt="What is an LLM?", max_tokens=5, temperature=0.0)
    chunks, finishes = [], 0
    for chunk in client.completions.create(
        model=MODEL, prompt="What is an LLM?", max_tokens=5, temperature=0.0, stream=True
    ):
        chunks.append(chunk.choices[0].text)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1 and chunk.choices[0].finish_reason == "length"
    assert "".join(chunks) == single.choices[0].text


def test_parallel_sampling(client):
    """test_parallel_no_streaming, test_parallel_streaming: n=3 with seed, indices and finishes."""
    completion = client.completions.create(
        model=MODEL, prompt="What is an LLM?", max_tokens=50, n=3, temperature=1.0, logprobs=0, seed=42
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.finish_reason is not None for c in completion.choices)
    finishes, texts = 0, [""] * 3
    for chunk in client.completions.create(
        model=MODEL, prompt="What is an LLM?", max_tokens=50, n=3, temperature=1.0, stream=True, seed=42
    ):
        texts[chunk.choices[0].index] += chunk.choices[0].text
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 3 and texts == [c.text for c in completion.choices]


def test_completion_stream_options(client):
    """test_completion_stream_options: the four combinations, {} and the non-streaming 400s."""
    ask = dict(model=MODEL, prompt="What is the capital of France?", max_tokens=5, temperature=0.0)
    for options in ({"include_usage": False, "continuous_usage_stats": False}, {}, {"include_usage": False}):
        assert all(
            c.usage is None for c in client.completions.create(**ask, stream=True, stream_options=options)
        )
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
    options = {"include_usage": True, "continuous_usage_stats": True}
    for chunk in client.completions.create(**ask, stream=True, stream_options=options):
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
    for options in ({"include_usage": None}, {"include_usage": True}, {"continuous_usage_stats": True}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**ask, stream=False, stream_options=options)


def test_batch_completions(client):
    """test_batch_completions: text and token-id batches, plain and streamed (n=2 there needs
    beam search, which is refused here: see docs/serving.md)."""
    for prompts in (["Hello, my name is"] * 2, [[1, 1, 1, 1, 1]] * 2):
        batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0.0)
        assert len(batch.choices) == 2 and batch.choices[0].text == batch.choices[1].text
        texts = [""] * 2
        for chunk in client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, stream=True):
            assert len(chunk.choices) == 1
            texts[chunk.choices[0].index] += chunk.choices[0].text
        assert texts[0] == texts[1]


@pytest.mark.parametrize("logprobs_arg", [1, 0])
def test_echo_logprob_completion(client, logprobs_arg):
    """test_echo_logprob_completion: the prompt echoed with its log-probabilities."""
    for prompt in ("Hello, my name is", [72, 101, 108, 108, 111, 33]):
        completion = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0, echo=True, logprobs=logprobs_arg
        )
        text = prompt if isinstance(prompt, str) else "".join(map(chr, prompt))
        assert completion.choices[0].text.startswith(text)
        logprobs = completion.choices[0].logprobs
        assert len(logprobs.text_offset) > 5 and len(logprobs.tokens) > 5
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        for top in logprobs.top_logprobs[1:]:
            assert max(logprobs_arg, 1) <= len(top) <= logprobs_arg + 1


@pytest.mark.parametrize("top_logprobs, count", [(None, None), (0, 0), (5, 5)])
def test_no_zero_and_some_logprobs_chat(client, top_logprobs, count):
    """test_no_logprobs_chat, test_zero_logprobs_chat, test_some_logprobs_chat."""
    extra = {} if top_logprobs is None else {"logprobs": True, "top_logprobs": top_logprobs}
    choice = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=5, temperature=0.0, **extra
    ).choices[0]
    if count is None:
        assert choice.logprobs is None
    else:
        assert len(choice.logprobs.content[0].top_logprobs) == count


def test_too_many_chat_logprobs(client):
    """test_too_many_chat_logprobs."""
    for top, stream in ((21, True), (30, False)):
        with pytest.raises((openai.BadRequestError, openai.APIError)):
            out = client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_completion_tokens=10,
                logprobs=True,
                top_logprobs=top,
                stream=stream,
            )
            for _ in out if stream else ():
                pass
    message = (
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10)
        .choices[0]
        .message
    )
    assert message.content is not None


@pytest.mark.parametrize("prompt_logprobs", [1, 0, -1, None])
def test_prompt_logprobs_chat(client, prompt_logprobs):
    """test_prompt_logprobs_chat and test_more_than_one_prompt_logprobs_chat."""
    params = {"model": MODEL, "messages": HISTORY}
    if prompt_logprobs is not None:
        params["extra_body"] = {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**params)
        return
    completion = client.chat.completions.create(**params)
    scores = getattr(completion, "prompt_logprobs", None)
    assert (scores is not None and len(scores) > 0) == (prompt_logprobs is not None)
    if prompt_logprobs:
        two = client.chat.completions.create(**{**params, "extra_body": {"prompt_logprobs": 2}})
        assert len(scores[3]) == 1 and len(two.prompt_logprobs[3]) == 2


def test_single_chat_session(client):
    """test_single_chat_session: usage, role, then a second turn."""
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=5, logprobs=True, top_logprobs=5
    )
    choice = completion.choices[0]
    assert completion.id and len(completion.choices) == 1 and choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 5
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 5
    assert choice.message.role == "assistant" and len(choice.message.content) >= 5
    turn = [*MESSAGES, {"role": "assistant", "content": choice.message.content}]
    turn.append({"role": "user", "content": "express your result in json"})
    assert (
        client.chat.completions.create(model=MODEL, messages=turn, max_completion_tokens=5).choices[0].message
    )


def test_chat_streaming(client):
    """test_chat_streaming: role first, content equal to the answer's, one finish reason."""
    output = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.0
    )
    chunks, finishes = [], 0
    for chunk in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.0, stream=True
    ):
        delta = chunk.choices[0].delta
        assert delta.role in (None, "assistant")
        if delta.content:
            chunks.append(delta.content)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1 and chunk.choices[0].finish_reason == output.choices[0].finish_reason
    assert "".join(chunks) == output.choices[0].message.content


def test_chat_completion_stream_options(client):
    """test_chat_completion_stream_options (but min_tokens, which the sampling controls test)."""
    ask = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.0)
    assert all(
        c.usage is None
        for c in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": False})
    )
    chunks = list(
        client.chat.completions.create(
            **ask, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": False}
        )
    )
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    for options in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**ask, stream=False, stream_options=options)
    last = 0
    options = {"include_usage": True, "continuous_usage_stats": True}
    for chunk in client.chat.completions.create(**ask, stream=True, stream_options=options):
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        assert last == 0 or chunk.usage.completion_tokens >= last
        last = chunk.usage.completion_tokens
    assert last == 10
