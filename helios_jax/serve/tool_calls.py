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
            need the output constrained to the tools' JSON schemas (vLLM drives them through its
            structured output backend): a 400 ``unsupported_parameter`` here.

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


def parse_tool_choice(choice, tools: list[dict] | None, parser: str | None) -> bool:
    """Whether the output is parsed for tool calls (True only for "auto"); 400s as vLLM's."""
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return False
    if not tools:
        raise bad_request("tool_choice other than 'none' needs tools", "tool_choice")
    if choice == "auto":
        if parser is None:
            raise unsupported(
                '"auto" tool choice requires the server to run with --enable_auto_tool_choice and '
                "--tool_call_parser",
                "tool_choice",
            )
        return True
    if choice == "required" or isinstance(choice, dict):
        raise unsupported(
            "tool_choice 'required' or a named function needs output constrained to the tools' "
            "schemas, which this server does not do; use 'auto' or 'none'",
            "tool_choice",
        )
    raise bad_request(
        f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}", "tool_choice"
    )


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


def extract(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output; no calls: the text itself is the content."""
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
    (content, calls)."""

    def __init__(self):
        self.sent = 0  # characters of the text sent as content
        self.text = ""

    def feed(self, piece: str) -> str:
        self.text += piece
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
        _, calls = extract(self.text)
        if calls:
            return "", calls
        rest, self.sent = self.text[self.sent :], len(self.text)
        return rest, []
