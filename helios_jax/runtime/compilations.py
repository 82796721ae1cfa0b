"""Process-wide count of XLA compilations, for the no-recompilation test and /metrics.

The engine compiles its programs ahead of time and warms them up; after that, serving should
never compile again (a compilation is a stall of seconds on a real model). jax reports every
backend compilation through `jax.monitoring` as the duration event
``/jax/core/compile/backend_compile_duration`` (jax 0.4.x through 0.11, `jax._src.dispatch`
``BACKEND_COMPILE_EVENT``), with the compiled function's name as ``fun_name``. That event wraps
both a real XLA compile and a load from the persistent compilation cache: either is a new
executable the process did not have, so both count.

    from helios_jax.runtime import compilations
    before = compilations.compilation_count()
    ...                                   # serve
    assert compilations.compilation_count() == before, compilations.recent_compilations()

`render_compilations()` gives the Prometheus text lines of the counter
``helios_xla_compilations_total``. Counting starts when this module is imported (the listener
is installed then), so import it before the engine compiles to count its start-up too.
"""

from __future__ import annotations

import collections
import threading

from jax import monitoring

try:  # the name jax itself uses, where this jax has it
    from jax._src.dispatch import BACKEND_COMPILE_EVENT
except ImportError:  # pragma: no cover - a jax that moved it
    BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

METRIC = "helios_xla_compilations_total"
_RECENT = 32

_lock = threading.Lock()
_count = 0
_recent: collections.deque[str] = collections.deque(maxlen=_RECENT)


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
    global _count
    if event != BACKEND_COMPILE_EVENT:
        return
    with _lock:
        _count += 1
        _recent.append(str(kwargs.get("fun_name", "?")))


def _installed() -> bool:
    try:
        from jax._src.monitoring import get_event_duration_listeners
    except ImportError:  # pragma: no cover - then trust our own registration
        return _registered
    return _on_duration in get_event_duration_listeners()


_registered = False


def install() -> None:
    """Registers the listener (idempotent; again if `jax.monitoring.clear_event_listeners`
    removed it). Importing this module does it."""
    global _registered
    with _lock:
        if not _installed():
            monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True


def compilation_count() -> int:
    """XLA compilations (and persistent-cache loads) in this process since the import."""
    install()
    with _lock:
        return _count


def recent_compilations() -> list[str]:
    """The names of the last compiled functions, oldest first (at most 32), for diagnostics."""
    with _lock:
        return list(_recent)


def render_compilations() -> str:
    """Prometheus text exposition lines of the counter (HELP, TYPE, sample), newline-ended."""
    return (
        f"# HELP {METRIC} XLA compilations (including persistent compilation cache loads) "
        "since the process started serving.\n"
        f"# TYPE {METRIC} counter\n"
        f"{METRIC} {compilation_count()}\n"
    )


install()
