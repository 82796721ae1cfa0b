"""pydantic models of the OpenAI request bodies, and their type errors as OpenAI error objects.

The models check JSON types only (strict: ``"5"`` is not an integer, ``true`` is not a number,
``2.0`` is not an integer, numbers must be finite); ranges and meanings are checked by
``openai_protocol`` in a fixed order. Fields the models do not name are kept in
``model_extra``: ``openai_protocol`` rejects those it knows and cannot honour and ignores the
rest, as vLLM does (a debug log line names them).

:func:`validate` turns the first pydantic error into the 400 the server always answered:
``param`` is the field's path (``messages[0].content``, ``stream_options.include_usage``), the
code ``invalid_type`` (``missing_field`` for a required field that is absent), and the message
``'max_tokens' must be an integer, got str``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from helios_jax.serve.openai_errors import ApiError, bad_request


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Body):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class _Common(_Body):
    """Fields both endpoints share."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, allow_inf_nan=False)
    top_p: float | None = Field(None, allow_inf_nan=False)
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    n: int | None = None
    best_of: int | None = None
    proposal_source: str | None = None  # helios extension: "learned", "copy" or "both"
    prompt_logprobs: int | None = None  # vLLM's
    logit_bias: dict | None = None
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, allow_inf_nan=False)
    return_tokens_as_token_ids: bool | None = None  # vLLM's: logprobs name tokens "token_id:N"
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens
    truncation_side: str | None = None  # vLLM's: "left" (default: keep the end) or "right"
    return_token_ids: bool | None = None  # vLLM's: token ids beside the text
    spaces_between_special_tokens: bool | None = None  # vLLM's; no effect (docs/serving.md)
    min_p: float | None = Field(None, allow_inf_nan=False)  # vLLM's
    min_tokens: int | None = None  # vLLM's
    allowed_token_ids: list[int] | None = None  # vLLM's
    bad_words: list[str] | None = None  # vLLM's


class CompletionBody(_Common):
    prompt: str | list | None = None
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[dict] | None = None  # null: an assistant turn that only calls tools
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant turn's calls (serve/tool_calls.py)
    tool_call_id: str | None = None  # a tool message: the call it answers


class ChatBody(_Common):
    messages: list[ChatMessage] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None  # vLLM's: the model continues the final message
    documents: list[dict] | None = None  # vLLM's: the template's `documents` (retrieval)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None


# What a type error says a field must be (by the field's name, the last named part of its path).
_EXPECTED = {
    "model": "a string",
    "stream": "a boolean",
    "stream_options": "an object",
    "include_usage": "a boolean",
    "continuous_usage_stats": "a boolean",
    "temperature": "a finite number",
    "top_p": "a finite number",
    "presence_penalty": "a finite number",
    "frequency_penalty": "a finite number",
    "repetition_penalty": "a finite number",
    "top_k": "an integer",
    "seed": "an integer",
    "max_tokens": "an integer",
    "max_completion_tokens": "an integer",
    "n": "an integer",
    "best_of": "an integer",
    "proposal_source": "a string",
    "prompt_logprobs": "an integer",
    "top_logprobs": "an integer",
    "stop": "a string or a list of strings",
    "stop_token_ids": "a list of token ids",
    "ignore_eos": "a boolean",
    "include_stop_str_in_output": "a boolean",
    "skip_special_tokens": "a boolean",
    "truncate_prompt_tokens": "an integer",
    "return_tokens_as_token_ids": "a boolean",
    "truncation_side": "a string",
    "return_token_ids": "a boolean",
    "spaces_between_special_tokens": "a boolean",
    "logit_bias": "an object",
    "prompt": "a string or a list of token ids",
    "echo": "a boolean",
    "suffix": "a string",
    "messages": "a list of messages",
    "role": "a string",
    "content": "a string or a list of text parts",
    "name": "a string",
    "chat_template_kwargs": "an object",
    "add_generation_prompt": "a boolean",
    "tool_calls": "a list of tool calls",
    "tool_call_id": "a string",
    "tools": "a list of tools",
    "continue_final_message": "a boolean",
    "documents": "a list of objects",
    "tool_choice": "a string or an object",
    "parallel_tool_calls": "a boolean",
}
_NESTED = {"include_usage", "continuous_usage_stats", "role", "content", "name", "tool_calls", "tool_call_id"}
Model = TypeVar("Model", bound=BaseModel)


def _param(loc: tuple) -> tuple[str, list]:
    """The field path of a pydantic location, without the union members' type tags
    (``("messages", 0, "content", "str")`` -> ``"messages[0].content"``), and its keys."""
    param, keys = str(loc[0]), [loc[0]]
    for part in loc[1:]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _NESTED:
            param += f".{part}"
        else:
            break
        keys.append(part)
    return param, keys


def _lookup(body: dict, keys: list) -> object:
    value: Any = body
    for key in keys:
        value = value[key]
    return value


def validate(model: type[Model], body: dict, logprobs_type: str = "an integer") -> Model:
    """`body` as `model`, or the 400 of its first type error."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        error = e.errors()[0]
    param, keys = _param(error["loc"])
    if error["type"] == "missing":
        raise bad_request(f"missing required field '{param}'", param=param, code="missing_field")
    value = _lookup(body, keys)
    name = keys[-1]
    if isinstance(name, int):
        expected = "an object"
    elif name == "logprobs":
        expected = logprobs_type
    else:
        expected = _EXPECTED.get(name, "of another type")
    raise _type_error(param, expected, value)


def _type_error(param: str, expected: str, value) -> ApiError:
    got = "null" if value is None else type(value).__name__
    return bad_request(f"'{param}' must be {expected}, got {got}", param=param, code="invalid_type")
