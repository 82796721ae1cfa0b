"""One generation request's answer, streaming or not, and the metrics it records.

A non-streaming request collects every event and answers once, with ``usage``. A streaming
request answers ``200 text/event-stream`` at once and writes one SSE ``data:`` chunk per visible
burst, a chunk with the finish reason, the usage chunk when ``stream_options.include_usage`` asks
for it, and ``data: [DONE]``. An engine error after the headers went out is written as a
``data: {"error": ...}`` event before ``[DONE]``. A failing write means the client left: the
request is cancelled and counted as such (:class:`ClientGone`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from helios_jax.runtime.api import Engine, RequestStream, StreamEvent
from helios_jax.serve import openai_responses as responses
from helios_jax.serve.openai_errors import ApiError
from helios_jax.serve.openai_protocol import ParsedRequest

if TYPE_CHECKING:
    from helios_jax.serve.handler import RequestHandler


class ClientGone(Exception):
    """The client closed the connection; the request is cancelled and nothing more is written."""


class GenerationResponse:
    """One generation request's response: event collection, rendering and metrics."""

    def __init__(self, handler: RequestHandler, engine: Engine, request: ParsedRequest, request_id: str):
        self.handler = handler
        self.tokenizer = engine.tokenizer
        self.request = request
        self.id = request_id
        self.created = int(time.time())
        self.metrics = handler.server.metrics
        self.arrival = handler.arrival
        self.last_token_time: float | None = None
        self.prompt_tokens = len(request.prompt_tokens)
        self.completion_tokens = 0
        self.token_count = 0
        self.finished = False

    # -- shared bookkeeping -----------------------------------------------------------------
    def _observe(self, event: StreamEvent) -> None:
        if event.prompt_tokens:
            self.prompt_tokens = event.prompt_tokens
        self.token_count += len(event.token_ids)
        self.completion_tokens = max(self.completion_tokens, event.completion_tokens, self.token_count)
        if event.token_ids or event.text:
            now = time.monotonic()
            if self.last_token_time is None:
                self.metrics.ttft.observe(now - self.arrival)
            else:
                k = max(len(event.token_ids), 1)
                self.metrics.itl.observe((now - self.last_token_time) / k, count=k)
            self.last_token_time = now

    def _finish(self, reason: str) -> None:
        if self.finished:  # a stream whose final writes fail is counted once, as finished
            return
        self.finished = True
        self.metrics.finished.inc(reason=reason)
        if reason in ("stop", "length"):
            self.metrics.prompt_tokens.inc(self.prompt_tokens)
            self.metrics.completion_tokens.inc(self.completion_tokens)
            self.metrics.e2e.observe(time.monotonic() - self.arrival)

    def _events(self, stream: RequestStream):
        """Events until the finishing one; a client that hangs up is counted as cancelled."""
        while True:
            try:
                event = self.handler.next_event(stream)
            except ClientGone:
                self._finish("cancelled")
                raise
            self._observe(event)
            yield event
            if event.finish_reason is not None:
                return

    def _token_texts(self, ids) -> list[str]:
        return [self.tokenizer.decode([i]) for i in ids]

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
        top = [None if a is None else [(self.tokenizer.decode([i]), v) for i, v in a] for a in top]
        if self.request.chat:
            return responses.chat_logprobs(texts, values, top)
        return responses.completion_logprobs(texts, values, offset, top)

    def _failure(self, event: StreamEvent) -> ApiError:
        if event.finish_reason == "cancelled":
            return ApiError(503, "the engine cancelled the request", code="cancelled")
        return ApiError(500, f"the engine failed: {event.error or 'unknown error'}", code="engine_error")

    def _usage(self) -> dict:
        return responses.usage(self.prompt_tokens, self.completion_tokens)

    # -- non-streaming ----------------------------------------------------------------------
    def full_response(self, stream: RequestStream) -> None:
        request = self.request
        echo_text = self.tokenizer.decode(request.prompt_tokens) if request.echo else ""
        text, ids, values, top, prompt_values, prompt_top = [], [], [], [], None, None
        for event in self._events(stream):
            if event.prompt_logprobs is not None:
                prompt_values, prompt_top = event.prompt_logprobs, event.prompt_top_logprobs
            text.append(event.text)
            ids.extend(event.token_ids)
            values.extend(event.token_logprobs or [None] * len(event.token_ids))
            top.extend(event.top_logprobs or [None] * len(event.token_ids))
        reason = event.finish_reason
        self._finish(reason)
        if reason not in ("stop", "length"):
            raise self._failure(event)
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
        build = responses.chat_response if request.chat else responses.completion_response
        self.handler.send_json(
            200,
            build(
                id=self.id,
                created=self.created,
                model=request.model,
                text=echo_text + "".join(text),
                finish_reason=reason,
                usage_=self._usage(),
                logprobs=logprobs,
            ),
        )

    # -- streaming --------------------------------------------------------------------------
    def _write(self, stream: RequestStream, payload) -> None:
        if not self.handler.write_chunk(responses.sse(payload)):
            stream.cancel()
            self._finish("cancelled")
            raise ClientGone()

    def _chunk(
        self, text: str | None, finish: str | None = None, logprobs: dict | None = None, role: bool = False
    ) -> dict:
        common = dict(
            id=self.id,
            created=self.created,
            model=self.request.model,
            finish_reason=finish,
            logprobs=logprobs,
            include_usage=self.request.include_usage,
        )
        if self.request.chat:
            delta = (
                {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            )
            return responses.chat_chunk(delta=delta, **common)
        return responses.completion_chunk(text=text or "", **common)

    def stream_response(self, stream: RequestStream) -> None:
        request, handler = self.request, self.handler
        handler.start_event_stream()
        if request.chat:
            self._write(stream, self._chunk(None, role=True))
        offset = 0  # characters of text returned so far (completions' text_offset)
        first = True
        for event in self._events(stream):
            if first and request.echo:
                echo = self.tokenizer.decode(request.prompt_tokens)
                prompt_values = event.prompt_logprobs or [None] * len(request.prompt_tokens)
                lp = self._logprobs(
                    request.prompt_tokens, prompt_values, offset, True, event.prompt_top_logprobs
                )
                self._write(stream, self._chunk(echo, logprobs=lp))
                offset += len(echo)
            first = False
            lp = self._logprobs(event.token_ids, event.token_logprobs, offset, top=event.top_logprobs)
            if event.text or lp is not None:
                self._write(stream, self._chunk(event.text, logprobs=lp))
                offset += len(event.text)
        reason = event.finish_reason
        if reason in ("stop", "length"):
            self._write(stream, self._chunk(None, finish=reason))
            if request.include_usage:
                self._write(
                    stream,
                    responses.usage_chunk(
                        id=self.id,
                        created=self.created,
                        model=request.model,
                        chat=request.chat,
                        usage_=self._usage(),
                    ),
                )
        else:
            self._write(stream, self._failure(event).body())
        self._finish(reason)
        self._write(stream, "[DONE]")
        if not handler.write_chunk(b""):
            handler.close_connection = True
