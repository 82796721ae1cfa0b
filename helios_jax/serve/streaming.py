"""One generation request's answer, streaming or not, and the metrics it records.

:class:`GenerationRun` is the bookkeeping and rendering of one request, free of I/O: the server
(``generation``) reads the engine's events and hands each to the run, which records metrics and
returns what to write. A non-streaming request collects every event and answers once, with
``usage`` (:meth:`GenerationRun.full_body`). A streaming request answers
``200 text/event-stream`` at once and writes one SSE ``data:`` chunk per visible burst
(:meth:`GenerationRun.event_chunks`), a chunk with the finish reason, the usage chunk when
``stream_options.include_usage`` asks for it, and ``data: [DONE]``
(:meth:`GenerationRun.finish_chunks`, :meth:`GenerationRun.usage_chunks`; a request's several
choices are put together by ``choices``). An engine error after the headers went out is written
as a ``data: {"error": ...}`` event before ``[DONE]``. Error bodies never carry the engine's own
error text: the server logs it.
"""

from __future__ import annotations

import time

from helios_jax.runtime.api import StreamEvent, Tokenizer
from helios_jax.serve import openai_responses as responses
from helios_jax.serve import prompt_logprobs, tool_calls
from helios_jax.serve.metrics import ServerMetrics
from helios_jax.serve.openai_errors import ApiError
from helios_jax.serve.openai_protocol import ParsedRequest

DONE = responses.sse("[DONE]")


