"""Runtime phase tests with fake programs of known duration on a serial fake device.

The fake device runs one program at a time, each for exactly its catalog duration scaled to
milliseconds; a program dispatched while another runs starts when that one finishes. Outputs
are derivable on paper: every decode row emits token 7 and accepts nothing.
"""

import dataclasses
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.detokenize import TextStream
from helios_jax.runtime.engine import HeliosEngine

from .helpers import tokenizer

spec = pytest.mark.spec
SCALE_MS = 20.0  # every fake program runs 20 ms x its kind's factor


class FakeDevice:
    """Serial execution with a log of (kind, dispatched, started, finished) in seconds."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free_at = 0.0
        self.log = []

    def run(self, kind, duration):
        with self.lock:
            dispatched = time.perf_counter()
            start = max(dispatched, self.free_at)
            self.free_at = start + duration
            entry = [kind, dispatched, start, self.free_at]
            self.log.append(entry)
        return entry


class FakeOutputs(SimpleNamespace):
    pass


@dataclasses.dataclass
class FakeProgram:
    descriptor: object
    device: FakeDevice
    lanes: int

    @property
    def shape(self):
        return SimpleNamespace(kind=self.descriptor.kind)

    def pack(self, **host):
        return host

    def __call__(self, params, state, inputs):
        kind = self.descriptor.kind
        factor = 2.0 if kind in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL, GraphKind.MIXED) else 1.0
        entry = self.device.run(kind, SCALE_MS * factor / 1000)
        b = self.lanes
        if kind.is_state_operation:
            out = FakeOutputs()
        elif kind.is_prefill:
            out = FakeOutputs(
                tokens=np.array([7]),
                counts=np.array([1 if inputs["prompt_ends"] else 0]),
                prompt_logprobs=None,
            )
        else:
            rows = inputs.get("query_lengths") or inputs.get("ceilings") or [1] * len(inputs["slots"])
            counts = np.zeros(b, np.int32)
            counts[: len(rows)] = 1
            out = FakeOutputs(
                tokens=np.full((b, 8), 7),
                counts=counts,
                query_lengths=np.array(list(rows) + [0] * (b - len(rows))),
                sidecar=np.zeros((2, 4, max(1, self.descriptor.proposal_depth)), np.float32),
                survival=np.zeros((b, 7), np.float32),
            )
        out.entry = entry
        return state, out

    def is_ready(self, outputs):
        return time.perf_counter() >= outputs.entry[3]

    def wait(self, outputs):
        # Sleep to just before the end, then spin: a sleep alone may wake milliseconds late on a
        # loaded machine, and the stamp would carry that delay as device time.
        delay = outputs.entry[3] - time.perf_counter() - 0.002
        if delay > 0:
            time.sleep(delay)
        while time.perf_counter() < outputs.entry[3]:
            pass


class FakeSet(dict):
    def init_state(self):
        return None


def fake_engine(speculation="off"):
    ec = EngineConfig(
        request_slots=4,
        prefill_chunks=(64, 256),
        speculation=speculation,
        draft_tokens=0 if speculation == "off" else 3,
        max_model_len=512,
    )
    device = FakeDevice()
    programs = FakeSet({g.key: FakeProgram(g, device, g.batch_capacity) for g in ec.catalog().graphs})
    engine = HeliosEngine(
        model_config=None, params=None, tokenizer=tokenizer(), engine_config=ec, programs=programs
    )
    return engine, device


@spec(
    "verification/runtime-phase-coverage",
    "planning-queue/two-slots",
    "planning-queue/double-occupancy",
    "planning-queue/draining-kinds",
)
def test_decode_frames_overlap_and_drain_only_frames_never_do():
    engine, device = fake_engine()
    try:
        streams = [
            engine.submit(GenerationRequest(f"r{i}", (5,) * 20, SamplingParams(max_tokens=30, temperature=0)))
            for i in range(2)
        ]
        for s in streams:
            list(s)
    finally:
        engine.shutdown()
    log = device.log
    overlapped = [e for e in log if e[2] > e[1] + 1e-4]  # dispatched while the device was busy
    assert overlapped and all(e[0] is GraphKind.DECODE for e in overlapped)
    for prev, e in zip(log, log[1:]):
        if e[0] is not GraphKind.DECODE or prev[0] is not GraphKind.DECODE:
            assert e[1] >= prev[3] - 1e-3  # drain-only kinds are dispatched only on an empty window


@spec("verification/runtime-phase-coverage", "service-accounting/queued-interval")
def test_a_queued_frames_interval_starts_at_its_predecessors_completion():
    engine, device = fake_engine()
    try:
        list(engine.submit(GenerationRequest("q", (5,) * 20, SamplingParams(max_tokens=12, temperature=0))))
    finally:
        engine.shutdown()
    # Frames found finished after host work ran past their end report no interval (tested in
    # test_observation.py); on a loaded machine some do.
    queued = [t for _, t in engine.executor.history if t.queued and t.device_ns > 0]
    assert queued
    # Its own 20 ms run, measured from the predecessor's completion: the time it waited behind
    # the predecessor is in the wall interval, not in the device interval. (The median: a thread
    # descheduled on a loaded machine stamps a predecessor late now and then.)
    assert all(t.device_intervals_ns[0] <= t.wall_ns for t in queued)
    intervals = sorted(t.device_intervals_ns[0] for t in queued)
    assert 0.8 * SCALE_MS * 1e6 <= intervals[len(intervals) // 2] <= 1.5 * SCALE_MS * 1e6
    assert any(t.wall_ns > 1.5 * t.device_intervals_ns[0] for t in queued)


@spec("service-accounting/postponed-output", "verification/runtime-phase-coverage")
def test_stop_buffering():
    pieces = {1: "Hel", 2: "lo, ", 3: "wor", 4: "ld", 5: "END", 6: "!"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    stream = TextStream(decode, stop=("lo, w", "END"))
    assert stream.feed([1]) == "He"  # the "l" could begin the stop string "lo, w": held back
    assert stream.feed([2]) == "l"  # "Hello, ": now "lo, " is what could begin it
    assert stream.feed([3]) == "" and stream.stopped  # "lo, w" appeared: "Hel" was the last text
    other = TextStream(decode, stop=("END",))
    assert other.feed([1, 2, 3, 4]) == "Hello, world"
    assert other.feed([5, 6]) == "" and other.stopped
    held = TextStream(decode, stop=("ld!",))
    assert held.feed([3, 4]) == "wor"  # "ld" may begin "ld!"
    assert held.feed([], final=True) == "ld"  # released when the request ends
