"""vLLM's utility endpoints: ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``.

``/tokenize`` returns exactly the tokens a generation request would be given: a ``prompt`` is
encoded as ``/v1/completions`` encodes it, ``messages`` are rendered by the chat template as
``/v1/chat/completions`` renders them (``add_generation_prompt``, default true, and
``chat_template_kwargs`` as there). vLLM's
``add_special_tokens`` is accepted and changes nothing: the server's tokenizers add no special
tokens to a prompt, on either path. The answer is vLLM's: ``{"count", "max_model_len",
"tokens", "token_strs"}`` (``token_strs`` with ``return_token_strs: true``, else null).
``/detokenize`` turns ``{"tokens": [...]}`` into ``{"prompt": text}``. Both check the model name
and the prompt limits like the generation endpoints, and tokenize in a worker thread.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import anyio.to_thread
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import helios_jax
from helios_jax.runtime.api import Engine
from helios_jax.serve import chat_request
from helios_jax.serve import openai_protocol as proto
from helios_jax.serve.body import parse_json_body, read_body
from helios_jax.serve.generation import require_engine
from helios_jax.serve.openai_errors import ApiError, bad_request
from helios_jax.serve.openai_models import ChatMessage, _Body, validate

if TYPE_CHECKING:
    from helios_jax.serve.app import HeliosServer


class TokenizeBody(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict | None = None
    return_token_strs: bool | None = None


class DetokenizeBody(_Body):
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


def _tokenize(raw: bytes, engine: Engine, limits: proto.Limits) -> dict:
    body = validate(TokenizeBody, parse_json_body(raw))
    proto.check_model(body.model, limits.served_model)
    tokenizer = engine.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("send either 'prompt' or 'messages'", param="prompt", code="missing_field")
    if body.prompt is not None:
        proto.check_prompt_chars(len(body.prompt), limits.max_prompt_chars, "prompt")
        tokens = list(tokenizer.encode(body.prompt))
    else:
        messages = chat_request.chat_messages(body)
        chars = sum(len(m["content"]) for m in messages)
        proto.check_prompt_chars(chars, limits.max_prompt_chars, "messages")
        add_generation_prompt = body.add_generation_prompt is not False
        tokens = chat_request.render(tokenizer, messages, add_generation_prompt, body.chat_template_kwargs)[0]
    strs = [tokenizer.decode([t]) for t in tokens] if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": limits.max_model_len, "tokens": tokens, "token_strs": strs}


def _detokenize(raw: bytes, engine: Engine, limits: proto.Limits) -> dict:
    body = validate(DetokenizeBody, parse_json_body(raw))
    proto.check_model(body.model, limits.served_model)
    try:
        ids = proto.check_token_ids(body.tokens, engine.tokenizer)
    except ApiError as e:
        raise bad_request(e.message, param="tokens") from None
    return {"prompt": engine.tokenizer.decode(ids)}


async def _in_thread(request: Request, work) -> Response:
    server: HeliosServer = request.app.state.server
    engine = require_engine(server)
    raw = await read_body(request, server.config.max_body_bytes)
    call = functools.partial(work, raw, engine, server.limits())
    return JSONResponse(await anyio.to_thread.run_sync(call, limiter=server.parse_limiter))


async def tokenize(request: Request) -> Response:
    return await _in_thread(request, _tokenize)


async def detokenize(request: Request) -> Response:
    return await _in_thread(request, _detokenize)


async def version(request: Request) -> Response:
    return JSONResponse({"version": helios_jax.__version__})
