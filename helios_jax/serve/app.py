"""The OpenAI-compatible HTTP server over an :class:`~helios_jax.runtime.api.Engine`.

Standard library only: a :class:`http.server.ThreadingHTTPServer`, one thread per connection
(HTTP/1.1 keep-alive; streams use chunked transfer encoding). A generation request's life:

1. The handler reads the body (at most :data:`MAX_BODY_BYTES`), checks the API key on ``/v1/*``
   (``hmac.compare_digest``), and ``openai_protocol`` parses and validates it into token ids and
   :class:`SamplingParams`; every failure is an OpenAI error object with its status.
2. ``engine.submit`` returns a :class:`RequestStream`. The handler reads its events with a short
   timeout; between events it peeks at the socket, so a client that hangs up is noticed even
   while nothing is being written, and a failing write notices it while streaming. Either way
   the handler calls ``RequestStream.cancel()`` and drops the connection.
3. A non-streaming request collects every event and answers once, with ``usage``. A streaming
   request answers ``200 text/event-stream`` at once and writes one SSE ``data:`` chunk per
   visible burst, a chunk with the finish reason, the usage chunk when
   ``stream_options.include_usage`` asks for it, and ``data: [DONE]``. An engine error after
   the headers went out is written as a ``data: {"error": ...}`` event before ``[DONE]``.
4. ``ServerMetrics`` records the response status, time to first token, inter-token latency,
   end-to-end latency, token counts and the finish reason; ``/metrics`` renders them followed by
   the engine's own ``metrics_text()``.

The server binds its port before the engine exists (:func:`serve` builds the engine while
``/health`` answers 503), so a taken port fails at once and an orchestrator can watch readiness
during a long preparation.
"""
from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import logging
import queue
import select
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from helios_jax.runtime.api import Engine, GenerationRequest, RequestStream, StreamEvent
from helios_jax.serve import openai_protocol as proto
from helios_jax.serve.flags import ServerConfig
from helios_jax.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from helios_jax.serve.metrics import ServerMetrics

log = logging.getLogger(__name__)

REAL_ENGINE_MODULE = "helios_jax.runtime.engine"
MAX_BODY_BYTES = 16 * 1024 * 1024
EVENT_POLL_S = 0.05  # how often a waiting handler checks whether its client is still there
IDLE_CONNECTION_TIMEOUT_S = 300.0  # a keep-alive connection with no request for this long is closed


class EngineUnavailable(RuntimeError):
    """The requested engine cannot be built (for the real one: its module is missing or broken)."""


def build_engine(config: ServerConfig) -> Engine:
    """The engine the flags ask for: the only place the server constructs one.

    ``--engine=fake`` returns :class:`helios_jax.serve.fake.FakeEngine` (context
    ``--max_model_len`` or 2048, per-token delay ``--fake_token_delay_ms``). Otherwise
    ``helios_jax.runtime.engine.build_engine(config.engine_options)`` builds the real engine from
    the untouched engine flags (:class:`helios_jax.serve.flags.EngineOptions`), imported only
    here so that the fake never loads jax.

    Raises:
      EngineUnavailable: the real engine's module cannot be imported or has no ``build_engine``.
    """
    if config.engine == "fake":
        from helios_jax.serve.fake import FakeEngine

        return FakeEngine(max_model_len=config.engine_options.max_model_len or 2048,
                          token_delay_s=config.fake_token_delay_ms / 1000.0)
    try:
        module = importlib.import_module(REAL_ENGINE_MODULE)
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == REAL_ENGINE_MODULE:
            raise EngineUnavailable(
                f"the real engine module {REAL_ENGINE_MODULE} does not exist yet; "
                "run with --engine=fake to serve the deterministic fake engine") from e
        raise EngineUnavailable(f"importing the real engine module {REAL_ENGINE_MODULE} failed: {e}") from e
    factory = getattr(module, "build_engine", None)
    if not callable(factory):
        raise EngineUnavailable(f"{REAL_ENGINE_MODULE} has no build_engine(config) function")
    return factory(config.engine_options)


