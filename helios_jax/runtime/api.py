"""The engine's interface to the HTTP server: plain data requests in, a stream of events out.

The server (``helios_jax.serve``) validates and tokenizes an OpenAI request, builds a
:class:`GenerationRequest` and calls :meth:`Engine.submit`; it reads :class:`StreamEvent`s from the
returned :class:`RequestStream` until one carries a ``finish_reason``, and calls
``RequestStream.cancel()`` when the client goes away. The engine (``helios_jax.runtime.engine``)
and the test fakes implement :class:`Engine`.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from helios_jax.runtime.grammar import CompiledConstraint

SEED_RANGE = (-(2**63), 2**64)  # seeds: any signed or unsigned 64-bit integer
MAX_TOP_LOGPROBS = 20  # alternatives per token (the programs' static top-N, OpenAI's cap)
MAX_LOGIT_BIAS = 1024  # logit_bias entries per request (programs.processors.BIAS_CAPACITY)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """A request's sampling settings, validated on construction (ValueError naming the field).

    Ranges: max_tokens >= 1; temperature finite and >= 0 (0: greedy); top_p in (0, 1]; top_k an
    integer >= 0 (0: off; the engine treats top_k >= its vocabulary as off, the same
    distribution); seed None or an integer in [-2**63, 2**64), reduced by the engine into the
    programs' 32-bit seed (`program_seed`); top_logprobs 0..20 alternatives per generated token;
    stop_token_ids nonnegative ids (the engine refuses ids outside its vocabulary and more stop ids,
    EOS included, than its programs hold: `request_stop_ids`).

    Logits processors (vLLM's semantics, applied on the device: programs/processors.py):
    presence_penalty and frequency_penalty in [-2, 2] (0: off), repetition_penalty > 0 (1: off),
    logit_bias (token id, bias in [-100, 100]) pairs, min_p in [0, 1] (0: off), min_tokens 0..
    max_tokens (the stop ids of `request_stop_ids` are banned until that many outputs exist),
    allowed_token_ids None or a nonempty tuple, bad_token_ids (single-token bad words, banned).
    Token ids must be nonnegative; the engine refuses ids outside its vocabulary.
    """

    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k restriction
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (host-side; the text before the stop is returned)
    prompt_logprobs: bool = False  # scored prefill: log-probabilities of the prompt tokens
    logprobs: bool = False  # log-probability of each generated token
    top_logprobs: int = 0  # with logprobs: the most probable alternatives per generated token
    stop_token_ids: tuple[int, ...] = ()  # the request's own stop tokens (kept in the output)
    ignore_eos: bool = False  # the tokenizer's EOS ids do not end this request
    include_stop_str_in_output: bool = False  # a matched stop string ends the text, included
    skip_special_tokens: bool = True  # special tokens' text left out of the output text
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    min_p: float = 0.0
    min_tokens: int = 0
    allowed_token_ids: tuple[int, ...] | None = None  # None: every token
    bad_token_ids: tuple[int, ...] = ()  # single-token bad words
    # multi-token bad words as token sequences: the last token is banned after the others
    # (runtime/bad_words.py: a host token mask)
    bad_word_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer of at least 1, got {self.max_tokens!r}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError("temperature must be nonnegative")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must lie in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be a nonnegative integer (0: off), got {self.top_k!r}")
        if self.seed is not None and (
            not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]
        ):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(
                f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.top_logprobs!r}"
            )
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a tuple of nonempty strings")
        if not isinstance(self.stop_token_ids, tuple) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError("stop_token_ids must be a tuple of nonnegative integers")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        _check_processors(self)


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _token_ids(value) -> bool:
    return isinstance(value, tuple) and all(_is_int(t) and t >= 0 for t in value)


def _check_processors(s: SamplingParams) -> None:
    """The logits processors' ranges (ValueError naming the field)."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(s, name)
        if not _number(value) or not -2 <= value <= 2:
            raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
    if not _number(s.repetition_penalty) or s.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be a number > 0, got {s.repetition_penalty!r}")
    if not _number(s.min_p) or not 0 <= s.min_p <= 1:
        raise ValueError(f"min_p must be a number in [0, 1], got {s.min_p!r}")
    if not _is_int(s.min_tokens) or not 0 <= s.min_tokens <= s.max_tokens:
        raise ValueError(f"min_tokens must be an integer from 0 to max_tokens, got {s.min_tokens!r}")
    if not isinstance(s.logit_bias, tuple) or not all(
        isinstance(e, tuple) and len(e) == 2 and _token_ids(e[:1]) and _number(e[1]) and -100 <= e[1] <= 100
        for e in s.logit_bias
    ):
        raise ValueError("logit_bias must be (token id, bias in [-100, 100]) pairs")
    if len(s.logit_bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(s.logit_bias)}")
    if s.allowed_token_ids is not None and (not _token_ids(s.allowed_token_ids) or not s.allowed_token_ids):
        raise ValueError("allowed_token_ids must be None or a nonempty tuple of nonnegative token ids")
    if not _token_ids(s.bad_token_ids):
        raise ValueError("bad_token_ids must be a tuple of nonnegative token ids")
    if not isinstance(s.bad_word_sequences, tuple) or not all(
        _token_ids(w) and len(w) >= 2 for w in s.bad_word_sequences
    ):
        raise ValueError("bad_word_sequences must be a tuple of tuples of at least two token ids")
    if s.allowed_token_ids is not None and not set(s.allowed_token_ids) - set(s.bad_token_ids):
        raise ValueError("allowed_token_ids: every allowed token is a bad word")


def request_stop_ids(sampling: SamplingParams, eos_token_ids: Sequence[int]) -> tuple[int, ...]:
    """The token ids that end a request's output: the tokenizer's EOS ids (unless
    ``ignore_eos``) and the request's ``stop_token_ids``, deduplicated in that order. The engine
    gives them to the scheduler and to the programs' device stop check, which holds at most
    ``STOP_CAPACITY`` (4) per lane: a request with more is refused."""
    eos = () if sampling.ignore_eos else tuple(eos_token_ids)
    return tuple(dict.fromkeys(int(t) for t in eos + sampling.stop_token_ids))


def check_stop_ids(
    sampling: SamplingParams, eos_token_ids: Sequence[int], vocab_size: int, capacity: int
) -> None:
    """ValueError (naming the field) for a token id outside the vocabulary (``stop_token_ids``,
    ``logit_bias``, ``allowed_token_ids``, ``bad_token_ids``, ``bad_word_sequences``), or for
    more stop ids, EOS included, than the programs' `capacity` per lane."""
    named = {
        "stop_token_ids": sampling.stop_token_ids,
        "logit_bias": tuple(t for t, _ in sampling.logit_bias),
        "allowed_token_ids": sampling.allowed_token_ids or (),
        "bad_token_ids": sampling.bad_token_ids,
        "bad_word_sequences": tuple(t for word in sampling.bad_word_sequences for t in word),
    }
    for name, ids in named.items():
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"{name} must lie below the vocabulary size {vocab_size}, got {bad}")
    stops = request_stop_ids(sampling, eos_token_ids)
    if len(stops) > capacity:
        raise ValueError(
            f"stop_token_ids: at most {capacity} stop tokens per request, the {len(eos_token_ids)} EOS "
            f"id(s) included unless ignore_eos; got {len(stops)}"
        )


