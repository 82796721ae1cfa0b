"""A deterministic fake :class:`~helios_jax.runtime.api.Engine` whose output you can derive on paper.

It serves the HTTP layer's tests and ``python -m helios_jax.serve --engine=fake``.

Tokenizer (:class:`CharTokenizer`): one token per character, the token id is the Unicode code
point (``"hi"`` -> ``[104, 105]``), so token counts equal character counts. The chat template
renders each message as ``"{role}: {content}\\n"`` and ends with the assistant prompt
``"assistant: "``; a message's endpoint is the token count up to and including its newline::

    [system "Be brief.", user "hi"]
    -> "system: Be brief.\\nuser: hi\\nassistant: "   (38 tokens)
    endpoints (18, 27)

``render_chat`` adds, after the messages, one ``"{key}={value!r}\\n"`` line per template kwarg
(``{"enable_thinking": False}`` -> ``"enable_thinking=False\\n"``) and leaves the assistant
prompt out when ``add_generation_prompt`` is false.

Generation (:class:`FakeEngine`), for a request with ``max_tokens = M``:

1. Output token ``i`` (0-based) is character ``i mod len(S)`` of a source string ``S``: the fixed
   :data:`CYCLE_TEXT` in ``"cycle"`` mode, or the prompt's text reversed in ``"reverse"`` mode.
   Sampling parameters other than ``max_tokens``, ``stop`` and the logprob switches are ignored
   (recorded in :attr:`FakeEngine.submitted` for the tests to inspect).
2. Stop strings: after each token, the first occurrence of any stop string in the generated text
   ends the request with ``finish_reason="stop"``; the text before it is returned, the stop text
   never is. Text that could still become a stop string (a suffix of the output that is a prefix
   of a stop string) is held back until it is decided. ``completion_tokens`` counts every
   generated token, the stop string's included: ``S = "The quick brown..."``, stop
   ``" brown"`` returns ``"The quick"`` with 15 completion tokens.
   Stop tokens: a generated token in ``stop_token_ids`` (or an EOS id, :data:`CharTokenizer.eos_token_ids`
   ``(0,)``, never generated, unless ``ignore_eos``) ends the request with ``"stop"`` and its
   character kept in the text. As the real engine, the fake refuses (ValueError at ``submit``)
   more than 4 stop ids, EOS included.
3. Otherwise the request ends after ``M`` tokens with ``finish_reason="length"``.
4. Every ``tokens_per_event`` tokens (and at the end) one :class:`StreamEvent` carries the newly
   decided text, the token ids generated since the last event, cumulative ``completion_tokens``,
   ``prompt_tokens`` and, when requested, log-probabilities: every generated token has
   :data:`TOKEN_LOGPROB` (-0.5); prompt tokens have ``None`` for the first and
   :data:`PROMPT_LOGPROB` (-1.0) after it, on the first event only; with ``top_logprobs = k``
   a token t's alternatives are t, t + 1, .., t + k - 1 with log-probabilities -0.5, -1.5, ...
   (a prompt token's, but the first's: the same ids with -1.0, -2.0, ...)
5. ``token_delay_s`` is waited before each token; ``RequestStream.cancel()`` records the request
   id in :attr:`FakeEngine.cancelled` immediately and the worker then ends the stream with
   ``finish_reason="cancelled"``.

:meth:`FakeEngine.inject_failure` makes the next request fail at ``submit`` (an exception) or on
its stream (a ``finish_reason="error"`` event), for the server's error paths.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

import jinja2

from helios_jax.runtime.api import (
    GenerationRequest,
    RequestStream,
    StreamEvent,
    check_stop_ids,
    request_stop_ids,
)

CYCLE_TEXT = "The quick brown fox jumps over the lazy dog. "
TOKEN_LOGPROB = -0.5
PROMPT_LOGPROB = -1.0
FAKE_MODEL_NAME = "helios-fake"


class CharTokenizer:
    """Token id = Unicode code point; a ``"{role}: {content}\\n"`` chat template."""

    vocab_size = 0x110000
    eos_token_ids: Sequence[int] = (0,)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)  # no special tokens

    def apply_chat_template(self, messages: Sequence[dict]) -> tuple[list[int], tuple[int, ...]]:
        return self.render_chat(messages)

    def render_chat(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping | None = None,
        *,
        continue_final_message: bool = False,
    ) -> tuple[list[int], tuple[int, ...]]:
        """The fake template (module docstring): content text parts joined with "\\n", a
        ``"{key}={value!r}\\n"`` line per template kwarg after the messages, and
        ``"assistant: "`` with `add_generation_prompt`. A ``raise_exception`` kwarg makes it
        raise ``jinja2.TemplateError`` with that message (as a template's ``raise_exception``
        does), a ``messages`` kwarg ValueError (as ``HFTokenizer`` refuses reserved names);
        `continue_final_message` ends the prompt with the final message's content."""
        kwargs = dict(template_kwargs or {})
        if "messages" in kwargs or "add_generation_prompt" in kwargs:
            raise ValueError("template kwargs cannot set messages or add_generation_prompt")
        if "raise_exception" in kwargs:
            raise jinja2.TemplateError(str(kwargs["raise_exception"]))
        text, endpoints = "", []
        for message in messages:
            content = message.get("content", "")  # absent beside an assistant's tool calls
            if not isinstance(content, str):
                content = "\n".join(part["text"] for part in content)
            text += f"{message['role']}: {content}\n"
            endpoints.append(len(text))  # one token per character
        text += "".join(f"{key}={value!r}\n" for key, value in kwargs.items())
        if continue_final_message:  # open: the final message's content ends the prompt
            return self.encode(text[: text.rindex(content) + len(content)]), tuple(endpoints[:-1])
        if add_generation_prompt:
            text += "assistant: "
        return self.encode(text), tuple(endpoints)


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    Example: text "abc ab", stop "abd" -> 2 ("ab" could still become "abd").
    """
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class FakeEngine:
    """The deterministic fake engine; see the module docstring for its derivation.

    Args:
      model_name: the engine's model name (what ``/v1/models`` lists by default).
      max_model_len: context length: prompt plus output tokens.
      mode: "cycle" (output cycles :data:`CYCLE_TEXT`) or "reverse" (the prompt text reversed).
      token_delay_s: wall time waited before each generated token.
      tokens_per_event: tokens per visible burst.
      ready: initial readiness (``set_ready`` toggles it).
    """

    def __init__(
        self,
        *,
        model_name: str = FAKE_MODEL_NAME,
        max_model_len: int = 2048,
        mode: str = "cycle",
        token_delay_s: float = 0.0,
        tokens_per_event: int = 1,
        ready: bool = True,
    ):
        if mode not in ("cycle", "reverse"):
            raise ValueError(f"FakeEngine mode must be 'cycle' or 'reverse', got {mode!r}")
        if tokens_per_event < 1 or max_model_len < 1 or token_delay_s < 0:
            raise ValueError(
                "FakeEngine: tokens_per_event and max_model_len must be positive, token_delay_s nonnegative"
            )
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.tokenizer = CharTokenizer()
        self.mode = mode
        self.token_delay_s = token_delay_s
        self.tokens_per_event = tokens_per_event
        self._ready = ready
        self._lock = threading.Condition()
        self._submitted: list[GenerationRequest] = []
        self._cancelled: list[str] = []
        self._cancel_events: dict[str, threading.Event] = {}
        self._failures: list[tuple[str, str]] = []
        self._shutdown = threading.Event()

    # -- Engine interface -------------------------------------------------------------------
    def ready(self) -> bool:
        return self._ready and not self._shutdown.is_set()

    def submit(self, request: GenerationRequest) -> RequestStream:
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
            if failure is not None and failure[0] == "submit":
                raise RuntimeError(failure[1])
            if self._shutdown.is_set():
                raise RuntimeError("the fake engine is shut down")
            if not request.prompt_tokens:
                raise ValueError("a request needs at least one prompt token")
            if len(request.prompt_tokens) + request.sampling.max_tokens > self.max_model_len:
                raise ValueError("prompt plus max_tokens exceeds max_model_len")
            check_stop_ids(request.sampling, self.tokenizer.eos_token_ids, self.tokenizer.vocab_size, 4)
            self._submitted.append(request)
            cancel_event = self._cancel_events[request.request_id] = threading.Event()
        stream = RequestStream(request.request_id, cancel_callback=self._on_cancel)
        error = failure[1] if failure is not None else None
        threading.Thread(
            target=self._generate,
            args=(request, stream, cancel_event, error),
            name=f"fake-{request.request_id}",
            daemon=True,
        ).start()
        return stream

    def metrics_text(self) -> str:
        with self._lock:
            submitted, cancelled = len(self._submitted), len(self._cancelled)
        return (
            "# HELP helios_fake_engine_requests_total Requests the fake engine accepted.\n"
            "# TYPE helios_fake_engine_requests_total counter\n"
            f"helios_fake_engine_requests_total {submitted}\n"
            "# HELP helios_fake_engine_cancellations_total Requests cancelled by their stream.\n"
            "# TYPE helios_fake_engine_cancellations_total counter\n"
            f"helios_fake_engine_cancellations_total {cancelled}\n"
        )

    def shutdown(self) -> None:
        self._shutdown.set()

    # -- test controls ----------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    def inject_failure(self, where: str, message: str = "injected failure") -> None:
        """Fail the next submitted request: "submit" raises, "stream" ends it with an error event."""
        if where not in ("submit", "stream"):
            raise ValueError(f"where must be 'submit' or 'stream', got {where!r}")
        with self._lock:
            self._failures.append((where, message))

    @property
    def submitted(self) -> tuple[GenerationRequest, ...]:
        with self._lock:
            return tuple(self._submitted)

    @property
    def cancelled(self) -> tuple[str, ...]:
        """Request ids whose stream was cancelled, in cancellation order."""
        with self._lock:
            return tuple(self._cancelled)

    def wait_for_cancel(self, request_id: str | None = None, timeout: float = 5.0) -> bool:
        """Block until `request_id` (or any request) is cancelled; False on timeout."""

        def done():
            return request_id in self._cancelled if request_id is not None else bool(self._cancelled)

        with self._lock:
            return self._lock.wait_for(done, timeout=timeout)

    # -- generation -------------------------------------------------------------------------
    def _on_cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.append(request_id)
            event = self._cancel_events.get(request_id)
            self._lock.notify_all()
        if event is not None:
            event.set()

    def _source(self, request: GenerationRequest) -> str:
        if self.mode == "reverse":
            return self.tokenizer.decode(request.prompt_tokens)[::-1]
        return CYCLE_TEXT

    def _generate(
        self, request: GenerationRequest, stream: RequestStream, cancel: threading.Event, error: str | None
    ) -> None:
        sampling = request.sampling
        n_prompt = len(request.prompt_tokens)
        counts = dict(prompt_tokens=n_prompt)
        try:
            if error is not None:
                stream.put(StreamEvent("", (), "error", error=error, **counts))
                return
            prompt_logprobs = {**_prompt_scores(request), "queue_time_s": 0.0}  # admitted at once
            source = self._source(request)
            generated, emitted, pending = "", 0, []

            def emit(text_end: int, finish: str | None):
                nonlocal emitted, pending, prompt_logprobs
                stream.put(
                    StreamEvent(
                        text=generated[emitted:text_end],
                        token_ids=tuple(pending),
                        finish_reason=finish,
                        completion_tokens=len(generated),
                        token_logprobs=((TOKEN_LOGPROB,) * len(pending) if sampling.logprobs else None),
                        top_logprobs=_alternatives(pending, sampling.top_logprobs),
                        **prompt_logprobs,
                        **counts,
                    )
                )
                emitted, pending, prompt_logprobs = text_end, [], {}

            for i, char in zip(range(sampling.max_tokens), itertools.cycle(source or " ")):
                stopped = cancel.wait(self.token_delay_s) if self.token_delay_s else cancel.is_set()
                if stopped or self._shutdown.is_set():
                    emit(emitted, "cancelled")
                    return
                generated += char
                pending.append(ord(char))
                if ord(char) in request_stop_ids(sampling, self.tokenizer.eos_token_ids):
                    emit(len(generated), "stop")  # a stop token's text stays in the output
                    return
                hits = [(generated.find(s), len(s)) for s in sampling.stop if s in generated]
                if hits:
                    at, length = min(hits)
                    emit(at + length if sampling.include_stop_str_in_output else at, "stop")
                    return
                if i + 1 == sampling.max_tokens:
                    emit(len(generated), "length")
                    return
                if (i + 1) % self.tokens_per_event == 0:
                    decided = len(generated) - stop_holdback(generated, sampling.stop)
                    if decided > emitted:
                        emit(decided, None)
        finally:
            with self._lock:
                self._cancel_events.pop(request.request_id, None)


def _prompt_scores(request: GenerationRequest) -> dict:
    """The first event's prompt fields (module docstring, item 4); empty when not asked for."""
    sampling, n = request.sampling, len(request.prompt_tokens)
    if not sampling.prompt_logprobs:
        return {}
    fields: dict = dict(prompt_logprobs=(None,) + (PROMPT_LOGPROB,) * (n - 1))
    if sampling.top_logprobs > 0:
        k = sampling.top_logprobs
        alternatives = tuple(
            tuple((t + j, PROMPT_LOGPROB - j) for j in range(k)) for t in request.prompt_tokens[1:]
        )
        fields["prompt_top_logprobs"] = (None,) + alternatives
    return fields


def _alternatives(tokens, k: int):
    """The fake's top alternatives (module docstring, item 4), or None when none are asked for."""
    if k <= 0:
        return None
    return tuple(tuple((t + j, TOKEN_LOGPROB - j) for j in range(k)) for t in tokens)
