"""vLLM's sampling controls over HTTP (`serve/sampling_controls.py`) and in `SamplingParams`.

Against the fake engine (its tokenizer maps each character to its code point, vocabulary
0x110000): both endpoints accept every control and hand the engine the same `SamplingParams`
fields (bad words tokenized as vLLM does: "a" bans token 97; " b" is stripped to "b"; "cd" is
the sequence 99, 100, its spaced spelling " cd" three tokens, so not a second spelling); bad
values are 400s naming the field, and nothing is submitted. `SamplingParams` itself refuses the
same ranges with a ValueError naming the field, and `check_stop_ids` refuses ids outside the
vocabulary.
"""

import pytest

from helios_jax.runtime.api import SamplingParams, check_stop_ids
from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.openai_models import CompletionBody, validate
from helios_jax.serve.sampling_controls import controls

from ..runtime.helpers import tokenizer
from .helpers import live_server, post

COMPLETIONS, CHAT_PATH = "/v1/completions", "/v1/chat/completions"
CHAT = [{"role": "user", "content": "hi"}]
CONTROLS = {
    "presence_penalty": 0.5,
    "frequency_penalty": -1.5,
    "repetition_penalty": 1.2,
    "logit_bias": {"50": 10, "7": -100},
    "min_p": 0.1,
    "min_tokens": 2,
    "allowed_token_ids": [97, 98, 99, 7],
    "bad_words": ["a", " b", "cd"],
    "max_tokens": 4,
}
EXPECTED = dict(
    presence_penalty=0.5,
    frequency_penalty=-1.5,
    repetition_penalty=1.2,
    logit_bias=((50, 10.0), (7, -100.0)),
    min_p=0.1,
    min_tokens=2,
    allowed_token_ids=(97, 98, 99, 7),
    bad_token_ids=(97, 98),
    bad_word_sequences=((99, 100),),
)


@pytest.fixture(scope="module")
def engine():
    return FakeEngine(max_model_len=64)


@pytest.fixture(scope="module")
def server(engine):
    with live_server(engine) as server:
        yield server


@pytest.mark.parametrize("path, base", [(COMPLETIONS, {"prompt": "hello"}), (CHAT_PATH, {"messages": CHAT})])
def test_every_control_is_accepted_and_reaches_the_engine(server, engine, path, base):
    r = post(server, path, {**base, **CONTROLS})
    assert r.status == 200, r.body
    (request,) = [q for q in engine.submitted if q.request_id == r.json()["id"]]
    assert {name: getattr(request.sampling, name) for name in EXPECTED} == EXPECTED


BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty", None),
    ({"frequency_penalty": -3}, "frequency_penalty", None),
    ({"repetition_penalty": 0}, "repetition_penalty", None),
    ({"min_p": 1.5}, "min_p", None),
    ({"min_p": -0.1}, "min_p", None),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", None),
    ({"min_tokens": -1}, "min_tokens", None),
    ({"logit_bias": {"x": 1}}, "logit_bias", None),
    ({"logit_bias": {"50": 100.5}}, "logit_bias", None),
    ({"logit_bias": {"1114112": 1}}, "logit_bias", None),
    ({"logit_bias": {"5": True}}, "logit_bias", None),
    ({"allowed_token_ids": []}, "allowed_token_ids", None),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids", None),
    ({"allowed_token_ids": [0x110000]}, "allowed_token_ids", None),
    ({"allowed_token_ids": [97], "bad_words": ["a"]}, "bad_words", None),
    ({"bad_words": [" "]}, "bad_words", None),
    ({"presence_penalty": "much"}, "presence_penalty", "invalid_type"),
]


@pytest.mark.parametrize("path, base", [(COMPLETIONS, {"prompt": "hello"}), (CHAT_PATH, {"messages": CHAT})])
@pytest.mark.parametrize("body, param, code", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_controls_are_400s_naming_the_field(server, engine, path, base, body, param, code):
    submitted = len(engine.submitted)
    r = post(server, path, {**base, **body})
    assert r.status == 400, r.body
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert len(engine.submitted) == submitted


@pytest.mark.parametrize(
    "fields, name",
    [
        (dict(presence_penalty=2.1), "presence_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_p=1.01), "min_p"),
        (dict(min_tokens=9), "min_tokens"),
        (dict(logit_bias=((3, 101.0),)), "logit_bias"),
        (dict(logit_bias=((-3, 1.0),)), "logit_bias"),
        (dict(allowed_token_ids=()), "allowed_token_ids"),
        (dict(bad_token_ids=(-1,)), "bad_token_ids"),
        (dict(bad_word_sequences=((5,),)), "bad_word_sequences"),  # one token: bad_token_ids
    ],
)
def test_sampling_params_refuse_out_of_range_controls(fields, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(max_tokens=8, **fields)


@pytest.mark.parametrize(
    "fields, name",
    [
        (dict(logit_bias=((300, 1.0),)), "logit_bias"),
        (dict(allowed_token_ids=(1, 300)), "allowed_token_ids"),
        (dict(bad_token_ids=(300,)), "bad_token_ids"),
        (dict(bad_word_sequences=((1, 300),)), "bad_word_sequences"),
    ],
)
def test_ids_outside_the_vocabulary_are_refused(fields, name):
    check_stop_ids(SamplingParams(max_tokens=8), (0,), 300, 4)
    with pytest.raises(ValueError, match=name):
        check_stop_ids(SamplingParams(max_tokens=8, **fields), (0,), 300, 4)


def test_bad_words_ban_both_spellings_that_are_one_token():
    """vLLM tokenizes a bad word bare and with a leading space; on the byte-level BPE of the
    engine tests "the" and " the" are one token each (both banned), " x" is two (only "x")."""
    tok = tokenizer()
    body = validate(CompletionBody, {"prompt": "x", "bad_words": ["the", " x"]})
    (the,), (space_the,), (x,) = (tok.encode_plain(w) for w in ("the", " the", "x"))
    assert the != space_the and len(tok.encode_plain(" x")) == 2
    assert controls(body, tok, 4)["bad_token_ids"] == (the, space_the, x)
