"""The OpenAI wire format's requests: parsing and validation.

Parsing turns a JSON body into a :class:`ParsedRequest` (token ids, message endpoints and
:class:`SamplingParams`) or raises :class:`~helios_jax.serve.openai_errors.ApiError`, which carries
the HTTP status and renders as the OpenAI error object ``{"error": {"message", "type", "param",
"code"}}``. Validation runs in one order for both endpoints, so the first problem a client sees is
the most basic one:

1. JSON types of every known field (``param`` names the field);
2. unknown fields and unsupported options (n > 1, best_of, tools, response_format, grammar,
   logit_bias, nonzero penalties, images and other non-text content parts);
3. the model name (404 when it is not the served one);
4. the prompt or messages, tokenized through the engine's tokenizer;
5. the context: prompt tokens plus ``max_tokens`` must fit ``max_model_len``.

The answers are built by ``openai_responses``, pure functions the server (``streaming.py``) calls.

Log-probabilities: the engine returns each generated token's log-probability and up to 20
alternatives (``MAX_TOP_LOGPROBS``). Completions accept ``logprobs`` 0..20 and chat accepts
``logprobs: true`` with ``top_logprobs`` 0..20; more is a 400 rather than a silently short list.

Sampling ranges (each a 400 naming the field): temperature finite and >= 0; top_p in (0, 1];
top_k -1 or 0 (off) or positive, where any top_k >= the vocabulary is off (it keeps every
token; the engine clamps it, as vLLM does); seed any signed or unsigned 64-bit integer (the
engine folds it into the programs' 32-bit seed, deterministically: ``api.program_seed``).
"""

from __future__ import annotations

import dataclasses
import json
import math

from helios_jax.runtime.api import MAX_TOP_LOGPROBS, SamplingParams, Tokenizer
from helios_jax.serve.openai_errors import ApiError, bad_request, unsupported

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default
MAX_STOP_STRINGS = 16
CHAT_ROLES = ("system", "user", "assistant")


# -- JSON and field types ------------------------------------------------------------------------


def _reject_constant(name: str):
    raise bad_request(f"invalid JSON: {name} is not a JSON number", code="invalid_json")


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object (400 for invalid UTF-8/JSON, NaN/Infinity, non-objects)."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise bad_request("the request body is not valid UTF-8", code="invalid_json") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(
            f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json"
        )
    return body


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _type_error(name: str, expected: str, value) -> ApiError:
    got = "null" if value is None else type(value).__name__
    return bad_request(f"'{name}' must be {expected}, got {got}", param=name, code="invalid_type")


def _opt_bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _opt_int(body: dict, name: str, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise _type_error(name, "an integer", value)
    return value


def _opt_number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise _type_error(name, "a finite number", value)
    return float(value)


# -- unsupported options -------------------------------------------------------------------------

# Fields accepted and ignored: bookkeeping that changes nothing about the generated text.
_IGNORED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"}
_GRAMMAR_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structured_outputs",
    "grammar",
)
_COMMON = {
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "stop",
    "n",
    "logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    *_GRAMMAR_FIELDS,
    *_IGNORED,
}
COMPLETION_FIELDS = frozenset(_COMMON | {"prompt", "echo", "best_of", "suffix"})
CHAT_FIELDS = frozenset(
    _COMMON
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "parallel_tool_calls",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    }
)


