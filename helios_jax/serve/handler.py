"""The HTTP request handler: routing, body limits, the API key, the plain endpoints and writing.

One :class:`RequestHandler` serves one connection (HTTP/1.1 keep-alive). ``_dispatch`` reads the
body (at most :data:`MAX_BODY_BYTES`), checks the API key on ``/v1/*`` (``hmac.compare_digest``
over digests), routes by path and method, and turns every failure into an OpenAI error object.
A generation request is parsed by ``openai_protocol``, submitted to the engine, and answered by
:class:`helios_jax.serve.streaming.GenerationResponse`; while it waits for events the handler
peeks at the socket, so a client that hangs up is noticed and its request cancelled.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import select
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from helios_jax.runtime.api import Engine, GenerationRequest, RequestStream, StreamEvent
from helios_jax.serve import openai_protocol as proto
from helios_jax.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from helios_jax.serve.openai_errors import ApiError, bad_request
from helios_jax.serve.openai_responses import models_response
from helios_jax.serve.streaming import ClientGone, GenerationResponse

if TYPE_CHECKING:
    from helios_jax.serve.app import HeliosServer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
EVENT_POLL_S = 0.05  # how often a waiting handler checks whether its client is still there
IDLE_CONNECTION_TIMEOUT_S = 300.0  # a keep-alive connection with no request for this long is closed


class RequestHandler(BaseHTTPRequestHandler):
    """One connection's requests: routing, the API key, the plain endpoints, and the writing
    primitives that :class:`GenerationResponse` renders through."""

    protocol_version = "HTTP/1.1"
    server: HeliosServer
    arrival: float  # time.monotonic() when the current request was dispatched
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
        self.arrival = time.monotonic()
        self._path = urlsplit(self.path).path
        self._headers_sent = False
        self._next_liveness_check = 0.0
        try:
            self._body = self._read_body()
            if self._path.startswith("/v1/") or self._path == "/v1":
                self._authorize()
            route = self._ROUTES.get(self._path)
            if route is None:
                raise ApiError(404, f"no such endpoint: {method} {self._path}", code="not_found")
            if method != route[0]:
                self._allow = route[0]
                raise ApiError(405, f"{self._path} accepts {route[0]} only", code="method_not_allowed")
            getattr(self, route[1])()
        except ApiError as e:
            self._send_error_object(e)
        except ClientGone:
            self.close_connection = True
        except Exception as e:  # an engine or server bug: report it and keep serving
            log.exception("unhandled error on %s %s", method, self._path)
            self._send_error_object(ApiError(500, f"internal server error: {e}", code="internal_error"))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(
                411, "chunked request bodies are not supported; send Content-Length", code="length_required"
            )
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise bad_request("invalid Content-Length header") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            raise ApiError(
                413, f"request bodies are limited to {MAX_BODY_BYTES} bytes", code="request_too_large"
            )
        return self.rfile.read(length) if length else b""

    def _authorize(self) -> None:
        key = self.server.config.api_key
        if key is None:
            return
        header = self.headers.get("Authorization", "")
        scheme, _, supplied = header.partition(" ")
        if not header:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        # Digests first, so that compare_digest's constant time covers the key's length as well.
        supplied_digest = hashlib.sha256(supplied.strip().encode()).digest()
        key_digest = hashlib.sha256(key.encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(supplied_digest, key_digest):
            raise ApiError(401, "incorrect API key provided", code="invalid_api_key")

    # -- plain endpoints --------------------------------------------------------------------
    def _health(self) -> None:
        engine = self.server.engine
        if engine is None:
            self.send_json(503, {"status": "starting"})
        elif engine.ready():
            self.send_json(200, {"status": "ok"})
        else:
            self.send_json(503, {"status": "not ready"})

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
        self.send_json(200, models_response(self.server.served_model(), self.server.created))

    def _require_engine(self, ready: bool = True) -> Engine:
        engine = self.server.engine
        if engine is None:
            raise ApiError(503, "the engine is starting", code="engine_not_ready")
        if ready and not engine.ready():
            raise ApiError(503, "the engine is not ready", code="engine_not_ready")
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
            request = parse(
                body,
                tokenizer=engine.tokenizer,
                served_model=self.server.served_model(),
                max_model_len=engine.max_model_len,
            )
        except ValueError as e:  # SamplingParams' own checks, should the protocol layer miss one
            raise bad_request(str(e)) from None
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        generation = GenerationRequest(
            request_id=request_id,
            prompt_tokens=request.prompt_tokens,
            sampling=request.sampling,
            message_endpoints=request.message_endpoints,
        )
        try:
            stream = engine.submit(generation)
        except ValueError as e:  # the engine's own request checks (HeliosEngine.submit)
            self.server.metrics.finished.inc(reason="error")
            raise bad_request(str(e)) from None
        except Exception as e:
            log.exception("engine.submit failed for %s", request_id)
            self.server.metrics.finished.inc(reason="error")
            raise ApiError(500, f"the engine failed to accept the request: {e}", code="engine_error") from e
        run = GenerationResponse(self, engine, request, request_id)
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
        """The next event; cancels the stream and raises ClientGone if the client hung up.

        The socket is checked every EVENT_POLL_S whether or not events keep arriving, so a
        non-streaming request whose client left is cancelled within that time too.
        """
        while True:
            now = time.monotonic()
            if now >= self._next_liveness_check:
                self._next_liveness_check = now + EVENT_POLL_S
                if self._client_gone():
                    stream.cancel()
                    raise ClientGone()
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
    def _send_error_object(self, error: ApiError) -> None:
        if self._headers_sent:  # mid-stream: nothing sensible can be written any more
            self.close_connection = True
            return
        headers = {}
        if error.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if error.status == 405:
            headers["Allow"] = getattr(self, "_allow", "GET")
        self.send_json(error.status, error.body(), headers)

    def send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
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
        self._send_error_object(ApiError(code, text, code="bad_http_request" if code < 500 else "http_error"))

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's signature)
        log.debug("%s - %s", self.address_string(), format % args)
