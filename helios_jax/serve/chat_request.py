"""``/v1/chat/completions`` requests: messages, the model's chat template, and the chat fields.

The conversation is rendered by the engine tokenizer's ``render_chat`` (the model folder's
template, docs/chat-templates.md) with the request's ``add_generation_prompt`` (default true)
and ``chat_template_kwargs`` (template variables such as Qwen3's ``enable_thinking``). A
message's content is a string or a list of text parts, joined with ``"\\n"`` as vLLM joins them;
its ``name`` and its reasoning (``reasoning_content``, ``reasoning``, ``thinking``) reach the
template too.
The template refusing the conversation (its ``raise_exception``: a ``jinja2.TemplateError``) or
the tokenizer refusing the input (``ValueError``: a reserved template variable, a non-text part)
is a 400 ``invalid_chat_template_input``, never a 500. The message endpoints the renderer
returns go to the engine with the prompt: they anchor the scheduler's checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import jinja2

from helios_jax.runtime.api import MAX_TOP_LOGPROBS, SamplingParams, Tokenizer
from helios_jax.serve import openai_protocol as proto
from helios_jax.serve import prompt_logprobs, prompt_truncation, sampling_controls, tool_calls
from helios_jax.serve.openai_errors import ApiError, bad_request, unsupported
from helios_jax.serve.openai_models import ChatBody, validate

CHAT_ROLES = ("system", "user", "assistant", "tool")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")  # passed to the template as given


def _message_content(index: int, content: str | list[dict]) -> str:
    if isinstance(content, str):
        return content
    param = f"messages[{index}].content"
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise unsupported(
                f"only text content is supported; {param} has a '{part.get('type')}' part "
                "(images, audio and files are not supported)",
                param,
            )
        texts.append(part["text"])
    return "\n".join(texts)  # as vLLM joins text parts


def _message_entry(i: int, message) -> dict:
    """A message's role, content (a string; null only beside tool calls), name, and the tool
    fields the template reads (serve/tool_calls.py)."""
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        code = "invalid_type" if "content" in message.model_fields_set else "missing_field"
        raise bad_request(
            f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content", code
        )
    entry: dict = {"role": message.role}
    if message.content is not None:
        entry["content"] = _message_content(i, message.content)
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_calls:
        if message.role != "assistant":
            raise bad_request(
                f"messages[{i}]: only assistant messages have tool_calls", f"messages[{i}].tool_calls"
            )
        entry["tool_calls"] = tool_calls.template_arguments(message.tool_calls, f"messages[{i}].tool_calls")
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    return entry


def chat_messages(body) -> list[dict]:
    """The messages as {"role", "content"[, "name"]} dicts with string content (400s name the
    first bad message)."""
    messages = body.messages
    if messages is None:
        raise bad_request("missing required field 'messages'", param="messages", code="missing_field")
    if not messages:
        raise bad_request("'messages' must contain at least one message", param="messages")
    out = []
    for i, message in enumerate(messages):
        if message.role not in CHAT_ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {message.role!r}",
                param=f"messages[{i}].role",
            )
        for name in ("function_call", "audio"):
            if (message.model_extra or {}).get(name) is not None:
                raise unsupported(f"messages[{i}].{name} is not supported", f"messages[{i}].{name}")
        entry = _message_entry(i, message)
        for key in REASONING_KEYS:  # an assistant turn's reasoning, which templates may render
            value = (message.model_extra or {}).get(key)
            if isinstance(value, str):
                entry[key] = value
        out.append(entry)
    return out


def render(
    tokenizer: Tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = True,
    template_kwargs: Mapping | None = None,
    continue_final_message: bool = False,
) -> tuple[list[int], tuple[int, ...]]:
    """The tokenizer's chat template over `messages`: (ids, message endpoints); what the
    template or the tokenizer refuses is a 400."""
    extra = {"continue_final_message": True} if continue_final_message else {}
    try:
        ids, endpoints = tokenizer.render_chat(messages, add_generation_prompt, template_kwargs, **extra)
    except (jinja2.TemplateError, ValueError) as e:
        raise ApiError(
            400,
            f"the chat template cannot render these messages: {e}",
            param="messages",
            code="invalid_chat_template_input",
        ) from None
    return list(ids), tuple(endpoints)


def _prompt_ending(body: ChatBody) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message): vLLM's defaults (true, false), and its
    400 when both are true (continuing the final message needs add_generation_prompt false)."""
    add = True if body.add_generation_prompt is None else body.add_generation_prompt
    continued = bool(body.continue_final_message)
    if add and continued:
        raise bad_request(
            "continue_final_message and add_generation_prompt cannot both be true "
            "(set add_generation_prompt to false)",
            "continue_final_message",
        )
    return add, continued