def _check_unsupported(body: dict, allowed: frozenset) -> None:
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise bad_request(
            f"unrecognized request argument(s): {', '.join(unknown)}",
            param=unknown[0],
            code="unrecognized_argument",
        )
    n = _opt_int(body, "n", 1)
    if n < 1:
        raise bad_request(f"'n' must be at least 1, got {n}", param="n")
    if n > 1:
        raise unsupported("n > 1 is not supported: one choice per request", "n")
    best_of = _opt_int(body, "best_of", 1)
    if best_of != 1:
        raise unsupported("best_of is not supported (only best_of=1)", "best_of")
    if body.get("suffix") not in (None, ""):
        raise unsupported("suffix (insertion) is not supported", "suffix")
    for name in ("tools", "functions"):
        if body.get(name) not in (None, []):
            raise unsupported(f"{name} (tool and function calling) are not supported", name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise unsupported(f"{name} is not supported (tool and function calling)", name)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise unsupported(
            "response_format (JSON mode, structured and grammar-constrained output) is not "
            'supported; only {"type": "text"}',
            "response_format",
        )
    for name in _GRAMMAR_FIELDS[1:]:
        if body.get(name) is not None:
            raise unsupported(f"{name}: grammar-constrained output is not supported", name)
    if body.get("logit_bias") not in (None, {}):
        raise unsupported("logit_bias is not supported", "logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if _opt_number(body, name, 0.0) != 0.0:
            raise unsupported(f"{name} other than 0 is not supported", name)
    if _opt_number(body, "repetition_penalty", 1.0) != 1.0:
        raise unsupported("repetition_penalty other than 1 is not supported", "repetition_penalty")
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise unsupported("only the text modality is supported", "modalities")
    for name in ("audio", "prediction", "reasoning_effort", "web_search_options"):
        if body.get(name) is not None:
            raise unsupported(f"{name} is not supported", name)


# -- the parsed request ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParsedRequest:
    """A validated request, ready for ``Engine.submit``.

    Attributes:
      chat: chat completion (True) or text completion.
      model: the model name the response reports.
      prompt_tokens: token ids of the prompt (the rendered conversation, for chat).
      message_endpoints: chat only: the token endpoint of each message.
      sampling: the engine's sampling parameters (``prompt_logprobs`` only for echo + logprobs).
      stream: answer with SSE chunks.
      include_usage: streaming: a final chunk with usage.
      echo: completions: prepend the prompt text (and, with logprobs, its log-probabilities).
      logprobs: render log-probabilities of the generated tokens.
    """

    chat: bool
    model: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    message_endpoints: tuple[int, ...] = ()
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: bool = False


def _check_model(body: dict, served_model: str) -> str:
    model = body.get("model")
    if model is None:
        return served_model  # optional here (OpenAI requires it); curl users may leave it out
    if not isinstance(model, str):
        raise _type_error("model", "a string", model)
    if model != served_model:
        raise ApiError(
            404,
            f"The model '{model}' does not exist; this server serves '{served_model}'.",
            param="model",
            code="model_not_found",
        )
    return model


def _parse_stream(body: dict) -> tuple[bool, bool]:
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
    if not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise bad_request(
            f"unrecognized stream_options field(s): {', '.join(unknown)}", param="stream_options"
        )
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _type_error("stream_options.include_usage", "a boolean", include_usage)
    return stream, bool(include_usage)


def _parse_stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _type_error("stop", "a string or a list of strings", stop)
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(
            f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}", param="stop"
        )
    return tuple(dict.fromkeys(stops))  # deduplicated, in order


def _sampling_fields(body: dict) -> dict:
    temperature = _opt_number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad_request(f"'temperature' must be nonnegative, got {temperature}", param="temperature")
    top_p = _opt_number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must lie in (0, 1], got {top_p}", param="top_p")
    top_k = _opt_int(body, "top_k", 0)
    if top_k < -1:
        raise bad_request(
            f"'top_k' must be -1, 0 (both: no restriction) or positive, got {top_k}", param="top_k"
        )
    seed = _opt_int(body, "seed")
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise bad_request("'seed' must fit in 64 bits", param="seed")
    return dict(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=seed, stop=_parse_stop(body))


def _positive_max_tokens(body: dict, name: str) -> int | None:
    value = _opt_int(body, name)
    if value is not None and value <= 0:
        raise bad_request(f"'{name}' must be at least 1, got {value}", param=name, code="invalid_value")
    return value


def _fit_context(prompt_len: int, max_tokens: int | None, max_model_len: int, param: str) -> int:
    """The output budget: `max_tokens`, or the rest of the context when it is None."""
    if prompt_len == 0:
        raise bad_request("the prompt must contain at least one token", param=param)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
        if max_tokens <= 0:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} "
                "tokens and leaves no room for output.",
                param=param,
                code="context_length_exceeded",
            )
    elif prompt_len + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
            "completion). Please reduce the prompt or max_tokens.",
            param=param,
            code="context_length_exceeded",
        )
    return max_tokens


def _check_token_ids(ids: list, tokenizer: Tokenizer) -> tuple[int, ...]:
    vocab = getattr(tokenizer, "vocab_size", None)
    for t in ids:
        if not _is_int(t) or t < 0 or (vocab is not None and t >= vocab):
            bound = f" below {vocab}" if vocab is not None else ""
            raise bad_request(f"token ids must be integers from 0{bound}, got {t!r}", param="prompt")
    return tuple(ids)


