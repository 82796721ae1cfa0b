"""Tool calling as vLLM's OpenAI server does it: tools into the chat template, calls out of the text.

A chat request's ``tools`` (OpenAI function definitions) reach the model folder's chat template as
its ``tools`` variable, as ``apply_chat_template(tools=...)`` passes them (Qwen3's template
writes them into the system turn); the definitions' strings are user text like the messages'
(never control tokens). An assistant message's ``tool_calls`` (their ``arguments`` JSON strings
parsed into objects, as vLLM parses them for templates) and a ``tool`` message's
``tool_call_id`` reach the template with the message.

``tool_choice`` (OpenAI's default: ``"auto"`` when tools are given, else ``"none"``):

  "none"    tools reach the template; the output is plain content (as vLLM by default).
  "auto"    the output is parsed for tool calls; as in vLLM, the server must be started with
            ``--enable_auto_tool_choice`` and ``--tool_call_parser`` (else a 400 that says so).
  "required", a named function
            the output is constrained, through the structured-output grammar (xgrammar), to JSON
            that is a call, as vLLM constrains it: a named function's output is its arguments
            (the function's ``parameters`` schema; any object without one) and becomes that one
            call, finish reason as the engine ended it (as OpenAI reports a forced call);
            "required" outputs a non-empty JSON list of ``{"name", "parameters"}`` objects, one
            per call, each name one of the tools with its own schema, finish reason
            ``"tool_calls"``. The JSON is compact (no whitespace between elements: the client
            parses it, and a model allowed any whitespace may spend its budget there). A second
            structured-output constraint in the request is a 400.

The parser (``--tool_call_parser=hermes``, the format of Qwen2.5/Qwen3 and Hermes models, parsed
as vLLM's ``Hermes2ProToolParser`` parses it): each ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` block (the last one may be unterminated) is one call; the content is the
text before the first block, null when empty; a block that is not such JSON leaves the whole
output as content. Calls found make the finish reason ``"tool_calls"``. Streaming: text before
a block streams as content (a suffix that could begin ``<tool_call>`` is held back until
decided); from the first block on the text is held, and at the end the calls go out as one
``tool_calls`` delta (each call whole: id, type, name and arguments; OpenAI clients accumulate
deltas, so a whole call is a valid stream), or the held text as content if it does not parse.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

from helios_jax.serve.openai_errors import bad_request, unsupported

TOOL_PARSERS = ("hermes",)
REQUIRED, NAMED = "required", "named:"  # the forced tool choices (ParsedRequest.tool_parser)
START, END = "<tool_call>", "</tool_call>"
_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = dataclasses.field(default_factory=lambda: "chatcmpl-tool-" + uuid.uuid4().hex)

    def render(self, index: int | None = None) -> dict:
        out = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def check_tools(tools: list | None) -> list[dict] | None:
    """The request's tools, each ``{"type": "function", "function": {"name", ...}}`` (a 400
    naming the first bad one)."""
    if not tools:
        return None
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise bad_request(
                f"tools[{i}] must be a function tool: {{'type': 'function', 'function': {{...}}}}",
                f"tools[{i}]",
            )
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(
                f"tools[{i}].function.name must be a nonempty string", f"tools[{i}].function.name"
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON schema object",
                f"tools[{i}].function.parameters",
            )
    return list(tools)


def parse_tool_choice(choice, tools: list[dict] | None, parser: str | None) -> str | None:
    """How the output becomes tool calls: None (plain content), the server's parser for "auto",
    ``REQUIRED``, or ``NAMED + name`` for a named function; 400s as vLLM's."""
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise bad_request("tool_choice other than 'none' needs tools", "tool_choice")
    if choice == "auto":
        if parser is None:
            raise unsupported(
                '"auto" tool choice requires the server to run with --enable_auto_tool_choice and '
                "--tool_call_parser",
                "tool_choice",
            )
        return parser
    if choice == REQUIRED:
        return REQUIRED
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if isinstance(name, str) and choice.get("type", "function") == "function":
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return NAMED + name
    raise bad_request(
        f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}", "tool_choice"
    )


def forced_schema(tools: list[dict], mode: str, parallel: bool = True) -> dict:
    """The JSON schema a forced tool choice constrains the output to (vLLM's): the named
    function's parameters, or for "required" a non-empty list of {"name", "parameters"} calls
    (one call only with ``parallel_tool_calls: false``, OpenAI's meaning of it)."""

    def parameters(tool: dict) -> dict:
        return tool["function"].get("parameters") or {"type": "object"}

    if mode.startswith(NAMED):
        name = mode[len(NAMED) :]
        return parameters(next(t for t in tools if t["function"]["name"] == name))
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "parameters": parameters(t),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    listed = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return listed if parallel else {**listed, "maxItems": 1}


def template_arguments(calls: list, param: str) -> list[dict]:
    """An assistant message's tool calls for the template, each ``{"function": {"name",
    "arguments"}, ...}`` (a 400 naming `param` otherwise); arguments JSON text becomes an object."""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{param}: each tool call needs a function with a name", param)
        function = dict(function)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # the template gets the text as given
        out.append({**call, "function": function})
    return out


def extract_calls(mode: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output under `mode` (a parser, ``REQUIRED`` or ``NAMED +
    name``); no calls: the text itself is the content."""
    if mode.startswith(NAMED):
        return "", [ToolCall(mode[len(NAMED) :], text)]
    if mode != REQUIRED:
        return extract(text)
    try:
        listed = json.loads(text)
        calls = [ToolCall(str(c["name"]), json.dumps(c["parameters"], ensure_ascii=False)) for c in listed]
    except (json.JSONDecodeError, KeyError, TypeError):
        return text, []  # cut short (max_tokens): not a list of calls
    return ("", calls) if calls else (text, [])


def extract(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole hermes output; no calls: the text itself is the content."""
    if START not in text:
        return text, []
    try:
        calls = []
        for closed, open_ in _BLOCKS.findall(text):
            raw = json.loads(closed or open_)
            arguments = raw.get("arguments", {})
            calls.append(ToolCall(str(raw["name"]), json.dumps(arguments, ensure_ascii=False)))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return text, []
    content = text[: text.find(START)]
    return (content or None), calls


class StreamingCalls:
    """The streaming side: `feed` returns the content to send now; `finish` the rest as
    (content, calls). A forced choice holds the whole output (it is all one call or list)."""

    def __init__(self, mode: str = "hermes"):
        self.mode = mode
        self.sent = 0  # characters of the text sent as content
        self.text = ""

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.mode == REQUIRED or self.mode.startswith(NAMED):
            return ""
        start = self.text.find(START)
        if start >= 0:
            safe = start
        else:  # hold a suffix that may still become START
            safe = len(self.text)
            for k in range(min(len(START) - 1, len(self.text)), 0, -1):
                if START.startswith(self.text[-k:]):
                    safe = len(self.text) - k
                    break
        out = self.text[self.sent : max(safe, self.sent)]
        self.sent = max(safe, self.sent)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not yet sent and the calls (none: the held text is content)."""
        _, calls = extract_calls(self.mode, self.text)
        if calls:
            return "", calls
        rest, self.sent = self.text[self.sent :], len(self.text)
        return rest, []