def _chat_logprobs(body: ChatBody) -> tuple[bool, int | None]:
    logprobs, top_logprobs = bool(body.logprobs), body.top_logprobs
    if top_logprobs is not None:
        if not logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(
                f"'top_logprobs' must be from 0 to {MAX_TOP_LOGPROBS}, got {top_logprobs}",
                param="top_logprobs",
            )
    return logprobs, top_logprobs


def parse_chat_request(raw: dict, *, tokenizer: Tokenizer, limits: proto.Limits) -> proto.ParsedRequest:
    """Validate a ``/v1/chat/completions`` body; the prompt is the tokenizer's chat template."""
    body = validate(ChatBody, raw, logprobs_type="a boolean")
    fields = proto._sampling_fields(body)
    stream, include_usage, continuous_usage = proto._parse_stream(body)
    max_tokens = proto._positive_max_tokens(body.max_tokens, "max_tokens")
    max_completion_tokens = proto._positive_max_tokens(body.max_completion_tokens, "max_completion_tokens")
    proto._check_unsupported(raw, proto._NEUTRAL_CHAT)
    proto._log_ignored(body, proto._NEUTRAL_CHAT)
    logprobs, top_logprobs = _chat_logprobs(body)
    n = proto.parse_choices(body)
    source = proto.parse_proposal_source(body)
    model = proto.check_model(body.model, limits.served_model)
    messages = chat_messages(body)
    add_generation_prompt, continued = _prompt_ending(body)
    tools = tool_calls.check_tools(body.tools)
    chars = sum(len(m.get("content", "")) for m in messages) + (len(json.dumps(tools)) if tools else 0)
    proto.check_prompt_chars(chars, limits.max_prompt_chars, "messages")
    tool_mode = tool_calls.parse_tool_choice(body.tool_choice, tools, limits.tool_parser)
    variables = {"tools": tools, "documents": body.documents}
    kwargs = {**{k: v for k, v in variables.items() if v}, **(body.chat_template_kwargs or {})}
    prompt_tokens, endpoints = render(tokenizer, messages, add_generation_prompt, kwargs, continued)
    keep = prompt_truncation.kept_tokens(body.truncate_prompt_tokens, limits.max_model_len)
    side = prompt_truncation.side(body.truncation_side)
    kept = prompt_truncation.truncate(prompt_tokens, keep, side)
    endpoints = prompt_truncation.cut_endpoints(endpoints, len(prompt_tokens), len(kept), side)
    prompt_tokens = list(kept)
    budget = max_completion_tokens if max_completion_tokens is not None else max_tokens
    budget = proto._fit_context(len(prompt_tokens), budget, limits.max_model_len, "messages")
    prompt_k = prompt_logprobs.parse(body.prompt_logprobs, stream)
    scores = prompt_logprobs.sampling_fields(logprobs, top_logprobs or 0, prompt_k)
    controls = sampling_controls.controls(body, tokenizer, budget)
    sampling = SamplingParams(max_tokens=budget, **scores, **fields, **controls)
    return proto.ParsedRequest(
        chat=True,
        model=model,
        prompt_tokens=tuple(prompt_tokens),
        sampling=sampling,
        message_endpoints=endpoints,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        continuous_usage=continuous_usage,
        n=n,
        proposal_source=source,
        top_logprobs=top_logprobs or 0,
        prompt_logprobs=prompt_k,
        tool_parser=tool_mode,
        tokens_as_ids=bool(body.return_tokens_as_token_ids),
        return_token_ids=bool(body.return_token_ids),
    )
