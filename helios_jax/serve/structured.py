"""Structured-output fields of a request: which constraint the client asked for, checked and compiled.

The fields, as OpenAI and vLLM name them (at most one constraint per request, as vLLM requires):

- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}`` (any JSON), or
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``;
- ``structured_outputs`` (vLLM's since v0.12): one of ``json`` (a schema, object or JSON text),
  ``regex``, ``choice`` (strings), ``grammar`` (EBNF) or ``json_object: true``, with
  ``disable_any_whitespace`` (compact JSON); ``disable_additional_properties`` and
  ``disable_fallback`` are accepted (xgrammar's strict schemas already forbid properties a
  schema does not name; there is one backend);
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar``, and
  ``guided_decoding_backend`` (accepted and ignored: xgrammar is the only backend).

``whitespace_pattern`` (``guided_whitespace_pattern``) and ``structural_tag`` are refused (400):
xgrammar's JSON grammars take no whitespace pattern, and structural tags are not served.

:func:`parse_grammar` runs with the other protocol checks and returns the
:class:`~helios_jax.runtime.grammar.GrammarSpec`; :func:`compile_grammar` compiles it with the
engine's grammars (``engine.grammars``), in the parsing worker thread: a request naming a
structured-output field is always parsed off the event loop (``generation.py``).
"""

from __future__ import annotations

import json

from helios_jax.runtime.grammar import CompiledConstraint, GrammarSpec, GrammarUnavailable
from helios_jax.serve import tool_calls
from helios_jax.serve.openai_errors import ApiError, bad_request, unsupported

GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
OUTPUT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
IGNORED_OUTPUT_KEYS = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")
REFUSED = ("whitespace_pattern", "structural_tag")
FIELDS = ("response_format", "structured_outputs", "guided_decoding_backend", *GUIDED)
# Bytes whose presence in a body sends its parsing to a worker thread (grammar compilation).
BODY_MARKERS = (b"response_format", b"structured_outputs", b"guided_")


def _spec(kind: str, value, param: str, any_whitespace: bool) -> GrammarSpec:
    """The spec of one constraint value; 400 naming `param` for a value of the wrong type."""
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad_request(f"{param}: the schema is not valid JSON", param=param) from None
        if not isinstance(value, (dict, bool)):
            raise bad_request(f"{param} must be a JSON schema (an object)", param=param, code="invalid_type")
        return GrammarSpec("json_schema", json.dumps(value), any_whitespace)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"{param} must be a non-empty list of non-empty strings", param=param)
        return GrammarSpec("choice", json.dumps(value), any_whitespace)
    if kind == "json_object":
        return GrammarSpec("json_object", "", any_whitespace)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty string", param=param, code="invalid_type")
    return GrammarSpec(kind, value, any_whitespace)


def _response_format(value) -> GrammarSpec | None:
    param = "response_format"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("response_format must be an object with a 'type'", param=param, code="invalid_type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise unsupported(
            f"response_format type {kind!r} is not supported (text, json_object, json_schema)", param
        )
    inner = value.get("json_schema")
    if not isinstance(inner, dict) or "schema" not in inner:
        raise bad_request(
            "response_format json_schema needs 'json_schema': {'schema': {...}}",
            param=param,
            code="missing_field",
        )
    return _spec("json", inner["schema"], "response_format.json_schema.schema", True)


def _structured_outputs(value) -> GrammarSpec | None:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise bad_request("structured_outputs must be an object", param=param, code="invalid_type")
    for key in REFUSED:
        if value.get(key) is not None:
            raise unsupported(f"structured_outputs.{key} is not supported", f"{param}.{key}")
    for key in IGNORED_OUTPUT_KEYS:
        if value.get(key) is not None and not isinstance(value[key], bool):
            raise bad_request(f"{param}.{key} must be a boolean", param=f"{param}.{key}", code="invalid_type")
    given = [k for k in OUTPUT_KEYS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise bad_request(
            f"structured_outputs: give one of {', '.join(OUTPUT_KEYS)}, got {given}", param=param
        )
    if not given:
        return None
    compact = value.get("disable_any_whitespace") is True
    return _spec(given[0], value[given[0]], f"{param}.{given[0]}", not compact)


def parse_grammar(body: dict) -> tuple[GrammarSpec, str] | None:
    """The request's constraint and the field that gave it (None: free text), checked by
    xgrammar's parser.

    Raises:
      ApiError: 400 for a malformed field, more than one constraint, a schema, regex or grammar
        xgrammar cannot parse, or (naming the package) when xgrammar is not installed.
    """
    specs = {}
    if body.get("response_format") is not None:
        specs["response_format"] = _response_format(body["response_format"])
    if body.get("structured_outputs") is not None:
        specs["structured_outputs"] = _structured_outputs(body["structured_outputs"])
    for name, kind in GUIDED.items():
        if body.get(name) is not None:
            specs[name] = _spec(kind, body[name], name, True)
    specs = {name: spec for name, spec in specs.items() if spec is not None}
    if len(specs) > 1:
        names = ", ".join(specs)
        raise bad_request(
            f"give one structured-output constraint per request, got {names}", param=next(iter(specs))
        )
    if not specs:
        return None
    ((param, spec),) = specs.items()
    try:
        spec.check()
    except GrammarUnavailable as e:
        raise unsupported(str(e), param) from None
    except ValueError as e:
        raise bad_request(f"{param}: {e}", param=param, code="invalid_grammar") from None
    return spec, param


def forced_tool_grammar(body: dict, mode: str | None) -> tuple[GrammarSpec, str] | None:
    """A forced tool choice's constraint (``tool_calls.forced_schema``, compact JSON), checked
    like a ``json_schema`` response format; None for "none" and "auto"."""
    if mode is None or not (mode == tool_calls.REQUIRED or mode.startswith(tool_calls.NAMED)):
        return None
    # Compact JSON: arguments are JSON text the client parses, so whitespace carries nothing, and
    # a model allowed any whitespace can spend its budget on it (vLLM's default allows it).
    parallel = body.get("parallel_tool_calls") is not False
    schema = json.dumps(tool_calls.forced_schema(body["tools"], mode, parallel))
    spec = GrammarSpec("json_schema", schema, any_whitespace=False)
    try:
        spec.check()
    except GrammarUnavailable as e:
        raise unsupported(str(e), "tool_choice") from None
    except ValueError as e:
        raise bad_request(f"tools: {e}", param="tools", code="invalid_grammar") from None
    return spec, "tool_choice"


def compile_grammar(spec: GrammarSpec, engine, param: str) -> CompiledConstraint:
    """`spec` compiled by the engine's grammars; 400 when the engine serves no structured output."""
    grammars = getattr(engine, "grammars", None)
    if grammars is None:
        raise unsupported("this engine does not serve structured output", param)
    try:
        return grammars.compile(spec)
    except GrammarUnavailable as e:
        raise unsupported(str(e), param) from None
    except ValueError as e:
        raise bad_request(f"{param}: {e}", param=param, code="invalid_grammar") from None
    except Exception as e:  # noqa: BLE001 - a compiler failure is this request's alone
        raise ApiError(
            400, f"the grammar could not be compiled: {e}", param=param, code="invalid_grammar"
        ) from None
