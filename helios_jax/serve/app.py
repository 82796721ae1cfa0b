"""The OpenAI-compatible HTTP server over an :class:`~helios_jax.runtime.api.Engine`.

Standard library only: a :class:`http.server.ThreadingHTTPServer`, one thread per connection
(HTTP/1.1 keep-alive; streams use chunked transfer encoding). The server (this module) owns the
socket, the engine and the metrics; ``handler`` routes and writes; ``streaming`` renders one
generation's answer. A generation request's life:

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

The server binds its port before the engine exists (:func:`serve` calls the engine factory it is
given while ``/health`` answers 503), so a taken port fails at once and an orchestrator can watch
readiness during a long preparation. The server never decides which engine it runs: ``python -m
helios_jax.serve`` passes the factory (``helios_jax.serve.engines.engine_factory``), tests pass
fakes (``helios_jax.serve.fake``).
"""

from __future__ import annotations

import signal
import threading
import time
import warnings
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from helios_jax.runtime.api import Engine
from helios_jax.serve.flags import ServerConfig
from helios_jax.serve.handler import RequestHandler
from helios_jax.serve.metrics import ServerMetrics

EngineFactory = Callable[[], Engine]  # builds the engine the server runs (slow: loads and prepares)


class HeliosServer(ThreadingHTTPServer):
    """The HTTP server: the engine (None while it is being built), the config and the metrics."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, config: ServerConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        super().__init__((config.host, config.port), RequestHandler)

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


def build_engine(config: ServerConfig) -> Engine:
    """Deprecated: ``helios_jax.serve.engines.engine_factory(config)()``."""
    from helios_jax.serve.engines import engine_factory

    warnings.warn(
        "helios_jax.serve.app.build_engine is deprecated: pass an engine factory to serve() "
        "(helios_jax.serve.engines.engine_factory)",
        DeprecationWarning,
        stacklevel=2,
    )
    return engine_factory(config)()


# -- the process -----------------------------------------------------------------------------------


def serve(config: ServerConfig, engine_factory: EngineFactory) -> int:
    """Bind, build the engine with `engine_factory` while ``/health`` answers 503, wait for
    readiness, serve until SIGINT or SIGTERM. Returns the process exit status."""
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
        what = (
            "fake" if config.engine == "fake" else f"real ({config.engine_options.model or 'embedded model'})"
        )
        info("[2/3] building the %s engine ...", what)
        start = time.monotonic()
        try:
            engine = engine_factory()
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
        info(
            "[3/3] ready: serving model '%s' on %s (%.1f s after start)",
            server.served_model(),
            server.url,
            time.monotonic() - start,
        )
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
