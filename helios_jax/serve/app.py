"""The OpenAI-compatible HTTP server over an :class:`~helios_jax.runtime.api.Engine`.

ASGI on well-kept libraries: the application is Starlette (``routes``), served by uvicorn on an
event loop in a thread of its own, so :func:`serve` keeps the main thread for the engine's
construction and for signals. The server (this module) owns the socket, the engine, the
metrics and the drain; ``routes`` routes, checks the key and admits; ``generation`` runs a
generation request; ``streaming`` renders its answer. A generation request's life is in
``generation``'s docstring.

The server binds its port before the engine exists (:func:`serve` calls the engine factory it is
given while ``/health`` answers 503), so a taken port fails at once and an orchestrator can watch
readiness during a long preparation. The listen backlog is :data:`LISTEN_BACKLOG`, so a burst of
clients waits in the kernel's queue instead of being reset. The server never decides which
engine it runs: ``python -m helios_jax.serve`` passes the factory
(``helios_jax.serve.engines.engine_factory``), tests pass fakes (``helios_jax.serve.fake``).

Shutdown (SIGTERM or SIGINT; :meth:`HeliosServer.drain`): the server stops admitting (new
requests get 503 ``server_shutting_down``, ``/health`` says "draining"), lets the requests in
flight finish for up to ``--drain_timeout_s``, then aborts the rest: each open stream ends with
an error event and ``data: [DONE]``, a waiting non-streaming request gets a 503, and their
engine requests are cancelled. Then uvicorn closes the connections and the engine shuts down.
A second signal during the drain aborts at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable

import anyio
import uvicorn

from helios_jax.runtime import grammar
from helios_jax.runtime.api import Engine
from helios_jax.serve.flags import ServerConfig
from helios_jax.serve.metrics import ServerMetrics
from helios_jax.serve.openai_protocol import Limits
from helios_jax.serve.routes import build_app

EngineFactory = Callable[[], Engine]  # builds the engine the server runs (slow: loads and prepares)

LISTEN_BACKLOG = 2048  # uvicorn's default; the kernel caps it at net.core.somaxconn
KEEP_ALIVE_S = 5.0  # idle keep-alive connections close after this (uvicorn's and vLLM's default)
PROMPT_CHARS_PER_TOKEN = 64  # the default --max_prompt_chars: this many per token of context
ABORT_GRACE_S = 5.0  # after aborting, how long the aborted responses get to finish writing

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: a free one), or OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class HeliosServer:
    """The HTTP server: the engine (None while it is being built), the config, the metrics, the
    drain state and the uvicorn server that runs the ASGI app in a thread."""

    def __init__(self, config: ServerConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        self.draining = False
        self.in_flight = 0  # HTTP requests being answered (the event loop's thread writes it)
        self.abort = asyncio.Event()  # set on the loop when the drain's time is up
        self.parse_limiter = anyio.CapacityLimiter(4)  # tokenizing worker threads
        self.socket = bind(config.host, config.port)
        self.app = build_app(self)
        uv_config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=ABORT_GRACE_S,
            backlog=LISTEN_BACKLOG,
        )
        self._uvicorn = uvicorn.Server(uv_config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def attach_engine(self, engine: Engine) -> None:
        self.engine = engine

    def served_model(self) -> str:
        return self.config.served_model_name or self.engine.model_name

    def limits(self) -> Limits:
        """What requests are checked against (the engine must exist)."""
        max_model_len = self.engine.max_model_len
        chars = self.config.max_prompt_chars
        if chars is None:
            chars = PROMPT_CHARS_PER_TOKEN * max_model_len
        return Limits(self.served_model(), max_model_len, chars, self.config.tool_call_parser)

    # -- running -----------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        """Serve in a background thread; returns once uvicorn accepts connections. xgrammar (for
        structured output) is imported meanwhile, off every request's path."""
        grammar.import_in_background()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.005)

    def _run(self) -> None:
        # uvicorn >= 0.36 names its loop (uvloop when installed); older ones: asyncio's default.
        get_factory = getattr(self._uvicorn.config, "get_loop_factory", None)
        factory = get_factory() if get_factory is not None else None
        with asyncio.Runner(loop_factory=factory) as runner:
            self._loop = runner.get_loop()
            runner.run(self._uvicorn.serve(sockets=[self.socket]))

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting, wait up to `timeout_s` for the requests in flight, then abort the
        rest (module docstring). True when everything finished within the timeout."""
        self.draining = True
        self.metrics.draining.set(1)
        deadline = time.monotonic() + timeout_s
        try:
            while self.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
        except KeyboardInterrupt:  # a second signal: abort at once
            pass
        drained = not self.in_flight
        if not drained and self._loop is not None:
            self._loop.call_soon_threadsafe(self.abort.set)
            deadline = time.monotonic() + ABORT_GRACE_S
            while self.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
        return drained

    def stop(self) -> None:
        """Close every connection and the socket; end the server's thread."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=ABORT_GRACE_S + 5.0)
        self.socket.close()