class HeliosServer(ThreadingHTTPServer):
    """The HTTP server: the engine (None while it is being built), the config and the metrics."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, config: ServerConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        super().__init__((config.host, config.port), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def attach_engine(self, engine: Engine) -> None:
        self.engine = engine

    def served_model(self) -> str:
        return self.config.served_model_name or self.engine.model_name


def make_server(config: ServerConfig, engine: Engine | None = None) -> HeliosServer:
    """A bound server (``config.port`` 0 picks a free port; see ``HeliosServer.port``)."""
    return HeliosServer(config, engine)


class _ClientGone(Exception):
    """The client closed the connection; the request is cancelled and nothing more is written."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HeliosServer
    timeout = IDLE_CONNECTION_TIMEOUT_S
    _path = "other"  # until a request line has been parsed
    _headers_sent = False

    # -- routing ----------------------------------------------------------------------------
    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_HEAD(self):
        self._dispatch("HEAD")

    _ROUTES = {
        "/health": ("GET", "_health"),
        "/metrics": ("GET", "_metrics"),
        "/v1/models": ("GET", "_models"),
        "/v1/completions": ("POST", "_completions"),
        "/v1/chat/completions": ("POST", "_chat_completions"),
    }

    def _dispatch(self, method: str) -> None:
        self._arrival = time.monotonic()
        self._path = urlsplit(self.path).path
        self._headers_sent = False
        self._next_liveness_check = 0.0
        try:
            self._body = self._read_body()
            if self._path.startswith("/v1/") or self._path == "/v1":
                self._authorize()
            route = self._ROUTES.get(self._path)
            if route is None:
                raise proto.ApiError(404, f"no such endpoint: {method} {self._path}", code="not_found")
            if method != route[0]:
                self._allow = route[0]
                raise proto.ApiError(405, f"{self._path} accepts {route[0]} only", code="method_not_allowed")
            getattr(self, route[1])()
        except proto.ApiError as e:
            self._send_error_object(e)
        except _ClientGone:
            self.close_connection = True
        except Exception as e:  # an engine or server bug: report it and keep serving
            log.exception("unhandled error on %s %s", method, self._path)
            self._send_error_object(proto.ApiError(500, f"internal server error: {e}", code="internal_error"))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise proto.ApiError(411, "chunked request bodies are not supported; send Content-Length",
                                 code="length_required")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise proto.bad_request("invalid Content-Length header") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            raise proto.ApiError(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes",
                                 code="request_too_large")
        return self.rfile.read(length) if length else b""

    def _authorize(self) -> None:
        key = self.server.config.api_key
        if key is None:
            return
        header = self.headers.get("Authorization", "")
        scheme, _, supplied = header.partition(" ")
        if not header:
            raise proto.ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                                 code="invalid_api_key")
        # Digests first, so that compare_digest's constant time covers the key's length as well.
        supplied_digest = hashlib.sha256(supplied.strip().encode()).digest()
        key_digest = hashlib.sha256(key.encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(supplied_digest, key_digest):
            raise proto.ApiError(401, "incorrect API key provided", code="invalid_api_key")

    # -- plain endpoints --------------------------------------------------------------------
    def _health(self) -> None:
        engine = self.server.engine
        if engine is None:
            self._send_json(503, {"status": "starting"})
        elif engine.ready():
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(503, {"status": "not ready"})

    def _metrics(self) -> None:
        text = self.server.metrics.render()
        engine = self.server.engine
        if engine is not None:
            try:
                engine_text = engine.metrics_text()
            except Exception as e:  # metrics must not take the endpoint down
                log.exception("engine.metrics_text() failed")
                engine_text = f"# engine metrics unavailable: {type(e).__name__}\n"
            text += engine_text if engine_text.endswith("\n") or not engine_text else engine_text + "\n"
        self._send_bytes(200, text.encode("utf-8"), METRICS_CONTENT_TYPE)

    def _models(self) -> None:
        self._require_engine(ready=False)
        self._send_json(200, proto.models_response(self.server.served_model(), self.server.created))

    def _require_engine(self, ready: bool = True) -> Engine:
        engine = self.server.engine
        if engine is None:
            raise proto.ApiError(503, "the engine is starting", code="engine_not_ready")
        if ready and not engine.ready():
            raise proto.ApiError(503, "the engine is not ready", code="engine_not_ready")
        return engine

    # -- generation -------------------------------------------------------------------------
    def _completions(self) -> None:
        self._generate(chat=False)

    def _chat_completions(self) -> None:
        self._generate(chat=True)

    def _generate(self, chat: bool) -> None:
        engine = self._require_engine()
        body = proto.parse_json_body(self._body)
        parse = proto.parse_chat_request if chat else proto.parse_completion_request
        try:
            request = parse(body, tokenizer=engine.tokenizer, served_model=self.server.served_model(),
                            max_model_len=engine.max_model_len)
        except ValueError as e:  # SamplingParams' own checks, should the protocol layer miss one
            raise proto.bad_request(str(e)) from None
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        generation = GenerationRequest(request_id=request_id, prompt_tokens=request.prompt_tokens,
                                       sampling=request.sampling, message_endpoints=request.message_endpoints)
        try:
            stream = engine.submit(generation)
        except Exception as e:
            log.exception("engine.submit failed for %s", request_id)
            self.server.metrics.finished.inc(reason="error")
            raise proto.ApiError(500, f"the engine failed to accept the request: {e}", code="engine_error") from e
        run = _Run(self, engine, request, request_id)
        metrics = self.server.metrics
        metrics.running.inc()
        try:
            if request.stream:
                run.stream_response(stream)
            else:
                run.full_response(stream)
        except BaseException:
            if not stream.finished:  # whatever went wrong here, free the engine's slot
                stream.cancel()
            raise
        finally:
            metrics.running.dec()

    def next_event(self, stream: RequestStream) -> StreamEvent:
        """The next event; cancels the stream and raises _ClientGone if the client hung up.

        The socket is checked every EVENT_POLL_S whether or not events keep arriving, so a
        non-streaming request whose client left is cancelled within that time too.
        """
        while True:
            now = time.monotonic()
            if now >= self._next_liveness_check:
                self._next_liveness_check = now + EVENT_POLL_S
                if self._client_gone():
                    stream.cancel()
                    raise _ClientGone()
            try:
                return stream.get(timeout=EVENT_POLL_S)
            except queue.Empty:
                pass

    def _client_gone(self) -> bool:
        """True when the peer closed its end: the socket reads as end-of-file (or fails)."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    # -- writing ----------------------------------------------------------------------------
    def _send_error_object(self, error: proto.ApiError) -> None:
        if self._headers_sent:  # mid-stream: nothing sensible can be written any more
            self.close_connection = True
            return
        headers = {}
        if error.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if error.status == 405:
            headers["Allow"] = getattr(self, "_allow", "GET")
        self._send_json(error.status, error.body(), headers)

    def _send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send_bytes(status, json.dumps(payload).encode("utf-8"), "application/json", headers)

    def _send_bytes(self, status: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
        self.server.metrics.record_response(self._path, status)
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self._headers_sent = True
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def start_event_stream(self) -> None:
        self.server.metrics.record_response(self._path, 200)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()
        self._headers_sent = True

    def write_chunk(self, data: bytes) -> bool:
        """One HTTP chunk (b"" ends the body); False when the write failed (client gone)."""
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")
            self.wfile.flush()
            return True
        except OSError:
            return False

    def send_error(self, code, message=None, explain=None):
        """The base class's own errors (malformed request line or headers, unknown method) as
        OpenAI error objects instead of its HTML page; the connection closes afterwards."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsed request line: answer with a status line
            self.request_version = "HTTP/1.0"
        text = message or self.responses.get(code, ("error",))[0]
        if explain:
            text = f"{text}: {explain}"
        self._send_error_object(proto.ApiError(code, text, code="bad_http_request" if code < 500 else "http_error"))

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's signature)
        log.debug("%s - %s", self.address_string(), format % args)


class _Run:
    """One generation request's response: event collection, rendering and metrics."""

    def __init__(self, handler: _Handler, engine: Engine, request: proto.ParsedRequest, request_id: str):
        self.handler = handler
        self.tokenizer = engine.tokenizer
        self.request = request
        self.id = request_id
        self.created = int(time.time())
        self.metrics = handler.server.metrics
        self.arrival = handler._arrival
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
            except _ClientGone:
                self._finish("cancelled")
                raise
            self._observe(event)
            yield event
            if event.finish_reason is not None:
                return

    def _token_texts(self, ids) -> list[str]:
        return [self.tokenizer.decode([i]) for i in ids]

    def _logprobs(self, ids, values, offset: int, always: bool = False) -> dict | None:
        """The logprobs object for `ids` (None when not requested, or when there are no tokens
        and not `always`); missing values render as null."""
        if not self.request.logprobs or (not ids and not always):
            return None
        texts = self._token_texts(ids)
        values = list(values) if values is not None else [None] * len(ids)
        values = (values + [None] * len(ids))[:len(ids)]
        if self.request.chat:
            return proto.chat_logprobs(texts, values)
        return proto.completion_logprobs(texts, values, offset)

    def _failure(self, event: StreamEvent) -> proto.ApiError:
        if event.finish_reason == "cancelled":
            return proto.ApiError(503, "the engine cancelled the request", code="cancelled")
        return proto.ApiError(500, f"the engine failed: {event.error or 'unknown error'}", code="engine_error")

    def _usage(self) -> dict:
        return proto.usage(self.prompt_tokens, self.completion_tokens)

    # -- non-streaming ----------------------------------------------------------------------
    def full_response(self, stream: RequestStream) -> None:
        request = self.request
        echo_text = self.tokenizer.decode(request.prompt_tokens) if request.echo else ""
        text, ids, values, prompt_values = [], [], [], None
        for event in self._events(stream):
            if event.prompt_logprobs is not None:
                prompt_values = event.prompt_logprobs
            text.append(event.text)
            ids.extend(event.token_ids)
            values.extend(event.token_logprobs or [None] * len(event.token_ids))
        reason = event.finish_reason
        self._finish(reason)
        if reason not in ("stop", "length"):
            raise self._failure(event)
        logprobs = None
        if request.logprobs:
            if request.echo:  # prompt tokens first, then the generated ones, as one object
                prompt_values = list(prompt_values or [None] * len(request.prompt_tokens))
                logprobs = self._logprobs(list(request.prompt_tokens) + ids, prompt_values + values, 0, True)
            else:
                logprobs = self._logprobs(ids, values, 0, True)
        build = proto.chat_response if request.chat else proto.completion_response
        self.handler._send_json(200, build(id=self.id, created=self.created, model=request.model,
                                           text=echo_text + "".join(text), finish_reason=reason,
                                           usage_=self._usage(), logprobs=logprobs))

    # -- streaming --------------------------------------------------------------------------
    def _write(self, stream: RequestStream, payload) -> None:
        if not self.handler.write_chunk(proto.sse(payload)):
            stream.cancel()
            self._finish("cancelled")
            raise _ClientGone()

    def _chunk(self, text: str | None, finish: str | None = None, logprobs: dict | None = None,
               role: bool = False) -> dict:
        common = dict(id=self.id, created=self.created, model=self.request.model, finish_reason=finish,
                      logprobs=logprobs, include_usage=self.request.include_usage)
        if self.request.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            return proto.chat_chunk(delta=delta, **common)
        return proto.completion_chunk(text=text or "", **common)

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
                lp = self._logprobs(request.prompt_tokens, prompt_values, offset, True)
                self._write(stream, self._chunk(echo, logprobs=lp))
                offset += len(echo)
            first = False
            lp = self._logprobs(event.token_ids, event.token_logprobs, offset)
            if event.text or lp is not None:
                self._write(stream, self._chunk(event.text, logprobs=lp))
                offset += len(event.text)
        reason = event.finish_reason
        if reason in ("stop", "length"):
            self._write(stream, self._chunk(None, finish=reason))
            if request.include_usage:
                self._write(stream, proto.usage_chunk(id=self.id, created=self.created, model=request.model,
                                                      chat=request.chat, usage_=self._usage()))
        else:
            self._write(stream, self._failure(event).body())
        self._finish(reason)
        self._write(stream, "[DONE]")
        if not handler.write_chunk(b""):
            handler.close_connection = True


# -- the process -----------------------------------------------------------------------------------

def serve(config: ServerConfig) -> int:
    """Bind, build the engine while ``/health`` answers 503, wait for readiness, serve until
    SIGINT or SIGTERM. Returns the process exit status."""
    from absl import logging as absl_logging

    info = absl_logging.info
    try:
        server = make_server(config)
    except OSError as e:
        absl_logging.error("cannot listen on %s:%d: %s", config.host, config.port, e)
        return 1
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    info("[1/3] listening on %s (/health answers 503 until the engine is ready)", server.url)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    engine = None
    try:
        what = "fake" if config.engine == "fake" else f"real ({config.engine_options.model or 'embedded model'})"
        info("[2/3] building the %s engine ...", what)
        start = time.monotonic()
        try:
            engine = build_engine(config)
        except EngineUnavailable as e:
            absl_logging.error("%s", e)
            return 1
        except Exception:
            absl_logging.exception("building the engine failed")
            return 1
        server.attach_engine(engine)
        info("engine built in %.1f s; waiting for it to become ready", time.monotonic() - start)
        next_note = time.monotonic() + 10.0
        while not engine.ready():
            time.sleep(0.1)
            if time.monotonic() >= next_note:
                info("still waiting for the engine (%.0f s)", time.monotonic() - start)
                next_note += 10.0
        info("[3/3] ready: serving model '%s' on %s (%.1f s after start)", server.served_model(), server.url,
             time.monotonic() - start)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        info("shutting down")
        return 0
    finally:
        server.shutdown()
        server.server_close()
        if engine is not None:
            engine.shutdown()


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt()
