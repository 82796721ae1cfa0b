"""Structured-output fields (serve/structured.py): which constraint a body names, and the 400s."""

import json
import sys

import pytest

from helios_jax.runtime.grammar import GrammarSpec
from helios_jax.serve.openai_errors import ApiError
from helios_jax.serve.structured import compile_grammar, parse_grammar

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    "body, spec, param",
    [
        ({"response_format": {"type": "text"}}, None, None),
        ({"response_format": {"type": "json_object"}}, GrammarSpec("json_object"), "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
            GrammarSpec("json_schema", json.dumps(SCHEMA)),
            "response_format",
        ),
        ({"guided_json": json.dumps(SCHEMA)}, GrammarSpec("json_schema", json.dumps(SCHEMA)), "guided_json"),
        ({"guided_regex": "a+"}, GrammarSpec("regex", "a+"), "guided_regex"),
        ({"guided_choice": ["x", "y"]}, GrammarSpec("choice", '["x", "y"]'), "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, GrammarSpec("grammar", 'root ::= "a"'), "guided_grammar"),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            GrammarSpec("json_schema", json.dumps(SCHEMA), any_whitespace=False),
            "structured_outputs",
        ),
        ({"structured_outputs": {"json_object": True}}, GrammarSpec("json_object"), "structured_outputs"),
        ({"structured_outputs": {"choice": ["x"]}}, GrammarSpec("choice", '["x"]'), "structured_outputs"),
        ({"guided_decoding_backend": "xgrammar"}, None, None),
    ],
)
def test_each_field_names_its_constraint(body, spec, param):
    assert parse_grammar(body) == (None if spec is None else (spec, param))


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"guided_regex": "a("}, "guided_regex", "invalid_grammar"),
        ({"structured_outputs": {"json": {"type": "bogus"}}}, "structured_outputs", "invalid_grammar"),
        ({"guided_grammar": "root ::= "}, "guided_grammar", "invalid_grammar"),
        ({"guided_json": "{not json"}, "guided_json", None),
        ({"guided_choice": []}, "guided_choice", None),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "response_format", None),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", None),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", None),
        ({"response_format": {"type": "structural_tag"}}, "response_format", "unsupported_parameter"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(body, param, code):
    with pytest.raises(ApiError) as info:
        parse_grammar(body)
    error = info.value.body()["error"]
    assert info.value.status == 400 and error["param"] == param
    assert code is None or error["code"] == code


def test_without_xgrammar_or_an_engine_that_compiles_a_constraint_is_a_400(monkeypatch):
    class NoGrammars:
        pass

    spec = GrammarSpec("regex", "a+")
    with pytest.raises(ApiError, match="does not serve structured output") as info:
        compile_grammar(spec, NoGrammars(), "guided_regex")
    assert info.value.status == 400
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ApiError, match=r"xgrammar.*not installed") as info:
        parse_grammar({"guided_regex": "a+"})
    assert (info.value.status, info.value.param) == (400, "guided_regex")
