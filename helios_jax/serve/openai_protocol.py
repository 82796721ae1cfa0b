"""The OpenAI wire format's requests: parsing and validation.

Parsing turns a JSON body (``body.parse_json_body``) into a :class:`ParsedRequest` (token ids,
message endpoints and :class:`SamplingParams`) or raises
:class:`~helios_jax.serve.openai_errors.ApiError`, which carries the HTTP status and renders as
the OpenAI error object ``{"error": {"message", "type", "param", "code"}}``. Validation runs in
one order for both endpoints, so the first problem a client sees is the most basic one:

1. JSON types of every field the pydantic models name (``openai_models``; ``param`` names the
   field), then the ranges of the sampling fields;
2. fields the server knows and cannot honour (best_of other than n, a top-level grammar, ...:
   a 400 ``unsupported_parameter`` unless the value means "off"); any other unknown field is
   ignored (logged at debug), as vLLM does. The sampling controls (penalties, logit_bias,
   min_p, min_tokens, allowed_token_ids, bad_words) are checked by ``sampling_controls`` once
   max_tokens is known;
3. the model name (404 when it is not the served one);
4. the prompt's length in characters (``max_prompt_chars``), before any tokenizing; then the
   prompt or messages, tokenized through the engine's tokenizer;
5. the context: prompt tokens plus ``max_tokens`` must fit ``max_model_len``;
6. the structured-output constraint (``structured``, called by ``generation``): checked, then
   compiled by the engine's grammars.

The server runs this in a worker thread: tokenizing a long prompt never stalls the event loop.
The answers are built by ``openai_responses``, pure functions the server calls. Chat requests
(messages, the chat template) are parsed by ``chat_request`` with the helpers here.

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
import logging

from pydantic import BaseModel

from helios_jax.runtime.api import MAX_TOP_LOGPROBS, SamplingParams, Tokenizer
from helios_jax.runtime.grammar import CompiledConstraint
from helios_jax.serve import prompt_logprobs, prompt_truncation, sampling_controls
from helios_jax.serve.openai_errors import ApiError, bad_request, unsupported
from helios_jax.serve.openai_models import ChatBody, CompletionBody, validate

log = logging.getLogger(__name__)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default
MAX_STOP_STRINGS = 16
MAX_CHOICES = 64  # engine requests one HTTP request may start (n times the prompts)
PROPOSAL_SOURCES = ("learned", "copy", "both")


# -- unsupported options -------------------------------------------------------------------------

# Fields that OpenAI or vLLM define and that would change the output, which the server cannot
# honour yet: accepted only absent, null, or at the value that means "off" (compared with its
# JSON type, so `0` is not `false`). Every other field the models do not name is ignored.
_NEUTRAL: dict[str, tuple] = {
    "suffix": ("",),
    "functions": ([],),
    "function_call": ("none",),
    "guided_whitespace_pattern": (),
    "grammar": (),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    # vLLM's extensions
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "logits_processors": (),
    "chat_template": (),
}
_NEUTRAL_COMPLETION = _NEUTRAL  # completions: echo is a supported field
_NEUTRAL_CHAT = {**_NEUTRAL, "echo": (False,)}  # vLLM's chat echo (of the last message)
_WHY = {
    "suffix": "suffix (insertion) is not supported",
    "functions": "functions (the deprecated function calling) are not supported; use tools",
    "function_call": "function_call (the deprecated function calling) is not supported; use tool_choice",
    "modalities": "only the text modality is supported",
    "chat_template": "a request's chat_template is refused (vLLM refuses it too unless started with "
    "--trust-request-chat-template): requests render with the model folder's template",
}


def _same(value, neutral) -> bool:
    return type(value) is type(neutral) and value == neutral


def _check_unsupported(body: dict, table: dict[str, tuple]) -> None:
    """400 ``unsupported_parameter`` for the first named field set to a value the server cannot
    honour; unknown fields are logged and ignored."""
    for name, neutral in table.items():
        value = body.get(name)
        if value is None or any(_same(value, v) for v in neutral):
            continue
        if name.startswith("guided_") or name == "grammar":
            raise unsupported(f"{name} is not supported (structured output: docs/serving.md)", name)
        allowed = " or ".join(repr(v) for v in neutral) or "null"
        raise unsupported(_WHY.get(name, f"{name} is not supported yet (only {allowed})"), name)


def _log_ignored(model: BaseModel, table: dict[str, tuple]) -> None:
    ignored = sorted(k for k in model.model_extra or () if k not in table)
    if ignored:
        log.debug("ignoring unknown request field(s): %s", ", ".join(ignored))


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
      continuous_usage: streaming: every chunk carries its choice's usage so far.
      n: choices per prompt (engine requests sharing the prompt; ``choice_requests``).
      prompts: completions with a list of prompts: every prompt (``prompt_tokens`` is the first).
      proposal_source: the helios extension: which speculative proposals serve the request.
      grammar: the structured-output constraint, compiled (``serve/structured.py``).
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
    continuous_usage: bool = False
    n: int = 1
    prompts: tuple[tuple[int, ...], ...] = ()
    proposal_source: str | None = None
    top_logprobs: int = 0  # alternatives shown per generated token
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: alternatives per prompt token
    tool_parser: str | None = None  # chat: the output is parsed for tool calls (serve/tool_calls.py)
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs say "token_id:N"
    return_token_ids: bool = False  # vLLM's: prompt and output token ids beside the text
    grammar: CompiledConstraint | None = None  # structured output (serve/structured.py)

    def choice_requests(self) -> list[tuple[int, ParsedRequest]]:
        """(choice index, the request of that choice) for every prompt and sample: the index is
        prompt * n + sample, as vLLM numbers them; a seeded request's sample j > 0 gets seed
        ``(seed + j) mod 2**64`` (sample 0 keeps the seed, so n = 1 is unchanged)."""
        out = []
        for p, prompt in enumerate(self.prompts or (self.prompt_tokens,)):
            for j in range(self.n):
                sampling = self.sampling
                if j and sampling.seed is not None:
                    sampling = dataclasses.replace(sampling, seed=(sampling.seed + j) % 2**64)
                out.append(
                    (p * self.n + j, dataclasses.replace(self, prompt_tokens=prompt, sampling=sampling))
                )
        return out


def check_model(model: str | None, served_model: str) -> str:
    if model is None:
        return served_model  # optional here (OpenAI requires it); curl users may leave it out
    if model != served_model:
        raise ApiError(
            404,
            f"The model '{model}' does not exist; this server serves '{served_model}'.",
            param="model",
            code="model_not_found",
        )
    return model


def _parse_stream(body: CompletionBody | ChatBody) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous usage): vLLM's ``continuous_usage_stats`` puts usage
    on every chunk when ``include_usage`` is set too."""
    stream = bool(body.stream)
    options = body.stream_options
    if options is None:
        return stream, False, False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
    include_usage = bool(options.include_usage)
    return stream, include_usage, include_usage and bool(options.continuous_usage_stats)


