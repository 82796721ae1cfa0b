"""The executor: pack a plan's inputs, dispatch its prepared program, observe completion.

A frame is dispatched asynchronously (JAX returns before the device finishes) and tracked as a
:class:`Dispatch` until it completes; a waiter thread observes its completion
(``block_until_ready``) and stamps the time. Up to two frames are in flight. Device intervals
follow ARCHITECTURE.md: an isolated frame's interval runs from dispatch to ready; a queued frame's
from its predecessor's completion to ready (the waiter of a queued frame first waits for its
predecessor's stamp, so stamps are ordered). The host wall interval
runs from dispatch through observed completion. Host packing and polling stay outside both.

Outputs become one :class:`CompletionRecord` per lane, in plan order, plus the confidence sidecar
and the survival rows scattered to request slots, for the scheduler's completion variants.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming, ScheduledPlan
from helios_jax.scheduler.view import LaneRole


@dataclasses.dataclass(frozen=True)
class RequestInputs:
    """Per-request host data a program needs, looked up by request id."""

    prompt: tuple[int, ...]
    page_table: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop_tokens: tuple[int, ...] = ()  # multi-step decode lanes stop after one of these


@dataclasses.dataclass
class Dispatch:
    """A dispatched frame awaiting completion: the executor's in-flight record of one plan.

    (The scheduler's ``Frame`` is the committed plan in flight as the scheduler sees it; this
    is its execution: outputs, timestamps and the completion event.)
    """

    fence: int
    plan: ScheduledPlan
    outputs: Any
    dispatched_ns: int
    queued: bool
    predecessor: Dispatch | None
    ready_ns: int | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None

    def timing(self) -> ExecutionTiming:
        ready = self.ready_ns if self.ready_ns is not None else self.dispatched_ns
        start = self.dispatched_ns
        if self.queued and self.predecessor is not None and self.predecessor.ready_ns is not None:
            start = max(start, self.predecessor.ready_ns)
        return ExecutionTiming(
            (float(max(ready - start, 0)),), float(max(ready - self.dispatched_ns, 0)), queued=self.queued
        )


def pack_inputs(program, plan: ScheduledPlan, info: Mapping[int, RequestInputs]):
    """Host data of a plan's lanes -> the program's inputs (``programs.packing`` validates)."""
    kind = plan.graph.kind
    lanes = plan.lanes
    req = [info[each.handle.rid] for each in lanes]
    if kind.is_prefill:
        lane = lanes[0]
        tokens = req[0].prompt[lane.prompt_start : lane.prompt_start + lane.prompt_tokens]
        return program.pack(
            slot=lane.slot, tokens=tokens, page_table=req[0].page_table, prompt_ends=lane.finishes_prompt
        )
    if kind is GraphKind.INITIALIZE:
        return program.pack(
            slots=[each.slot for each in lanes],
            temperature=[r.temperature for r in req],
            top_p=[r.top_p for r in req],
            top_k=[r.top_k for r in req],
            seeds=[r.seed for r in req],
        )
    slots = [each.slot for each in lanes]
    tables = [r.page_table for r in req]
    if kind is GraphKind.DECODE and plan.graph.steps > 1:  # each lane's steps and stop tokens
        steps = [each.ceiling for each in lanes]
        return program.pack(
            slots=slots, page_tables=tables, steps=steps, stop_tokens=[r.stop_tokens for r in req]
        )
    if kind is GraphKind.DECODE:
        return program.pack(slots=slots, page_tables=tables)
    if kind is GraphKind.SPECULATIVE:
        if plan.graph.allocation is Allocation.PREFIX_LIMIT:
            return program.pack(slots=slots, page_tables=tables, ceilings=[each.ceiling for each in lanes])
        return program.pack(
            slots=slots, page_tables=tables, query_lengths=[each.query_length for each in lanes]
        )
    if kind is GraphKind.MIXED:
        row = plan.prefill_row
        lengths = [each.prompt_tokens if i == row else each.query_length for i, each in enumerate(lanes)]
        prompt = ()
        ends = False
        if row is not None:
            lane = lanes[row]
            prompt = req[row].prompt[lane.prompt_start : lane.prompt_start + lane.prompt_tokens]
            ends = lane.finishes_prompt
        return program.pack(
            slots=slots,
            page_tables=tables,
            query_lengths=lengths,
            prefill_row=row,
            prompt_tokens=prompt,
            prompt_ends=ends,
        )
    raise ValueError(f"the engine does not run {kind.value} programs (checkpoints and images are off)")


def completion_records(plan: ScheduledPlan, outputs) -> list[CompletionRecord]:
    """One record per lane, in plan order, from a program's outputs (numpy-convertible)."""
    if outputs is None or plan.graph.kind.is_state_operation:
        return [CompletionRecord(lane.handle, lane.epoch) for lane in plan.lanes]
    tokens = np.asarray(outputs.tokens)
    counts = np.asarray(outputs.counts)
    out = []
    if plan.graph.kind.is_prefill:
        lane = plan.lanes[0]
        emitted = (int(tokens[0]),) if int(counts[0]) else ()
        return [CompletionRecord(lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens, tokens=emitted)]
    query = np.asarray(outputs.query_lengths) if hasattr(outputs, "query_lengths") else None
    for b, lane in enumerate(plan.lanes):
        if lane.role is LaneRole.PROMPT:
            n = int(counts[b])
            out.append(
                CompletionRecord(
                    lane.handle,
                    lane.epoch,
                    prompt_tokens=lane.prompt_tokens,
                    tokens=tuple(int(t) for t in tokens[b, :n]),
                )
            )
        elif lane.role is LaneRole.DECODE:
            n = int(counts[b])
            rows = int(query[b]) if query is not None else 1
            out.append(
                CompletionRecord(
                    lane.handle,
                    lane.epoch,
                    tokens=tuple(int(t) for t in tokens[b, :n]),
                    offered=rows - 1,
                    accepted=n - 1 if plan.graph.steps == 1 else 0,  # K steps verify no proposals
                )
            )
        else:
            out.append(CompletionRecord(lane.handle, lane.epoch))
    return out


