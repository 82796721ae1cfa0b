"""The ASGI application: routes, the API key, admission while draining, errors, metrics.

Built per server by :func:`build_app` (Starlette; uvicorn runs it). Every request passes
:class:`ServerMiddleware` first, which

* records the response's status and duration (``helios_http_requests_total``,
  ``helios_http_request_duration_seconds``);
* checks the API key on ``/v1/*``, ``/tokenize`` and ``/detokenize`` (``Authorization: Bearer``,
  ``hmac.compare_digest`` over SHA-256 digests, so the comparison's time says nothing about
  the key's length either), before routing, so unknown ``/v1`` paths cannot be probed;
* answers 503 ``server_shutting_down`` (and closes the connection) while the server drains,
  except on ``/health`` (which says "draining"), ``/metrics`` and ``/version``;
* counts the requests in flight, which the drain waits for.

Every error is the OpenAI error object; a 5xx never carries an exception's text (the server
logs it). GET routes answer HEAD too (Starlette adds it). With ``--allowed_origins`` the app is
wrapped in Starlette's ``CORSMiddleware``, outermost, so browsers' preflight requests need no key.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios_jax.serve import tokenize_api
from helios_jax.serve.generation import generate, require_engine
from helios_jax.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from helios_jax.serve.openai_errors import ApiError
from helios_jax.serve.openai_responses import models_response

if TYPE_CHECKING:
    from helios_jax.serve.app import HeliosServer

log = logging.getLogger(__name__)

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
OPEN_WHILE_DRAINING = ("/health", "/metrics", "/version")


def error_response(error: ApiError, headers: dict | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _protected(path: str) -> bool:
    return path == "/v1" or path.startswith(PROTECTED_PREFIXES)


def _authorization_error(key: str, header: str) -> ApiError | None:
    if not header:
        return ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    scheme, _, supplied = header.partition(" ")
    # Digests first, so that compare_digest's constant time covers the key's length as well.
    supplied_digest = hashlib.sha256(supplied.strip().encode()).digest()
    key_digest = hashlib.sha256(key.encode()).digest()
    if scheme.lower() != "bearer" or not hmac.compare_digest(supplied_digest, key_digest):
        return ApiError(401, "incorrect API key provided", code="invalid_api_key")
    return None


class ServerMiddleware:
    """Metrics, the API key, admission and the in-flight count (see the module docstring)."""

    def __init__(self, app: ASGIApp, server: HeliosServer):
        self.app, self.server = app, server

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        path, server = scope["path"], self.server
        key = server.config.api_key
        if key is not None and _protected(path):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            error = _authorization_error(key, header.decode("latin-1"))
            if error is not None:
                return error_response(error)
        if server.draining and path not in OPEN_WHILE_DRAINING:
            return error_response(
                ApiError(503, "the server is shutting down", code="server_shutting_down"),
                {"Connection": "close"},
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, metrics, start = scope["path"], self.server.metrics, time.monotonic()

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.record_response(path, message["status"])
            await send(message)

        refusal = self._refusal(scope)
        self.server.in_flight += 1
        try:
            if refusal is not None:
                await refusal(scope, receive, send_counted)
            else:
                await self.app(scope, receive, send_counted)
        finally:
            self.server.in_flight -= 1
            metrics.http_duration.labels(endpoint=metrics.endpoint(path)).observe(time.monotonic() - start)


# -- plain endpoints -------------------------------------------------------------------------------


def _server(request: Request) -> HeliosServer:
    return request.app.state.server


async def health(request: Request) -> Response:
    server = _server(request)
    engine = server.engine
    if server.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if engine is None:
        return JSONResponse({"status": "starting"}, status_code=503)
    if engine.ready():
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "not ready"}, status_code=503)


async def metrics(request: Request) -> Response:
    server = _server(request)
    text = server.metrics.render()
    engine = server.engine
    if engine is not None:
        try:
            engine_text = engine.metrics_text()
        except Exception as e:  # metrics must not take the endpoint down
            log.exception("engine.metrics_text() failed")
            engine_text = f"# engine metrics unavailable: {type(e).__name__}\n"
        text += engine_text if engine_text.endswith("\n") or not engine_text else engine_text + "\n"
    return Response(text, media_type=METRICS_CONTENT_TYPE)


async def models(request: Request) -> Response:
    server = _server(request)
    engine = require_engine(server, ready=False)
    return JSONResponse(models_response(server.served_model(), server.created, engine.max_model_len))


async def completions(request: Request) -> Response:
    return await generate(request, _server(request), chat=False)


async def chat_completions(request: Request) -> Response:
    return await generate(request, _server(request), chat=True)


# -- errors ----------------------------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (404, 405) as OpenAI error objects."""
    assert isinstance(exc, HTTPException)
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        error = ApiError(404, f"no such endpoint: {method} {path}", code="not_found")
    elif exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        error = ApiError(405, f"{path} accepts {allow} only", code="method_not_allowed")
    else:
        error = ApiError(exc.status_code, str(exc.detail), code="http_error")
    return error_response(error, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(ApiError(500, "internal server error", code="internal_error"))


def build_app(server: HeliosServer) -> Starlette:
    """The ASGI application of `server` (its config, engine, metrics and drain state)."""
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/version", tokenize_api.version, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/tokenize", tokenize_api.tokenize, methods=["POST"]),
        Route("/detokenize", tokenize_api.detokenize, methods=["POST"]),
    ]
    middleware = []
    origins = server.config.allowed_origins
    if origins:
        middleware.append(
            Middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["*"], allow_headers=["*"])
        )
    middleware.append(Middleware(ServerMiddleware, server=server))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.server = server
    return app