def parse_choices(body: CompletionBody | ChatBody, prompts: int = 1) -> int:
    """``n`` (choices per prompt; ``best_of``, when given, must equal it: every sequence is
    returned), at most :data:`MAX_CHOICES` choices over all prompts."""
    n = 1 if body.n is None else body.n
    if n < 1:
        raise bad_request(f"'n' must be at least 1, got {n}", param="n")
    best_of = getattr(body, "best_of", None)
    if best_of is not None and best_of != n:
        raise unsupported(f"best_of must equal n ({n}): every sequence is returned, got {best_of}", "best_of")
    if n * prompts > MAX_CHOICES:
        raise bad_request(
            f"at most {MAX_CHOICES} choices per request (n times the prompts), got {n * prompts}", param="n"
        )
    return n


def parse_proposal_source(body: CompletionBody | ChatBody) -> str | None:
    """The helios extension ``proposal_source``: "learned", "copy" or "both" (the engine refuses
    a source its model cannot draft: 400)."""
    source = body.proposal_source
    if source is not None and source not in PROPOSAL_SOURCES:
        raise bad_request(
            f"'proposal_source' must be one of {', '.join(PROPOSAL_SOURCES)}, got {source!r}",
            param="proposal_source",
        )
    return source


def _parse_stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(
            f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}", param="stop"
        )
    return tuple(dict.fromkeys(stops))  # deduplicated, in order


def _parse_stop_ids(ids: list[int] | None) -> tuple[int, ...]:
    """vLLM's ``stop_token_ids``: the engine checks them against its vocabulary and its programs'
    device stop capacity (EOS ids included), and refuses what it cannot honour (400)."""
    if not ids:
        return ()
    if any(t < 0 for t in ids):
        raise bad_request("stop_token_ids must be nonnegative token ids", param="stop_token_ids")
    return tuple(dict.fromkeys(ids))


def _sampling_fields(body: CompletionBody | ChatBody) -> dict:
    temperature = 1.0 if body.temperature is None else body.temperature
    if temperature < 0:
        raise bad_request(f"'temperature' must be nonnegative, got {temperature}", param="temperature")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must lie in (0, 1], got {top_p}", param="top_p")
    top_k = 0 if body.top_k is None else body.top_k
    if top_k < -1:
        raise bad_request(
            f"'top_k' must be -1, 0 (both: no restriction) or positive, got {top_k}", param="top_k"
        )
    seed = body.seed
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise bad_request("'seed' must fit in 64 bits", param="seed")
    return dict(
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=max(top_k, 0),
        seed=seed,
        stop=_parse_stop(body.stop),
        stop_token_ids=_parse_stop_ids(body.stop_token_ids),
        ignore_eos=bool(body.ignore_eos),
        include_stop_str_in_output=bool(body.include_stop_str_in_output),
        skip_special_tokens=body.skip_special_tokens is not False,
    )