def _completion_prompt(body: dict, tokenizer: Tokenizer) -> tuple[int, ...]:
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("missing required field 'prompt'", param="prompt", code="missing_field")
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise unsupported(f"only a single prompt per request is supported, got {len(prompt)}", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(prompt))
    if isinstance(prompt, list):
        return _check_token_ids(prompt, tokenizer)
    raise _type_error("prompt", "a string or a list of token ids", prompt)


def parse_completion_request(
    body: dict, *, tokenizer: Tokenizer, served_model: str, max_model_len: int
) -> ParsedRequest:
    """Validate a ``/v1/completions`` body (see the module docstring for the order)."""
    fields = _sampling_fields(body)
    stream, include_usage = _parse_stream(body)
    echo = _opt_bool(body, "echo")
    logprobs = _opt_int(body, "logprobs")
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"'logprobs' must be from 0 to {MAX_TOP_LOGPROBS}, got {logprobs}", param="logprobs"
        )
    max_tokens = _positive_max_tokens(body, "max_tokens")
    _check_unsupported(body, COMPLETION_FIELDS)
    model = _check_model(body, served_model)
    prompt_tokens = _completion_prompt(body, tokenizer)
    max_tokens = _fit_context(
        len(prompt_tokens), max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS, max_model_len, "prompt"
    )
    sampling = SamplingParams(
        max_tokens=max_tokens,
        prompt_logprobs=echo and logprobs is not None,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        **fields,
    )
    return ParsedRequest(
        chat=False,
        model=model,
        prompt_tokens=prompt_tokens,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        echo=echo,
        logprobs=logprobs is not None,
    )


def _message_content(index: int, content: object) -> str:
    param = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(
                    f"only text content is supported; {param} has a '{kind}' part "
                    "(images, audio and files are not supported)",
                    param,
                )
            texts.append(part["text"])
        return "".join(texts)
    raise _type_error(param, "a string or a list of text parts", content)


def _chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("missing required field 'messages'", param="messages", code="missing_field")
    if not isinstance(messages, list):
        raise _type_error("messages", "a list of messages", messages)
    if not messages:
        raise bad_request("'messages' must contain at least one message", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _type_error(f"messages[{i}]", "an object", message)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}",
                param=f"messages[{i}].role",
            )
        for name in ("tool_calls", "function_call", "audio"):
            if message.get(name) is not None:
                raise unsupported(f"messages[{i}].{name} is not supported", f"messages[{i}].{name}")
        if "content" not in message:
            raise bad_request(
                f"messages[{i}] has no 'content'", param=f"messages[{i}].content", code="missing_field"
            )
        out.append({"role": role, "content": _message_content(i, message["content"])})
    return out


def parse_chat_request(
    body: dict, *, tokenizer: Tokenizer, served_model: str, max_model_len: int
) -> ParsedRequest:
    """Validate a ``/v1/chat/completions`` body; the prompt is the tokenizer's chat template."""
    fields = _sampling_fields(body)
    stream, include_usage = _parse_stream(body)
    logprobs = _opt_bool(body, "logprobs")
    top_logprobs = _opt_int(body, "top_logprobs")
    max_tokens = _positive_max_tokens(body, "max_tokens")
    max_completion_tokens = _positive_max_tokens(body, "max_completion_tokens")
    _check_unsupported(body, CHAT_FIELDS)
    if top_logprobs is not None:
        if not logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(
                f"'top_logprobs' must be from 0 to {MAX_TOP_LOGPROBS}, got {top_logprobs}",
                param="top_logprobs",
            )
    model = _check_model(body, served_model)
    messages = _chat_messages(body)
    prompt_tokens, endpoints = tokenizer.apply_chat_template(messages)
    budget = max_completion_tokens if max_completion_tokens is not None else max_tokens
    budget = _fit_context(len(prompt_tokens), budget, max_model_len, "messages")
    sampling = SamplingParams(max_tokens=budget, logprobs=logprobs, top_logprobs=top_logprobs or 0, **fields)
    return ParsedRequest(
        chat=True,
        model=model,
        prompt_tokens=tuple(prompt_tokens),
        sampling=sampling,
        message_endpoints=tuple(endpoints),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
    )