def program_seed(seed: int) -> int:
    """The programs' u32 seed for a request seed in [-2**63, 2**64): the 64-bit two's-complement
    value folded by xor of its halves. Deterministic, and the identity below 2**32, so small seeds
    keep the streams they always had."""
    value = seed % (1 << 64)
    return (value ^ (value >> 32)) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    message_endpoints: tuple[int, ...] = ()  # chat template message ends (checkpoint anchors)
    proposal_source: str | None = None  # "learned", "copy" or "both"; None: the engine's
    grammar: CompiledConstraint | None = None  # structured output: the output's grammar
    prior_outputs: int = 0  # a preemption continuation: the prompt's last tokens that were output

    @property
    def host_masked(self) -> bool:
        """Its samples take a token mask the host computes from its committed output (a grammar,
        multi-token bad words)."""
        return self.grammar is not None or bool(self.sampling.bad_word_sequences)


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """A visible burst: new text and tokens, and the finish reason on the last event."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0  # cumulative
    token_logprobs: tuple[float, ...] | None = None  # with logprobs: one per token_ids entry
    # with top_logprobs: per token, the most probable (token id, log-probability) pairs
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    prompt_logprobs: tuple[float | None, ...] | None = None  # first event only, when requested
    # first event only, with prompt_logprobs and top_logprobs: per prompt token, its most
    # probable (token id, log-probability) pairs (None for the first token, which has no score)
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...] | None, ...] | None = None
    error: str | None = None
    queue_time_s: float | None = None  # first event only: submission to admission, in seconds


class RequestStream:
    """A thread-safe event queue for one request; the producer is the engine.

    The queue is a ``queue.SimpleQueue`` (C): a put appends and wakes a blocked reader without a
    Python-level condition that the woken reader would contend for with the engine's loop."""

    def __init__(self, request_id: str, cancel_callback=None):
        self.request_id = request_id
        self._queue: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
        self._cancel = cancel_callback
        self._cancelled = threading.Event()
        self._listener: Callable[[], None] | None = None
        self.finished = False

    def put(self, event: StreamEvent, *, notify: bool = True) -> None:
        """Queue `event`; call the listener too unless `notify` is false (the caller then calls
        :attr:`listener` itself, as a publisher waking a frame's readers together does)."""
        self._queue.put(event)
        listener = self._listener
        if notify and listener is not None:
            listener()

    @property
    def listener(self) -> Callable[[], None] | None:
        return self._listener

    def set_listener(self, listener: Callable[[], None] | None) -> None:
        """Have `listener()` called, in the producer's thread, after every event put from now on
        (None: no longer). A consumer that waits for the call rather than in `get` checks
        ``get(timeout=0)`` after setting it, so an event put just before is not missed; the
        listener must be quick and must not raise (the engine's loop calls it)."""
        self._listener = listener

    def get(self, timeout: float | None = None) -> StreamEvent:
        """The next event (raises queue.Empty after `timeout` seconds)."""
        event = self._queue.get(timeout=timeout)
        if event.finish_reason is not None:
            self.finished = True
        return event

    def __iter__(self):
        while not self.finished:
            yield self.get()

    def cancel(self) -> None:
        """The client went away: stop generating and free the request's resources."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            if self._cancel is not None:
                self._cancel(self.request_id)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Tokenizer(Protocol):
    eos_token_ids: Sequence[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: Sequence[dict]) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of the rendered conversation (ending with the assistant prompt) and the
        exact token endpoint of each message."""
        ...

    def render_chat(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping | None = None,
        *,
        continue_final_message: bool = False,
    ) -> tuple[list[int], tuple[int, ...]]:
        """The model's chat template over `messages` (content a string or text parts) with
        `template_kwargs` (``chat_template_kwargs``): token ids, in which no message text is a
        control token, and the exact endpoints of the messages whose rendering is a prefix of the
        prompt (docs/chat-templates.md); `continue_final_message` leaves the final message open
        (the prompt ends with its content)."""
        ...


class Engine(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Tokenizer

    def ready(self) -> bool: ...

    def submit(self, request: GenerationRequest) -> RequestStream: ...

    def metrics_text(self) -> str:
        """Prometheus exposition of the engine and scheduler counters."""
        ...

    def shutdown(self) -> None: ...