def make_server(config: ServerConfig, engine: Engine | None = None) -> HeliosServer:
    """A bound server, not yet serving (``start()``); ``config.port`` 0 picks a free port."""
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


def _wait_until_ready(server: HeliosServer, engine: Engine, start: float) -> None:
    from absl import logging as absl_logging

    absl_logging.info("engine built in %.1f s; waiting for it to become ready", time.monotonic() - start)
    next_note = time.monotonic() + 10.0
    while not engine.ready():
        time.sleep(0.1)
        if time.monotonic() >= next_note:
            absl_logging.info("still waiting for the engine (%.0f s)", time.monotonic() - start)
            next_note += 10.0


def _build(config: ServerConfig, engine_factory: EngineFactory) -> Engine | None:
    from absl import logging as absl_logging

    what = "fake" if config.engine == "fake" else f"real ({config.engine_options.model or 'embedded model'})"
    absl_logging.info("[2/3] building the %s engine ...", what)
    try:
        return engine_factory()
    except (OSError, ValueError) as e:  # a model folder that is missing or unusable
        absl_logging.error("building the engine failed: %s: %s", type(e).__name__, e)
    except Exception:
        absl_logging.exception("building the engine failed")
    return None


def serve(config: ServerConfig, engine_factory: EngineFactory) -> int:
    """Bind, build the engine with `engine_factory` while ``/health`` answers 503, wait for
    readiness, serve until SIGINT or SIGTERM, drain. Returns the process exit status."""
    from absl import logging as absl_logging

    info = absl_logging.info
    try:
        server = make_server(config)
    except OSError as e:
        absl_logging.error("cannot listen on %s:%d: %s", config.host, config.port, e)
        return 1
    server.start()
    info("[1/3] listening on %s (/health answers 503 until the engine is ready)", server.url)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    engine = None
    try:
        start = time.monotonic()
        engine = _build(config, engine_factory)
        if engine is None:
            return 1
        server.attach_engine(engine)
        _wait_until_ready(server, engine, start)
        info("froze the startup heap: %d objects the collector no longer scans", freeze_startup_heap())
        info(
            "[3/3] ready: serving model '%s' on %s (%.1f s after start)",
            server.served_model(),
            server.url,
            time.monotonic() - start,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        info("shutting down: draining for up to %.0f s", config.drain_timeout_s)
        drained = server.drain(config.drain_timeout_s)
        info("drained" if drained else "drain timeout: the remaining requests were aborted")
        return 0
    finally:
        server.stop()
        if engine is not None:
            engine.shutdown()


def freeze_startup_heap() -> int:
    """Collect, then move every object alive now (the model, the compiled programs, jax's and the
    libraries' own, about 650,000 with the embedded model) to the collector's permanent
    generation; returns how many. A full collection scans every tracked object and holds the
    interpreter lock meanwhile: with that heap it took about 400 ms (the engine loop and every
    stream stalled), and 0.5 ms once it is frozen (docs/engine.md, "The startup heap"). Once per
    server process, after the engine is ready; objects of the startup heap that later become
    cyclic garbage are not reclaimed, which a heap built once for the process's life does not
    produce."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt()