def _positive_max_tokens(value: int | None, name: str) -> int | None:
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


def check_prompt_chars(chars: int, max_prompt_chars: int | None, param: str) -> None:
    if max_prompt_chars is not None and chars > max_prompt_chars:
        raise bad_request(
            f"the prompt has {chars} characters; this server accepts at most {max_prompt_chars} "
            "(--max_prompt_chars)",
            param=param,
            code="prompt_too_long",
        )


def check_token_ids(ids: list, tokenizer: Tokenizer) -> tuple[int, ...]:
    vocab = getattr(tokenizer, "vocab_size", None)
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or (vocab is not None and t >= vocab):
            bound = f" below {vocab}" if vocab is not None else ""
            raise bad_request(f"token ids must be integers from 0{bound}, got {t!r}", param="prompt")
    return tuple(ids)


def _completion_prompts(
    prompt: str | list | None, tokenizer: Tokenizer, max_prompt_chars: int | None
) -> tuple[tuple[int, ...], ...]:
    """Every prompt's tokens: a string, a list of token ids, or a list of either (a batch)."""
    if prompt is None:
        raise bad_request("missing required field 'prompt'", param="prompt", code="missing_field")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        check_prompt_chars(sum(len(p) for p in prompt if isinstance(p, str)), max_prompt_chars, "prompt")
        return tuple(_completion_prompt(p, tokenizer, max_prompt_chars) for p in prompt)
    return (_completion_prompt(prompt, tokenizer, max_prompt_chars),)


def _completion_prompt(
    prompt: str | list, tokenizer: Tokenizer, max_prompt_chars: int | None
) -> tuple[int, ...]:
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), max_prompt_chars, "prompt")
        return tuple(tokenizer.encode(prompt))
    if isinstance(prompt, list):
        return check_token_ids(prompt, tokenizer)
    got = type(prompt).__name__
    raise bad_request(
        f"'prompt' must be a string or a list of token ids, got {got}", param="prompt", code="invalid_type"
    )


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a request is checked against: the served model's name and context, and the
    longest prompt in characters that is tokenized at all (None: no limit)."""

    served_model: str
    max_model_len: int
    max_prompt_chars: int | None = None
    tool_parser: str | None = None  # --tool_call_parser when --enable_auto_tool_choice


def parse_completion_request(raw: dict, *, tokenizer: Tokenizer, limits: Limits) -> ParsedRequest:
    """Validate a ``/v1/completions`` body (see the module docstring for the order)."""
    body = validate(CompletionBody, raw)
    fields = _sampling_fields(body)
    stream, include_usage, continuous_usage = _parse_stream(body)
    echo = bool(body.echo)
    logprobs = body.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"'logprobs' must be from 0 to {MAX_TOP_LOGPROBS}, got {logprobs}", param="logprobs"
        )
    max_tokens = _positive_max_tokens(body.max_tokens, "max_tokens")
    _check_unsupported(raw, _NEUTRAL_COMPLETION)
    _log_ignored(body, _NEUTRAL_COMPLETION)
    n = parse_choices(body, len(body.prompt) if _is_batch(body.prompt) else 1)
    source = parse_proposal_source(body)
    model = check_model(body.model, limits.served_model)
    prompts = _completion_prompts(body.prompt, tokenizer, limits.max_prompt_chars)
    keep = prompt_truncation.kept_tokens(body.truncate_prompt_tokens, limits.max_model_len)
    side = prompt_truncation.side(body.truncation_side)
    prompts = tuple(prompt_truncation.truncate(p, keep, side) for p in prompts)
    budget = max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = min(_fit_context(len(p), budget, limits.max_model_len, "prompt") for p in prompts)
    prompt_k = prompt_logprobs.parse(body.prompt_logprobs, stream)
    scores = prompt_logprobs.sampling_fields(
        logprobs is not None, logprobs or 0, prompt_k, echo and logprobs is not None
    )
    sampling = SamplingParams(
        max_tokens=max_tokens, **scores, **fields, **sampling_controls.controls(body, tokenizer, max_tokens)
    )
    return ParsedRequest(
        chat=False,
        model=model,
        prompt_tokens=prompts[0],
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        echo=echo,
        logprobs=logprobs is not None,
        continuous_usage=continuous_usage,
        n=n,
        prompts=prompts,
        proposal_source=source,
        top_logprobs=logprobs or 0,
        prompt_logprobs=prompt_k,
        tokens_as_ids=bool(body.return_tokens_as_token_ids),
        return_token_ids=bool(body.return_token_ids),
    )


def _is_batch(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
