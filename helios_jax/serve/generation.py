"""A generation request on the event loop: parse off the loop, submit, answer, cancel.

A request's life (``/v1/completions`` and ``/v1/chat/completions``):

1. The body is read under the size cap (``body.read_body``), then parsed, validated and
   tokenized (``openai_protocol``): in a worker thread (its own ``CapacityLimiter``) when the
   body is over :data:`INLINE_PARSE_BYTES`, so a long prompt never stalls the streams the event
   loop is writing; a small body is parsed on the loop, where it costs less than the hop to a
   thread (about 0.2 ms), unless it names a structured-output field: checking and compiling a
   grammar (``structured``) always runs in the worker thread.
2. ``engine.submit`` returns a :class:`RequestStream`. Its events are read without blocking the
   loop (:func:`next_event`: a queued event at once, otherwise a wait for the stream's
   listener, which the engine calls on every put: no thread per waiting request).
3. While the request waits and streams, two watchers run beside it (:func:`run_watched`): one
   reads the ASGI ``receive`` channel, which yields ``http.disconnect`` when the client hangs
   up; the other waits for the server's abort event (a shutdown past its drain timeout).
   Either cancels the work: the engine request is cancelled (``RequestStream.cancel()``), a
   departed client is counted as cancelled, and an aborted stream ends with an error event and
   ``data: [DONE]`` (a non-streaming request answers 503).
4. :class:`~helios_jax.serve.streaming.GenerationRun` renders the answer and records metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import queue
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from helios_jax.runtime.api import Engine, GenerationRequest, StreamEvent
from helios_jax.serve import chat_request, structured
from helios_jax.serve import openai_protocol as proto
from helios_jax.serve.body import parse_json_body, read_body
from helios_jax.serve.choices import Choice, full_body, unfinished, usage
from helios_jax.serve.events import next_event
from helios_jax.serve.openai_errors import ApiError, bad_request
from helios_jax.serve.openai_responses import sse
from helios_jax.serve.streaming import DONE, GenerationRun

if TYPE_CHECKING:
    from helios_jax.serve.app import HeliosServer

log = logging.getLogger(__name__)

INLINE_PARSE_BYTES = 8192  # bodies up to this size are parsed and tokenized on the event loop
SHUTTING_DOWN = ApiError(503, "the server is shutting down", code="server_shutting_down")


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_watched(work: Callable[[], Awaitable[None]], receive: Receive, abort: asyncio.Event) -> str:
    """Run `work` until it returns ("done"), the client disconnects ("gone") or `abort` is set
    ("aborted"); whichever comes first cancels the others."""
    outcome = "done"
    async with anyio.create_task_group() as group:

        async def watch(wait: Callable[[], Awaitable], why: str) -> None:
            nonlocal outcome
            await wait()
            outcome = why
            group.cancel_scope.cancel()

        group.start_soon(watch, functools.partial(wait_for_disconnect, receive), "gone")
        group.start_soon(watch, abort.wait, "aborted")
        await work()
        group.cancel_scope.cancel()
    return outcome


def _parse(raw: bytes, chat: bool, engine: Engine, limits: proto.Limits) -> proto.ParsedRequest:
    """The worker thread's part: JSON, validation, tokenization, then the structured-output
    constraint, checked and compiled (``structured``)."""
    body = parse_json_body(raw)
    parse = chat_request.parse_chat_request if chat else proto.parse_completion_request
    try:
        parsed = parse(body, tokenizer=engine.tokenizer, limits=limits)
    except ValueError as e:  # SamplingParams' own checks, should the protocol layer miss one
        raise bad_request(str(e)) from None
    grammar = structured.parse_grammar(body)
    forced = structured.forced_tool_grammar(body, parsed.tool_parser)
    if grammar is not None and forced is not None:
        raise bad_request(
            "a forced tool_choice constrains the output itself: give no other constraint", grammar[1]
        )
    grammar = grammar or forced
    if grammar is None:
        return parsed
    spec, param = grammar
    return dataclasses.replace(parsed, grammar=structured.compile_grammar(spec, engine, param))


def require_engine(server: HeliosServer, ready: bool = True) -> Engine:
    engine = server.engine
    if engine is None:
        raise ApiError(503, "the engine is starting", code="engine_not_ready")
    if ready and not engine.ready():
        raise ApiError(503, "the engine is not ready", code="engine_not_ready")
    return engine


async def generate(request: Request, server: HeliosServer, chat: bool) -> Response:
    """The endpoint of both generation APIs: one engine request per choice (``n`` per prompt)."""
    arrival = time.monotonic()
    engine = require_engine(server)
    raw = await read_body(request, server.config.max_body_bytes)
    parse = functools.partial(_parse, raw, chat, engine, server.limits())
    if len(raw) <= INLINE_PARSE_BYTES and not any(m in raw for m in structured.BODY_MARKERS):
        parsed = parse()
    else:
        parsed = await anyio.to_thread.run_sync(parse, limiter=server.parse_limiter)
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    choices = _submit(engine, server, parsed, request_id, arrival)
    if parsed.stream:
        return EventStreamResponse(server, choices)
    return await _full_response(request, server, choices)


def _submit(engine: Engine, server: HeliosServer, parsed, request_id: str, arrival: float) -> list[Choice]:
    """Submit every choice's engine request (ids ``{request_id}-{index}`` when there are
    several); should one be refused, those already submitted are cancelled."""
    wanted = parsed.choice_requests()
    choices: list[Choice] = []
    try:
        for index, choice in wanted:
            generation = GenerationRequest(
                request_id=request_id if len(wanted) == 1 else f"{request_id}-{index}",
                prompt_tokens=choice.prompt_tokens,
                sampling=choice.sampling,
                message_endpoints=choice.message_endpoints,
                proposal_source=choice.proposal_source,
                grammar=choice.grammar,
            )
            stream = engine.submit(generation)
            run = GenerationRun(engine.tokenizer, choice, request_id, server.metrics, arrival, index=index)
            choices.append(Choice(run, stream, prompt_counted=index % parsed.n == 0))
    except ValueError as e:  # the engine's own request checks (HeliosEngine.submit)
        _abandon(server, choices)
        raise bad_request(str(e)) from None
    except Exception:
        log.exception("engine.submit failed for %s", request_id)
        _abandon(server, choices)
        raise ApiError(500, "the engine failed to accept the request", code="engine_error") from None
    return choices


def _abandon(server: HeliosServer, choices: list[Choice]) -> None:
    server.metrics.finished.labels(reason="error").inc()
    for choice in choices:
        choice.stream.cancel()


def _log_failure(run: GenerationRun, event: StreamEvent) -> None:
    if event.finish_reason == "error":
        log.error("request %s failed in the engine: %s", run.id, event.error or "no reason given")


def _take_ready(choice: Choice, events: list[StreamEvent]) -> bool:
    """Collect the choice's events already queued; True when the finishing one is among them
    (then no watcher needs to start: a fast engine's answer is sent at once)."""
    while True:
        try:
            event = choice.stream.get(timeout=0)
        except queue.Empty:
            return False
        choice.run.observe(event)
        events.append(event)
        if event.finish_reason is not None:
            return True


async def _full_response(request: Request, server: HeliosServer, choices: list[Choice]) -> Response:
    events: list[list[StreamEvent]] = [[] for _ in choices]

    async def collect() -> None:
        for choice, choice_events in zip(choices, events):
            while not choice.stream.finished:
                event = await next_event(choice.stream)
                choice.run.observe(event)
                choice_events.append(event)

    server.metrics.running.inc()
    try:
        done = all([_take_ready(c, e) for c, e in zip(choices, events)])  # every choice's ready events
        outcome = "done" if done else await run_watched(collect, request.receive, server.abort)
    finally:
        server.metrics.running.dec()
        for choice in unfinished(choices):  # whatever happened, free the engine's slots
            choice.stream.cancel()
    if outcome != "done":
        for choice in choices:
            choice.run.finish("cancelled")
        if outcome == "gone":
            return NoResponse()
        raise SHUTTING_DOWN
    for choice, choice_events in zip(choices, events):
        _log_failure(choice.run, choice_events[-1])
    return JSONResponse(full_body(choices, events))


class NoResponse(Response):
    """For a client that has gone: nothing is sent."""

    def __init__(self):
        super().__init__(status_code=499)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


class EventStreamResponse(Response):
    """``200 text/event-stream``: one SSE event per visible burst of any choice, until
    ``data: [DONE]`` (HTTP/1.1 chunked transfer encoding: no Content-Length)."""

    def __init__(self, server: HeliosServer, choices: list[Choice]):
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self.server, self.choices = server, choices

    async def _write(self, send: Send, chunks: list[bytes]) -> None:
        if chunks:
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})

    async def _pump(self, send: Send, choice: Choice) -> None:
        """One choice's chunks, as its events arrive, through its finish chunk."""
        run, stream = choice.run, choice.stream
        while True:
            event = await next_event(stream)
            chunks = run.event_chunks(event)
            if event.finish_reason is not None:
                _log_failure(run, event)
                await self._write(send, chunks + run.finish_chunks(event))
                return
            await self._write(send, chunks)

    async def _body(self, send: Send) -> None:
        choices = self.choices
        await self._write(send, [c for choice in choices for c in choice.run.opening_chunks()])
        async with anyio.create_task_group() as group:
            for choice in choices:
                group.start_soon(self._pump, send, choice)
        served = all(c.run.finished and c.stream.finished for c in choices)
        ok = all(c.run.finish_reason in ("stop", "length") for c in choices)
        tail = choices[0].run.usage_chunks(usage(choices)) if served and ok else []
        await self._write(send, tail + [DONE])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server, choices = self.server, self.choices
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        server.metrics.running.inc()
        try:
            outcome = await run_watched(functools.partial(self._body, send), receive, server.abort)
            if outcome != "done":
                for choice in choices:
                    choice.run.finish("cancelled")
            if outcome == "aborted":
                await self._write(send, [sse(SHUTTING_DOWN.body()), DONE])
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            server.metrics.running.dec()
            for choice in unfinished(choices):
                choice.stream.cancel()
