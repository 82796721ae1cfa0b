"""Structured output over HTTP on the real engine (a tiny random Qwen3 with an MTP head).

Collected by the mode modules (``test_scheduler_http_{off,fixed,adaptive}.py``) on their
module's server, so that no engine is compiled for these alone. The random model has no notion
of JSON: whatever it produces under a grammar is the grammar's doing.

- greedy constrained output equals a step-by-step reference: the full forward's logits at each
  position, masked by xgrammar's bitmask for the tokens so far, argmax, accept (every mode runs
  it, so speculation off, fixed and adaptive give the same text);
- sampled outputs (temperature 1) are valid for their schema, one of the choices, or a full match
  of the regex (adaptive only);
- a multi-token bad word goes through the same per-frame mask: greedy output equals greedy
  decoding under vLLM's ban (adaptive only).
"""

import functools
import json
import re

import numpy as np
import pytest

from helios_jax.runtime.bad_words import banned_next
from helios_jax.runtime.grammar import GrammarSpec, allowed_tokens

from ..runtime.helpers import tokenizer
from .helpers import post

spec = pytest.mark.spec

TAGS = ("red", "green", "blue")
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": list(TAGS)},
    },
    "required": ["ok", "n", "tag"],
    "additionalProperties": False,
}
PROMPT = "hello world, the quick brown fox"


def valid(text: str) -> bool:
    """`text` is a JSON document satisfying SCHEMA (checked by hand: no jsonschema here)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and set(obj) == {"ok", "n", "tag"}
        and isinstance(obj["ok"], bool)
        and type(obj["n"]) is int
        and 0 <= obj["n"] <= 99
        and obj["tag"] in TAGS
    )


def masked_greedy(prompt: tuple[int, ...], limit: int, allowed, accept=lambda token: None) -> list[int]:
    """Greedy decoding with a mask, one full forward per token (``test_engine._logits``):
    `allowed(output)` gives the allowed tokens (bool[V]) after `output`, `accept(token)` is told
    each chosen token and returns True when the output has ended."""
    from ..runtime.test_engine import BUFFER, _logits

    eos = tokenizer().eos_token_ids
    ids, out = list(prompt), []
    while len(out) < limit:
        buf = np.zeros(BUFFER, np.int32)
        buf[: len(ids)] = ids
        logits = np.asarray(_logits(buf))[len(ids) - 1]
        token = int(np.argmax(np.where(allowed(out, logits.shape[-1]), logits, -np.inf)))
        ids.append(token)
        out.append(token)
        if accept(token) or token in eos:
            break
    return out


@functools.cache
def reference_greedy(grammars, spec_: GrammarSpec, prompt: tuple[int, ...], limit: int) -> list[int]:
    """Greedy decoding under the grammar: the logits masked by xgrammar's bitmask for the tokens
    so far; cached: the three mode modules, when one process runs them, compute it once."""
    matcher = grammars.compile(spec_).start()

    def accept(token: int) -> bool:
        matcher.accept([token])
        return matcher.terminated

    return masked_greedy(
        prompt, limit, lambda out, vocab: allowed_tokens(matcher.next_token_mask(), vocab), accept
    )


def _complete(server, **body) -> dict:
    resp = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT} | body, timeout=600)
    assert resp.status == 200, resp.body
    return resp.json()


@spec("useful-service/conditional-acceptance")
def test_greedy_constrained_output_equals_the_masked_reference(server):
    """The grammar restricts conditional acceptance: a speculative round of a grammar request
    verifies its pending token alone, and the mask binds that row, so every mode returns the
    reference's text (off, fixed and adaptive each compare with it)."""
    tok = tokenizer()
    outputs = {"json": SCHEMA, "disable_any_whitespace": True}
    body = _complete(server, max_tokens=48, temperature=0, structured_outputs=outputs)
    choice = body["choices"][0]
    spec_ = GrammarSpec("json_schema", json.dumps(SCHEMA), any_whitespace=False)
    expect = reference_greedy(server.engine.grammars, spec_, tuple(tok.encode(PROMPT)), 48)
    assert choice["text"] == tok.decode(expect) and valid(choice["text"]), choice["text"]
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(expect)  # the EOS the grammar ended with