def survival_rows(plan: ScheduledPlan, outputs, request_slots: int, depth: int) -> np.ndarray | None:
    """completion_speculative_survival scattered from lanes to request slots [S, depth]."""
    if getattr(outputs, "survival", None) is None or depth <= 0:
        return None
    lanes = np.asarray(outputs.survival)
    rows = np.zeros((request_slots, depth), np.float32)
    for b, lane in enumerate(plan.lanes):
        if lane.role is LaneRole.DECODE and lanes.shape[1]:
            n = min(lanes.shape[1], depth)
            rows[lane.slot, :n] = lanes[b, :n]
    return rows


class Executor:
    """Dispatches plans onto prepared programs over one donated device state."""

    def __init__(
        self,
        programs: Mapping,
        params,
        state,
        *,
        on_ready: Callable[[Dispatch], None],
        clock: Callable[[], int] = time.perf_counter_ns,
    ):
        self.programs = programs
        self.params = params
        self.state = state
        self.on_ready = on_ready
        self.clock = clock
        self.inflight: list[Dispatch] = []
        self.history: collections.deque = collections.deque(maxlen=1024)  # (graph, ExecutionTiming)
        self.graph_counts: dict[str, int] = {}
        self.graph_ns: dict[str, int] = {}

    def dispatch(self, plan: ScheduledPlan, fence: int, info: Mapping[int, RequestInputs]) -> Dispatch:
        program = self.programs[plan.graph.key]
        inputs = pack_inputs(program, plan, info)
        predecessor = self.inflight[-1] if self.inflight else None
        dispatched = self.clock()
        self.state, outputs = program(self.params, self.state, inputs)
        dispatched_frame = Dispatch(
            fence, plan, outputs, dispatched, queued=predecessor is not None, predecessor=predecessor
        )
        self.inflight.append(dispatched_frame)
        wait = getattr(program, "wait", jax.block_until_ready)
        threading.Thread(
            target=self._watch, args=(dispatched_frame, wait), daemon=True, name=f"helios-frame-{fence}"
        ).start()
        return dispatched_frame

    def _watch(self, dispatched: Dispatch, wait) -> None:
        try:
            if dispatched.predecessor is not None:
                dispatched.predecessor.done.wait()
            wait(dispatched.outputs)
        except BaseException as e:  # reported to the engine loop, which fails the frame's requests
            dispatched.error = e
        dispatched.ready_ns = self.clock()
        dispatched.done.set()
        self.on_ready(dispatched)

    def retire(self, dispatched: Dispatch) -> None:
        """The engine processed `dispatched`'s completion."""
        self.inflight.remove(dispatched)
        name = dispatched.plan.graph.name
        t = dispatched.timing()
        self.history.append((dispatched.plan.graph, t))
        self.graph_counts[name] = self.graph_counts.get(name, 0) + 1
        self.graph_ns[name] = self.graph_ns.get(name, 0) + int(max(t.device_intervals_ns))
