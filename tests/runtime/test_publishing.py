"""The publisher holds a completion's events and puts them on their streams, in order, at its end."""

import queue

import pytest

from helios_jax.runtime.api import RequestStream, StreamEvent
from helios_jax.runtime.publishing import Publisher


def _events(stream):
    out = []
    while True:
        try:
            out.append(stream.get(timeout=0).text)
        except queue.Empty:
            return out


def test_a_frames_events_reach_their_streams_together_in_order():
    publisher, a, b = Publisher(), RequestStream("a"), RequestStream("b")
    woken = []
    a.set_listener(lambda: woken.append("a"))
    with publisher.frame():
        publisher.put(a, StreamEvent("1", (1,)))
        publisher.put(b, StreamEvent("x", (7,)))
        publisher.put(a, StreamEvent("2", (2,)))
        assert _events(a) == [] and _events(b) == [] and woken == []  # nothing out mid-frame
    assert _events(a) == ["1", "2"] and _events(b) == ["x"] and woken == ["a"]  # woken once, after both
    publisher.put(b, StreamEvent("y", (8,)))  # outside a frame: at once
    assert _events(b) == ["y"]


def test_a_failing_frame_still_puts_what_it_held():
    publisher, a = Publisher(), RequestStream("a")
    with pytest.raises(RuntimeError), publisher.frame():
        publisher.put(a, StreamEvent("1", (1,)))
        raise RuntimeError("completion failed")
    assert _events(a) == ["1"]
