"""vLLM's continue_final_message, documents and return_tokens_as_token_ids."""

import json

import pytest

from helios_jax.serve.fake import FakeEngine

from .helpers import live_server, post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PREFILLED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=256)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


def prompt_text(engine) -> str:
    return "".join(map(chr, engine.submitted[-1].prompt_tokens))


def test_continue_final_message_ends_the_prompt_inside_the_final_message(server, engine):
    body = {"messages": PREFILLED, "max_tokens": 1, "add_generation_prompt": False}
    assert post(server, CHAT, {**body, "continue_final_message": True}).status == 200
    assert prompt_text(engine) == "user: hi\nassistant: The answer is"
    assert engine.submitted[-1].message_endpoints == (9,)  # the open message has no endpoint
    assert post(server, CHAT, body).status == 200
    assert prompt_text(engine) == "user: hi\nassistant: The answer is\n"


def test_continue_final_message_with_the_generation_prompt_is_a_400_as_in_vllm(server):
    r = post(server, CHAT, {"messages": PREFILLED, "max_tokens": 1, "continue_final_message": True})
    assert r.status == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_documents_reach_the_template(server, engine):
    docs = [{"title": "t", "text": "x"}]
    assert post(server, CHAT, {"messages": PREFILLED, "max_tokens": 1, "documents": docs}).status == 200
    assert "documents=[{'title': 't', 'text': 'x'}]\n" in prompt_text(engine)


@pytest.mark.parametrize("chat", [False, True])
def test_return_tokens_as_token_ids_names_every_token_by_id(server, chat):
    if chat:
        body = {"messages": PREFILLED, "logprobs": True, "top_logprobs": 2}
    else:
        body = {"prompt": "hi", "logprobs": 2}
    body.update(max_tokens=3, return_tokens_as_token_ids=True)
    out = post(server, CHAT if chat else COMPLETIONS, body).json()["choices"][0]
    if chat:
        content = out["logprobs"]["content"]
        tokens = [c["token"] for c in content]
        alternatives = [a["token"] for c in content for a in c["top_logprobs"]]
        text = out["message"]["content"]
    else:
        tokens = out["logprobs"]["tokens"]
        alternatives = [t for top in out["logprobs"]["top_logprobs"] for t in top]
        text = out["text"]
    assert tokens == [f"token_id:{ord(c)}" for c in text]
    assert alternatives and all(a.startswith("token_id:") for a in alternatives)
    plain = {k: v for k, v in body.items() if k != "return_tokens_as_token_ids"}
    assert json.dumps(post(server, CHAT if chat else COMPLETIONS, plain).json()).count("token_id:") == 0


@pytest.mark.parametrize("chat", [False, True])
def test_return_token_ids_in_vllms_places(server, engine, chat):
    path = CHAT if chat else COMPLETIONS
    body = {"messages": PREFILLED} if chat else {"prompt": "hi"}
    body.update(max_tokens=4, return_token_ids=True)
    whole = post(server, path, body).json()
    prompt = list(engine.submitted[-1].prompt_tokens)
    choice = whole["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    assert choice["token_ids"] == [ord(c) for c in text]
    assert (whole if chat else choice)["prompt_token_ids"] == prompt
    chunks = [json.loads(d) for d in post(server, path, {**body, "stream": True}).sse_data()[:-1]]
    holders = [c if chat else c["choices"][0] for c in chunks]
    assert [h.get("prompt_token_ids") for h in holders] == [prompt] + [None] * (len(chunks) - 1)
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == choice["token_ids"]
    plain = post(server, path, {k: v for k, v in body.items() if k != "return_token_ids"}).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in json.dumps(plain)
