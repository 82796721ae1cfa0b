"""Waiting for engine events takes no thread: the stream's listener wakes the waiting task."""

import asyncio
import threading

from helios_jax.runtime.api import RequestStream, StreamEvent
from helios_jax.runtime.publishing import Publisher
from helios_jax.serve.events import next_event


def test_a_thousand_waiting_requests_hold_no_thread_and_each_gets_its_event():
    async def scenario():
        streams = [RequestStream(f"r{i}") for i in range(1000)]
        before = threading.active_count()
        waits = [asyncio.create_task(next_event(s)) for s in streams]
        await asyncio.sleep(0.05)
        assert threading.active_count() == before  # no thread waits on a queue
        assert not any(w.done() for w in waits)

        def produce():
            for s in streams:
                s.put(StreamEvent(text=s.request_id, token_ids=(), finish_reason="stop"))

        producer = threading.Thread(target=produce)
        producer.start()
        events = await asyncio.wait_for(asyncio.gather(*waits), timeout=10)
        producer.join()
        assert [e.text for e in events] == [s.request_id for s in streams]
        assert all(s._listener is None for s in streams)  # removed once served

    asyncio.run(scenario())


def test_an_event_put_before_the_wait_is_taken_at_once_and_a_cancelled_wait_leaves_no_listener():
    async def scenario():
        stream = RequestStream("r")
        stream.put(StreamEvent(text="a", token_ids=()))
        assert (await next_event(stream)).text == "a"
        wait = asyncio.create_task(next_event(stream))
        await asyncio.sleep(0.01)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        assert stream._listener is None
        stream.put(StreamEvent(text="b", token_ids=()))  # nobody listening: just queued
        assert (await next_event(stream)).text == "b"

    asyncio.run(scenario())


def test_a_frames_puts_on_many_streams_wake_the_loop_once():
    """The engine puts a frame's events back to back: one call into the loop wakes every
    waiting request (one loop wake-up per frame, not one per stream)."""

    async def scenario():
        loop = asyncio.get_running_loop()
        streams = [RequestStream(f"r{i}") for i in range(50)]
        waits = [asyncio.create_task(next_event(s)) for s in streams]
        await asyncio.sleep(0.01)
        calls = []
        schedule = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: calls.append(args) or schedule(*args)
        for s in streams:  # the loop runs nothing meanwhile, as while an engine frame publishes
            s.put(StreamEvent(text=s.request_id, token_ids=()))
        events = await asyncio.wait_for(asyncio.gather(*waits), timeout=10)
        assert [e.text for e in events] == [s.request_id for s in streams]
        assert len(calls) == 1
        for s in streams[:3]:  # a later frame: another single call
            wait = asyncio.create_task(next_event(s))
            await asyncio.sleep(0)
            s.put(StreamEvent(text="again", token_ids=()))
            assert (await wait).text == "again"
        assert len(calls) == 4

    asyncio.run(scenario())


def test_a_frame_published_from_the_engines_thread_wakes_the_readers_loop_once():
    """The engine's loop publishes a frame while the readers' loop runs: the frame's readers are
    woken together, one call into their loop, even when that loop runs each call before the
    engine reaches the next stream (forced here: every call into the loop returns only after the
    loop has run it). Woken stream by stream, each would cost another call, as each found the
    loop's pending wake-ups already run."""

    async def scenario():
        loop = asyncio.get_running_loop()
        streams = [RequestStream(f"r{i}") for i in range(20)]
        waits = [asyncio.create_task(next_event(s)) for s in streams]
        await asyncio.sleep(0.01)
        calls = []
        schedule = loop.call_soon_threadsafe

        def eager(callback, *args):
            ran = threading.Event()

            def run():
                callback(*args)
                ran.set()

            calls.append(callback)
            schedule(run)
            assert ran.wait(5)

        loop.call_soon_threadsafe = eager
        publisher = Publisher()

        def produce():
            with publisher.frame():
                for s in streams:
                    publisher.put(s, StreamEvent(text=s.request_id, token_ids=()))

        producer = threading.Thread(target=produce)
        producer.start()
        events = await asyncio.wait_for(asyncio.gather(*waits), timeout=10)
        producer.join()
        assert [e.text for e in events] == [s.request_id for s in streams]
        assert len(calls) == 1

    asyncio.run(scenario())
