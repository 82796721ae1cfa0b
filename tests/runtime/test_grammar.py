"""Structured output on the host (runtime/grammar.py): xgrammar's matcher over the engine's
tokenizer, checked token by token against texts whose validity is known, without a model."""

import json
import sys

import numpy as np
import pytest

from helios_jax.runtime.grammar import (
    Grammars,
    GrammarSpec,
    GrammarUnavailable,
    allowed_tokens,
    choice_grammar,
)

from .helpers import tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
}


@pytest.fixture(scope="module")
def grammars():
    tok = tokenizer()
    return Grammars(tok, tok.vocab_size, tok.eos_token_ids)


def _walk(grammars, spec, text):
    """Feed `text`'s tokens, asserting that each one's mask allows it and others are refused;
    returns the matcher after the text and the mask that follows it."""
    tok = tokenizer()
    matcher = grammars.compile(spec).start()
    for token in tok.encode(text):
        allowed = allowed_tokens(matcher.next_token_mask(), tok.vocab_size)
        assert allowed[token], (text, tok.decode([token]))
        assert not allowed.all()  # a constraint: something is refused at every step
        matcher.accept([token])
    return matcher, allowed_tokens(matcher.next_token_mask(), tok.vocab_size)


def test_a_json_schema_admits_a_valid_object_then_only_the_stop_tokens(grammars):
    tok = tokenizer()
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), any_whitespace=False)
    matcher, after = _walk(grammars, spec, '{"ok": true, "n": 12}')
    assert not matcher.terminated
    # "}" closed the object: only the stop tokens are left.
    assert set(np.flatnonzero(after)) == set(tok.eos_token_ids)
    matcher.accept([tok.eos_token_ids[0]])
    assert matcher.terminated


def test_a_forbidden_token_is_refused_and_leaves_the_matcher_where_it_was(grammars):
    tok = tokenizer()
    matcher = grammars.compile(GrammarSpec("json_schema", json.dumps(SCHEMA), False)).start()
    first = tok.encode("{")
    matcher.accept(first)
    with pytest.raises(ValueError, match="violates"):
        matcher.accept(tok.encode('"n"') + tok.encode("x"))  # "n" must follow "ok" here
    assert matcher.accepted == len(first)
    matcher.accept(tok.encode('"ok"'))  # still right after "{"
    assert matcher.accepted == len(first) + len(tok.encode('"ok"'))


def test_choices_and_regexes_restrict_every_step(grammars):
    tok = tokenizer()
    assert choice_grammar(['a"b', "c"]) == 'root ::= "a\\"b" | "c"'
    spec = GrammarSpec("choice", json.dumps(["hello world", "the quick"]))
    matcher, after = _walk(grammars, spec, "hello world")
    assert set(np.flatnonzero(after)) == set(tok.eos_token_ids)
    matcher, after = _walk(grammars, GrammarSpec("regex", "[0-9]{2}-(ab|cd)"), "42-cd")
    assert set(np.flatnonzero(after)) == set(tok.eos_token_ids)


@pytest.mark.parametrize(
    "spec, message",
    [
        (GrammarSpec("json_schema", '{"type": "bogus"}'), "Unsupported type"),
        (GrammarSpec("regex", "a("), "parenthesis"),
        (GrammarSpec("grammar", "root ::= "), "EBNF"),
    ],
)
def test_invalid_constraints_are_value_errors_before_and_at_compilation(grammars, spec, message):
    with pytest.raises(ValueError, match=message):
        spec.check()
    with pytest.raises(ValueError, match=message):
        grammars.compile(spec)


def test_without_xgrammar_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    with pytest.raises(GrammarUnavailable, match="xgrammar"):
        GrammarSpec("regex", "a+").check()
