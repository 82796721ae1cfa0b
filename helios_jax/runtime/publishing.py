"""A frame's bursts: each request's stream event, and one publication of all of them.

The engine loop turns a completion's generated tokens into one :class:`StreamEvent` per request
(:func:`burst`: log-probabilities, the grammar, incremental text with stop strings), reports
each visible burst to the scheduler at once (``published_output``, before the next completion),
and hands the events to a :class:`Publisher`. While a completion is processed the publisher holds
the events and puts them on their streams together when it ends, then wakes their readers
(:func:`wake`: the readers of one event loop with one wake-up): a reader woken in the middle of
the frame's host work (a tokenizer call releases the interpreter lock) would take the lock from
the loop once per stream. Held or not, a stream's events keep their order, and every event of a
completion is out before the next completion is processed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from helios_jax.runtime.api import RequestStream, StreamEvent


class Publisher:
    """Puts events on request streams; inside :meth:`frame`, at the frame's end."""

    def __init__(self):
        self._held: list[tuple[RequestStream, StreamEvent]] | None = None

    def put(self, stream: RequestStream, event: StreamEvent) -> None:
        if self._held is None:
            stream.put(event)
        else:
            self._held.append((stream, event))

    @contextlib.contextmanager
    def frame(self):
        """Hold the events put meanwhile; put them all, in order, on leaving (errors included)."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for stream, event in held:
                stream.put(event, notify=False)
            wake(dict.fromkeys(stream.listener for stream, _ in held))  # each read once


def wake(listeners: Iterable[Callable[[], None] | None]) -> None:
    """Call every listener once (None: a stream nobody listens to), after all of a frame's events
    are queued. Listeners that name a ``wake_together`` (one callable for their group: the readers
    of one event loop) are woken by one call of it with all of them: woken one by one, a reader's
    loop may run between two calls (each call into another thread's loop yields the interpreter
    lock), and every such call then costs the engine's loop another wake-up of that thread."""
    groups: dict[Callable, list] = {}
    for listener in listeners:
        if listener is None:
            continue
        together = getattr(listener, "wake_together", None)
        if together is None:
            listener()
        else:
            groups.setdefault(together, []).append(listener)
    for together, members in groups.items():
        together(members)


def burst(active, generated, scores=None) -> tuple[StreamEvent | None, bool]:
    """A request's event for one completion's generated tokens (None: nothing to report, the
    text is held back and no tokens came) and whether its grammar is complete. Updates the
    request's output, token count, grammar and text state (`active`: the engine's record)."""
    tokens = generated.tokens
    sampling = active.request.sampling
    fields = {}
    if sampling.logprobs and tokens:
        if scores is None:
            raise ValueError(f"no log-probabilities for {active.request.request_id}")
        fields = scores.event_fields(len(tokens), sampling.top_logprobs)
    ended = False
    if active.grammar is not None:
        active.grammar.accept(tokens)
        ended = active.grammar.terminated  # the grammar is complete
    active.completion_tokens += len(tokens)
    active.output.extend(tokens)
    text = active.text.feed(tokens, final=generated.finished or ended)
    if not (text or tokens):
        return None, ended
    if active.prompt_scores is not None:
        fields.update(active.prompt_scores.first_event_fields())
    fields["queue_time_s"], active.queue_s = active.queue_s, None  # the first event's only
    prompt = len(active.request.prompt_tokens)
    return StreamEvent(text, tuple(tokens), None, prompt, active.completion_tokens, **fields), ended