def test_sampled_json_outputs_are_valid_for_their_schema(server):
    """Eight samples at temperature 1 (n = 8 over four slots). Compact JSON: with any whitespace
    allowed (the default, vLLM's) a random model spends its whole budget on whitespace."""
    outputs = {"json": SCHEMA, "disable_any_whitespace": True}
    body = _complete(server, max_tokens=48, temperature=1.0, n=8, seed=7, structured_outputs=outputs)
    texts = [c["text"] for c in body["choices"]]
    assert len(texts) == 8 and all(valid(t) for t in texts), texts
    assert all(c["finish_reason"] == "stop" for c in body["choices"])


def test_sampled_choices_and_regexes_hold(server):
    choices = ["positive", "negative", "quick brown"]
    # ignore_eos: EOS does not end these requests; the grammar's end (its stop token) does
    body = _complete(server, max_tokens=16, temperature=1.0, n=4, guided_choice=choices, ignore_eos=True)
    assert all(c["text"] in choices and c["finish_reason"] == "stop" for c in body["choices"]), body
    pattern = r"[a-z]{2,5}-[0-9]{1,3}(\.[0-9])?"
    body = _complete(server, max_tokens=24, temperature=1.0, n=4, structured_outputs={"regex": pattern})
    assert all(re.fullmatch(pattern, c["text"]) for c in body["choices"]), body


def test_multi_token_bad_words_equal_the_masked_reference(server):
    """A bad word of two tokens, taken from the free greedy output, is banned where the output
    ends with its first token (vLLM's rule, both spellings), and the text equals greedy decoding
    under that ban; the free text differs, so the ban did bite."""
    tok = tokenizer()
    prompt = tuple(tok.encode("def f(x):\n    return x + 1\n" * 3))
    free = masked_greedy(prompt, 24, lambda out, vocab: np.ones(vocab, bool))
    k = next(
        k
        for k in range(len(free) - 1)
        if tok.decode(free[k : k + 2]).strip() == tok.decode(free[k : k + 2])
        and tok.encode_plain(tok.decode(free[k : k + 2])) == free[k : k + 2]
    )
    word = tok.decode(free[k : k + 2])
    spellings = [tuple(free[k : k + 2])]
    spaced = tuple(tok.encode_plain(" " + word))
    if len(spaced) == 2 and spaced[0] != spellings[0][0]:
        spellings.append(spaced)

    def allowed(out, vocab):
        mask = np.ones(vocab, bool)
        mask[list(banned_next(spellings, out))] = False
        return mask

    expect = masked_greedy(prompt, 24, allowed)
    body = _complete(server, prompt=list(prompt), max_tokens=24, temperature=0, bad_words=[word])
    text = body["choices"][0]["text"]
    assert text == tok.decode(expect) and text != tok.decode(free), (word, text)


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"tag": {"enum": list(TAGS)}},
            "required": ["tag"],
            "additionalProperties": False,
        },
    },
}


def _arguments_fit(name: str, arguments: str) -> bool:
    args = json.loads(arguments)
    if name == "add":
        return (
            set(args) == {"a", "b"}
            and type(args["a"]) is int
            and 0 <= args["a"] <= 9
            and type(args["b"]) is bool
        )
    return name == "note" and set(args) == {"tag"} and args["tag"] in TAGS


def test_forced_tool_choices_return_calls_that_fit_the_tools(server):
    """tool_choice "required" and a named function constrain the output to calls of the tools
    (serve/tool_calls.py): sampled calls (temperature 1, four samples each) name a tool and
    carry arguments its schema accepts (one call each: parallel_tool_calls false, so that a
    random model cannot run past max_tokens listing calls)."""
    messages = [{"role": "user", "content": PROMPT}]
    common = {
        "model": "tiny",
        "messages": messages,
        "tools": [ADD, NOTE],
        "max_tokens": 64,
        "temperature": 1.0,
    }
    named = {"type": "function", "function": {"name": "note"}}
    for choice, n in ((named, 4), ("required", 4)):
        resp = post(
            server,
            "/v1/chat/completions",
            common | {"tool_choice": choice, "n": n, "seed": 11, "parallel_tool_calls": False},
            timeout=600,
        )
        assert resp.status == 200, resp.body
        for c in resp.json()["choices"]:
            calls = c["message"].get("tool_calls")
            assert calls and all(
                _arguments_fit(k["function"]["name"], k["function"]["arguments"]) for k in calls
            ), c
            if choice == "required":
                assert c["finish_reason"] == "tool_calls"
            else:
                assert [k["function"]["name"] for k in calls] == ["note"] and c["finish_reason"] == "stop"
