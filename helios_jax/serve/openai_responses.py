"""The OpenAI wire format's responses: pure builders of response, chunk and event payloads.

Each builder is a function of plain data (text, token strings, log-probabilities, counts), so the
server (``streaming.py``) only collects :class:`StreamEvent` fields and calls them. Non-streaming
requests answer with :func:`completion_response` or :func:`chat_response`; streaming ones write
:func:`completion_chunk` or :func:`chat_chunk` payloads, then :func:`usage_chunk` when
``stream_options.include_usage`` asks for it, each framed by :func:`sse`.

Log-probabilities: each generated token's log-probability and, when asked for, up to 20 most
probable alternatives (``top``: per token, (token text, log-probability) pairs, most probable
first, or None), all under the raw model distribution (docs/programs.md, "Log-probabilities").
Completions' ``top_logprobs`` maps each alternative's text to its log-probability and always
holds the sampled token too (OpenAI: up to logprobs + 1 entries); chat lists the alternatives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


Alternatives = Sequence[tuple[str, float]] | None


def completion_logprobs(
    tokens: Sequence[str],
    logprobs: Sequence[float | None],
    text_offset: int = 0,
    top: Sequence[Alternatives] | None = None,
) -> dict:
    """The completions ``logprobs`` object; `text_offset` is where the first token starts in the
    returned text. Example: tokens ("a", "b"), logprobs (None, -1.0), offset 0 ->
    ``{"tokens": ["a", "b"], "token_logprobs": [None, -1.0], "top_logprobs": [None, {"b": -1.0}],
    "text_offset": [0, 1]}``."""
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    top = top if top is not None else [None] * len(tokens)
    tops = []
    for t, lp, alternatives in zip(tokens, logprobs, top, strict=True):
        if lp is None:
            tops.append(None)
            continue
        entry = {text: value for text, value in alternatives or ()}
        entry.setdefault(t, lp)
        tops.append(entry)
    return {
        "tokens": list(tokens),
        "token_logprobs": list(logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _token_entry(token: str, logprob: float | None) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "surrogatepass"))}


def chat_logprobs(
    tokens: Sequence[str], logprobs: Sequence[float | None], top: Sequence[Alternatives] | None = None
) -> dict:
    """The chat ``logprobs`` object: one entry per token with its UTF-8 bytes and alternatives."""
    top = top if top is not None else [None] * len(tokens)
    return {
        "content": [
            {**_token_entry(t, lp), "top_logprobs": [_token_entry(a, v) for a, v in alternatives or ()]}
            for t, lp, alternatives in zip(tokens, logprobs, top, strict=True)
        ]
    }


def completion_response(
    *,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage_: dict,
    logprobs: dict | None = None,
) -> dict:
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": usage_,
    }


def chat_response(
    *,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage_: dict,
    logprobs: dict | None = None,
) -> dict:
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_,
    }


def completion_chunk(
    *,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None = None,
    logprobs: dict | None = None,
    include_usage: bool = False,
) -> dict:
    chunk = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None  # OpenAI: null on every chunk but the last when include_usage is set
    return chunk


def chat_chunk(
    *,
    id: str,
    created: int,
    model: str,
    delta: dict,
    finish_reason: str | None = None,
    logprobs: dict | None = None,
    include_usage: bool = False,
) -> dict:
    chunk = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(*, id: str, created: int, model: str, chat: bool, usage_: dict) -> dict:
    """The final chunk of ``stream_options.include_usage``: no choices, the request's usage."""
    return {
        "id": id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def models_response(model: str, created: int, max_model_len: int) -> dict:
    """The model list: the served model, with vLLM's ``root``, ``parent`` and ``max_model_len``."""
    entry = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "helios_jax",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [entry]}


def sse(payload: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` as is)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
