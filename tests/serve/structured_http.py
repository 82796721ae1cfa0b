"""Structured output over HTTP on the real engine (a tiny random Qwen3 with an MTP head).

Collected by the mode modules (``test_scheduler_http_{off,fixed,adaptive}.py``) on their
module's server, so that no engine is compiled for these alone. The random model has no notion
of JSON: whatever it produces under a grammar is the grammar's doing.

- greedy constrained output equals a step-by-step reference: the full forward's logits at each
  position, masked by xgrammar's bitmask for the tokens so far, argmax, accept (every mode runs
  it, so speculation off, fixed and adaptive give the same text);
- sampled outputs (temperature 1) are valid for their schema, one of the choices, or a full match
  of the regex (adaptive only).
"""

import functools
import json
import re

import numpy as np
import pytest

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


@functools.cache
def reference_greedy(grammars, spec_: GrammarSpec, prompt: tuple[int, ...], limit: int) -> list[int]:
    """Greedy decoding under the grammar, one full forward per token (``test_engine._logits``);
    cached: the three mode modules, when one process runs them, compute it once."""
    from ..runtime.test_engine import BUFFER, _logits

    tok = tokenizer()
    matcher = grammars.compile(spec_).start()
    ids, out = list(prompt), []
    while len(out) < limit and not matcher.terminated:
        buf = np.zeros(BUFFER, np.int32)
        buf[: len(ids)] = ids
        logits = np.asarray(_logits(buf))[len(ids) - 1]
        allowed = allowed_tokens(matcher.next_token_mask(), logits.shape[-1])
        token = int(np.argmax(np.where(allowed, logits, -np.inf)))
        matcher.accept([token])
        ids.append(token)
        out.append(token)
        if token in tok.eos_token_ids:
            break
    return out


def _complete(server, **body) -> dict:
    resp = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, **body}, timeout=600)
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
