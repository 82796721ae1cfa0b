"""A stream's next event on an asyncio loop, without a thread per waiting request.

The HTTP server reads every engine stream this way (``generation``), and so do the benchmarks
that read streams as the server does; this module needs nothing of the HTTP stack, so those
benchmarks run where only the engine's own packages are installed (the GPU check).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from collections.abc import Sequence

from helios_jax.runtime.api import RequestStream, StreamEvent


class Wakeups:
    """One event loop's pending wake-ups. The engine puts a frame's events on their streams,
    then wakes their listeners together (``runtime/publishing.wake``): the listeners of this
    loop (:class:`Listener`) arrive in one :meth:`wake_all`, which schedules one call into the
    loop that wakes every waiting task named: one wake-up of the loop per frame, not one per
    stream. A listener called alone (an event put outside a frame) schedules a call only when
    none is pending."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[asyncio.Event] = []

    def wake_all(self, listeners: Sequence[Listener]) -> None:
        """Any thread: have the loop set every listener's `ready` soon."""
        with self._lock:
            scheduled = bool(self._pending)
            self._pending.extend(listener.ready for listener in listeners)
            if scheduled:
                return  # a call into the loop is already scheduled
        try:
            self.loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    def _run(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for ready in pending:
            ready.set()


class Listener:
    """A waiting task's stream listener: sets `ready` on the task's loop (through its
    :class:`Wakeups`). ``wake_together`` names the group a publisher wakes in one call."""

    __slots__ = ("ready", "wake_together")

    def __init__(self, wakeups: Wakeups, ready: asyncio.Event):
        self.ready = ready
        self.wake_together = wakeups.wake_all

    def __call__(self) -> None:
        self.wake_together((self,))


_WAKEUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wakeups] = weakref.WeakKeyDictionary()


async def next_event(stream: RequestStream) -> StreamEvent:
    """The stream's next event without blocking the event loop and without a thread: a queued
    one at once, else a wait for the stream's listener (called by the engine on every put) to
    wake this task (through the loop's :class:`Wakeups`)."""
    try:
        return stream.get(timeout=0)
    except queue.Empty:
        pass
    loop = asyncio.get_running_loop()
    wakeups = _WAKEUPS.get(loop)
    if wakeups is None:  # created on the loop's own thread
        wakeups = _WAKEUPS[loop] = Wakeups(loop)
    ready = asyncio.Event()
    stream.set_listener(Listener(wakeups, ready))
    try:
        while True:
            try:
                return stream.get(timeout=0)
            except queue.Empty:
                pass
            await ready.wait()
            ready.clear()
    finally:
        stream.set_listener(None)