class GenerationRun:
    """One generation request's bookkeeping and rendering."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        request: ParsedRequest,
        request_id: str,
        metrics: ServerMetrics,
        arrival: float,
        index: int = 0,
    ):
        self.index = index  # the choice's index in the answer (n > 1, lists of prompts)
        self.tokenizer = tokenizer
        self.request = request
        self.id = request_id
        self.created = int(time.time())
        self.metrics = metrics
        self.arrival = arrival
        self.last_token_time: float | None = None
        self.prompt_tokens = len(request.prompt_tokens)
        self.completion_tokens = 0
        self.token_count = 0
        self.finished = False
        self.finish_reason: str | None = None
        self.offset = 0  # characters of text streamed so far (completions' text_offset)
        self.first = True
        self.calls = tool_calls.StreamingCalls(request.tool_parser) if request.tool_parser else None
        self.prompt_ids_sent = False  # return_token_ids: the prompt's ids go out once

    # -- shared bookkeeping -----------------------------------------------------------------
    def observe(self, event: StreamEvent) -> None:
        if event.prompt_tokens:
            self.prompt_tokens = event.prompt_tokens
        if event.queue_time_s is not None:
            self.metrics.queue_time.observe(event.queue_time_s)
        self.token_count += len(event.token_ids)
        self.completion_tokens = max(self.completion_tokens, event.completion_tokens, self.token_count)
        if event.token_ids or event.text:
            now = time.monotonic()
            if self.last_token_time is None:
                self.metrics.ttft.observe(now - self.arrival)
            else:
                k = max(len(event.token_ids), 1)
                self.metrics.observe_itl((now - self.last_token_time) / k, k)
            self.last_token_time = now

    def finish(self, reason: str) -> None:
        """Count the request once, by its finish reason ("cancelled": the client left)."""
        if self.finished:
            return
        self.finished = True
        self.finish_reason = reason
        self.metrics.finished.labels(reason=reason).inc()
        if reason in ("stop", "length"):
            self.metrics.record_usage(
                self.prompt_tokens, self.completion_tokens, self.request.sampling.max_tokens
            )
            self.metrics.e2e.observe(time.monotonic() - self.arrival)

    def _token_text(self, token: int) -> str:
        """A token as logprobs name it: its text, or vLLM's "token_id:N" when the request asks
        (``return_tokens_as_token_ids``: tokens whose text is not valid UTF-8 alone stay apart)."""
        return f"token_id:{token}" if self.request.tokens_as_ids else self.tokenizer.decode([token])

    def _token_texts(self, ids) -> list[str]:
        return [self._token_text(i) for i in ids]

    def _logprobs(self, ids, values, offset: int, always: bool = False, top=None) -> dict | None:
        """The logprobs object for `ids` (None when not requested, or when there are no tokens
        and not `always`); missing values render as null. `top`: per token, the engine's
        (token id, log-probability) alternatives or None."""
        if not self.request.logprobs or (not ids and not always):
            return None
        texts = self._token_texts(ids)
        values = list(values) if values is not None else [None] * len(ids)
        values = (values + [None] * len(ids))[: len(ids)]
        top = (list(top or ()) + [None] * len(ids))[: len(ids)]
        k = self.request.top_logprobs  # the engine may hold more (the larger prompt_logprobs)
        top = [None if a is None else [(self._token_text(i), v) for i, v in a[:k]] for a in top]
        if self.request.chat:
            return responses.chat_logprobs(texts, values, top)
        return responses.completion_logprobs(texts, values, offset, top)

    def failure(self, event: StreamEvent) -> ApiError:
        """The error a failed request answers with: no engine text (the server logs that)."""
        if event.finish_reason == "cancelled":
            return ApiError(503, "the engine cancelled the request", code="cancelled")
        return ApiError(500, f"the engine failed to complete request {self.id}", code="engine_error")

    def _usage(self) -> dict:
        return responses.usage(self.prompt_tokens, self.completion_tokens)

    # -- non-streaming ----------------------------------------------------------------------
    def full_body(self, events: list[StreamEvent]) -> dict:
        """The whole response for a request's events (the last one finishes it), or the
        ApiError of a failed request."""
        request = self.request
        text, ids, values, top, prompt_values, prompt_top = [], [], [], [], None, None
        for event in events:
            if event.prompt_logprobs is not None:
                prompt_values, prompt_top = event.prompt_logprobs, event.prompt_top_logprobs
            text.append(event.text)
            ids.extend(event.token_ids)
            values.extend(event.token_logprobs or [None] * len(event.token_ids))
            top.extend(event.top_logprobs or [None] * len(event.token_ids))
        reason = events[-1].finish_reason
        self.finish(reason)
        if reason not in ("stop", "length"):
            raise self.failure(events[-1])
        logprobs = None
        if request.logprobs:
            if request.echo:  # prompt tokens first, then the generated ones, as one object
                prompt_values = list(prompt_values or [None] * len(request.prompt_tokens))
                top = list(prompt_top or [None] * len(request.prompt_tokens)) + top
                logprobs = self._logprobs(
                    list(request.prompt_tokens) + ids, prompt_values + values, 0, True, top
                )
            else:
                logprobs = self._logprobs(ids, values, 0, True, top)
        echo_text = self.tokenizer.decode(request.prompt_tokens) if request.echo else ""
        build = responses.chat_response if request.chat else responses.completion_response
        body = self._indexed(
            build(
                id=self.id,
                created=self.created,
                model=request.model,
                text=echo_text + "".join(text),
                finish_reason=reason,
                usage_=self._usage(),
                logprobs=logprobs,
            )
        )
        if request.tool_parser:
            self._with_tool_calls(body["choices"][0], request.tool_parser)
        if request.return_token_ids:
            self._with_token_ids(body, ids)
        if request.prompt_logprobs is not None:  # vLLM's: on the choice (completions), the response (chat)
            scores = prompt_logprobs.render(
                self.tokenizer, request.prompt_tokens, prompt_values, prompt_top, request.prompt_logprobs
            )
            (body if request.chat else body["choices"][0])["prompt_logprobs"] = scores
        return body

    @staticmethod
    def _with_tool_calls(choice: dict, mode: str) -> None:
        """A chat choice's message with the tool calls parsed out of its content."""
        content, calls = tool_calls.extract_calls(mode, choice["message"]["content"])
        if calls:
            choice["message"]["content"] = content
            choice["message"]["tool_calls"] = [call.render() for call in calls]
            if not mode.startswith(tool_calls.NAMED):  # a forced call keeps the engine's reason
                choice["finish_reason"] = "tool_calls"

    def _indexed(self, payload: dict) -> dict:
        payload["choices"][0]["index"] = self.index
        return payload

    # -- streaming --------------------------------------------------------------------------
    def _chunk(
        self,
        text: str | None,
        finish: str | None = None,
        logprobs: dict | None = None,
        role: bool = False,
        delta: dict | None = None,
        token_ids=(),
    ) -> bytes:
        common = dict(
            id=self.id,
            created=self.created,
            model=self.request.model,
            finish_reason=finish,
            logprobs=logprobs,
            include_usage=self.request.include_usage,
        )
        if self.request.chat:
            if delta is None:
                delta = (
                    {"role": "assistant", "content": ""}
                    if role
                    else ({} if text is None else {"content": text})
                )
            chunk = responses.chat_chunk(delta=delta, **common)
        else:
            chunk = responses.completion_chunk(text=text or "", **common)
        if self.request.continuous_usage:  # vLLM's continuous_usage_stats: this choice's usage so far
            chunk["usage"] = self._usage()
        if self.request.return_token_ids:
            self._with_token_ids(chunk, token_ids, first=not self.prompt_ids_sent)
            self.prompt_ids_sent = True
        return responses.sse(self._indexed(chunk))

    def _with_token_ids(self, body: dict, token_ids, first: bool = True) -> None:
        """vLLM's return_token_ids: the choice's (new) output token ids, and the prompt's ids
        once (on the choice for completions, on the response for chat)."""
        choice = body["choices"][0]
        choice["token_ids"] = list(token_ids)
        if first:
            (body if self.request.chat else choice)["prompt_token_ids"] = list(self.request.prompt_tokens)

    def opening_chunks(self) -> list[bytes]:
        """What a stream starts with: chat's role chunk."""
        return [self._chunk(None, role=True)] if self.request.chat else []

    def event_chunks(self, event: StreamEvent) -> list[bytes]:
        """The chunks of one event (bookkeeping included): the echoed prompt before the first,
        then the event's text and log-probabilities when there are any."""
        request, out = self.request, []
        self.observe(event)
        if self.first and request.echo:
            echo = self.tokenizer.decode(request.prompt_tokens)
            prompt_values = event.prompt_logprobs or [None] * len(request.prompt_tokens)
            lp = self._logprobs(
                request.prompt_tokens, prompt_values, self.offset, True, event.prompt_top_logprobs
            )
            out.append(self._chunk(echo, logprobs=lp))
            self.offset += len(echo)
        self.first = False
        lp = self._logprobs(event.token_ids, event.token_logprobs, self.offset, top=event.top_logprobs)
        text = event.text if self.calls is None else self.calls.feed(event.text)
        if text or lp is not None or (request.return_token_ids and event.token_ids):
            out.append(self._chunk(text, logprobs=lp, token_ids=event.token_ids))
            self.offset += len(text)
        return out

    def finish_chunks(self, last: StreamEvent) -> list[bytes]:
        """After the finishing event: the finish chunk, or the error event."""
        reason = last.finish_reason
        if reason in ("stop", "length"):
            held, called = self._held_tool_text()
            named = (self.request.tool_parser or "").startswith(tool_calls.NAMED)
            out = held + [self._chunk(None, finish="tool_calls" if called and not named else reason)]
        else:
            out = [responses.sse(self.failure(last).body())]
        self.finish(reason)
        return out

    def _held_tool_text(self) -> tuple[list[bytes], bool]:
        """Tool calling: what the stream held back, as one tool_calls delta (True) or as content."""
        if self.calls is None:
            return [], False
        rest, calls = self.calls.finish()
        if calls:
            delta = {"tool_calls": [call.render(i) for i, call in enumerate(calls)]}
            return [self._chunk(None, delta=delta)], True
        return ([self._chunk(rest)] if rest else []), False

    def usage_chunks(self, usage: dict) -> list[bytes]:
        """The final usage chunk (of every choice together) when ``include_usage`` asks for it."""
        if not self.request.include_usage:
            return []
        chunk = responses.usage_chunk(
            id=self.id, created=self.created, model=self.request.model, chat=self.request.chat, usage_=usage
        )
        return [responses.sse(chunk)]
