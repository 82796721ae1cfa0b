"""The executor: pack a plan's inputs, dispatch its prepared program, observe completion.

A frame is dispatched asynchronously (JAX returns before the device finishes) and tracked as a
:class:`Dispatch` until the engine loop completes it. No thread watches a frame: the loop itself
observes completion, in fence order, either by waiting on the oldest frame when it has no host
work left (:meth:`Executor.wait_oldest`) or by polling between its host tasks
(:meth:`Executor.poll`). Up to two frames are in flight.

Device intervals (spec, "Duration estimates": host dispatch, completion delivery and polling time
never enter a graph's cost; ARCHITECTURE.md for the queued/isolated split):

- an isolated frame's interval starts when its program call begins (ARCHITECTURE.md: dispatch
  to ready; the inputs are packed before the clock starts, but the call's own host work,
  argument flattening and the transfer of the packed inputs, stays inside: on a CPU the program
  may even run within the call, so its return is no lower bound on the device's start); a frame
  queued behind another starts when its predecessor was observed ready, if that is later;
- it ends when the frame is observed ready. A frame observed by a blocking wait that began
  before it finished is stamped within the wake-up latency. A frame found already finished
  (by a poll, or when the wait began) finished somewhere between the last observation that saw
  it pending and this one: if that window is wider than :data:`STAMP_TOLERANCE_NS` (host work
  ran in between), the interval would carry host time, so the frame reports no device interval
  (the spec's "missing interval": it neither changes an estimate nor makes it fresh). A queued
  frame inherits its predecessor's window, since its start is that stamp.

The host wall interval runs from the program call through observed completion.

Outputs become one :class:`CompletionRecord` per lane, in plan order, plus the confidence sidecar
and the survival rows scattered to request slots, for the scheduler's completion variants.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.programs.processor_packing import ProcessorSettings
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
    coupled: bool = False  # the request set its seed: draws keyed by seed and position
    logprobs: bool = False  # the request wants its generated tokens' scores (programs/scores.py)
    stop_tokens: tuple[int, ...] = ()  # multi-step decode lanes stop after one of these
    copy: tuple[int, ...] | None = None  # the next round's copy proposals; None: learned (copying.py)
    processors: ProcessorSettings | None = None  # logits processors (runtime/sampling_controls.py)


# Widest window between "seen pending" and "seen ready" that still counts as an observation of
# the device's completion (a poll between two host tasks, a wake-up); wider windows hold host work.
STAMP_TOLERANCE_NS = 50_000

# Lane sets whose packed inputs each decode or speculative program keeps on the device: a batch
# split into groups that take turns (two B=8 frames over 16 streams) reuses each group's.
PACKED_PER_PROGRAM = 4


@dataclasses.dataclass
class Dispatch:
    """A dispatched frame awaiting completion: the executor's in-flight record of one plan.

    (The scheduler's ``Frame`` is the committed plan in flight as the scheduler sees it; this
    is its execution: outputs and the timestamps of its observation.)
    """

    fence: int
    plan: ScheduledPlan
    outputs: Any
    called_ns: int  # the program call began: the start of the wall and of an isolated interval
    dispatched_ns: int  # the program call returned
    queued: bool
    predecessor: Dispatch | None
    pending_ns: int = 0  # the last observation that found the frame still running
    ready_ns: int | None = None  # the first observation that found it finished
    error: BaseException | None = None
    checked: bool = False  # the program's completion check ran (Executor._check)

    @property
    def done(self) -> bool:
        return self.ready_ns is not None

    @property
    def stamp_window_ns(self) -> int:
        """How late the ready stamp may be: the gap between the last two observations."""
        return 0 if self.ready_ns is None else self.ready_ns - self.pending_ns

    def timing(self) -> ExecutionTiming:
        ready = self.ready_ns if self.ready_ns is not None else self.dispatched_ns
        start, window = self.called_ns, self.stamp_window_ns
        before = self.predecessor
        if self.queued and before is not None and before.ready_ns is not None and before.ready_ns > start:
            start, window = before.ready_ns, window + before.stamp_window_ns
        device = max(ready - start, 0) if window <= STAMP_TOLERANCE_NS else 0
        return ExecutionTiming((float(device),), float(max(ready - self.called_ns, 0)), queued=self.queued)


def pack_inputs(program, plan: ScheduledPlan, info: Mapping[int, RequestInputs], token_masks=None):
    """Host data of a plan's lanes -> the program's inputs (``programs.packing`` validates).
    `token_masks`: lane index -> i32 words (``programs/token_mask.py``) for the sampling programs."""
    kind = plan.graph.kind
    masks = {} if token_masks is None else {"token_masks": token_masks}
    lanes = plan.lanes
    req = [info[each.handle.rid] for each in lanes]
    if kind.is_prefill:  # one chunk per prompt row (B-row prefill: several)
        return program.pack(
            slots=[each.slot for each in lanes],
            chunks=[
                r.prompt[each.prompt_start : each.prompt_start + each.prompt_tokens]
                for each, r in zip(lanes, req)
            ],
            page_tables=[r.page_table for r in req],
            prompt_ends=[each.finishes_prompt for each in lanes],
            **masks,
        )
    if kind is GraphKind.INITIALIZE:
        return _initialize_inputs(program, [each.slot for each in lanes], req)
    slots = [each.slot for each in lanes]
    tables = [r.page_table for r in req]
    if plan.graph.steps > 1:  # K-step decode or width one: each lane's steps and stop tokens
        steps = [each.ceiling for each in lanes]
        return program.pack(
            slots=slots, page_tables=tables, steps=steps, stop_tokens=[r.stop_tokens for r in req]
        )
    if kind is GraphKind.DECODE:
        return program.pack(slots=slots, page_tables=tables, **masks)
    if kind is GraphKind.SPECULATIVE:
        copies = copy_proposals(req, plan.graph.proposal_depth)
        if plan.graph.allocation is Allocation.PREFIX_LIMIT:
            ceilings = [each.ceiling for each in lanes]
            return program.pack(
                slots=slots, page_tables=tables, ceilings=ceilings, copy_proposals=copies, **masks
            )
        lengths = [each.query_length for each in lanes]
        return program.pack(
            slots=slots, page_tables=tables, query_lengths=lengths, copy_proposals=copies, **masks
        )
    if kind is GraphKind.MIXED:
        return _pack_mixed(program, plan, req, slots, tables, masks)
    raise ValueError(f"{kind.value} programs need the executor's state copies (images are not served)")


def _pack_mixed(program, plan: ScheduledPlan, req: list[RequestInputs], slots, tables, masks: dict):
    """A mixed plan's inputs: the prompt row's chunk, the decode rows' query lengths."""
    lanes = plan.lanes
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
        copy_proposals=copy_proposals(req, plan.graph.token_capacity - 1, row),
        **masks,
    )


def _initialize_inputs(program, slots: list[int], req: list[RequestInputs]):
    """The `initialize` program's inputs: each request's sampling settings and processors."""
    return program.pack(
        slots=slots,
        temperature=[r.temperature for r in req],
        top_p=[r.top_p for r in req],
        top_k=[r.top_k for r in req],
        seeds=[r.seed for r in req],
        coupled=[r.coupled for r in req],
        logprobs=[r.logprobs for r in req],
        processors=[r.processors for r in req],
    )


def copy_proposals(req, depth: int, prompt_row: int | None = None):
    """Per lane its copy proposals cut to the program's `depth` (None: learned, and the prompt
    row's); None when no lane copies."""
    if all(r.copy is None for r in req):
        return None
    return [None if r.copy is None or i == prompt_row else r.copy[:depth] for i, r in enumerate(req)]


def _ints(values) -> list:
    """An output array as (nested) Python ints, converted once."""
    array = np.asarray(values)
    return (array if array.dtype.kind in "iub" else array.astype(np.int64)).tolist()


def completion_records(plan: ScheduledPlan, outputs) -> list[CompletionRecord]:
    """One record per lane, in plan order, from a program's outputs (numpy-convertible). The
    arrays become Python lists once (``tolist``), not element by element."""
    if outputs is None or plan.graph.kind.is_state_operation:
        return [CompletionRecord(lane.handle, lane.epoch) for lane in plan.lanes]
    tokens, counts = _ints(outputs.tokens), _ints(outputs.counts)
    if plan.graph.kind.is_prefill:  # row b: its chunk, and its first output token if it ended the prompt
        return [
            CompletionRecord(
                lane.handle,
                lane.epoch,
                prompt_tokens=lane.prompt_tokens,
                tokens=(int(tokens[b]),) if int(counts[b]) else (),
            )
            for b, lane in enumerate(plan.lanes)
        ]
    query = _ints(outputs.query_lengths) if hasattr(outputs, "query_lengths") else None
    single = plan.graph.steps == 1  # K-step programs verify no proposals
    out = []
    for b, lane in enumerate(plan.lanes):
        role = lane.role
        if role is LaneRole.DECODE:
            n = int(counts[b])
            rows = int(query[b]) if query is not None else 1
            out.append(
                CompletionRecord(
                    lane.handle,
                    lane.epoch,
                    tokens=tuple(tokens[b][:n]),
                    offered=rows - 1,
                    accepted=n - 1 if single else 0,
                )
            )
        elif role is LaneRole.PROMPT:
            n = int(counts[b])
            out.append(
                CompletionRecord(
                    lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens, tokens=tuple(tokens[b][:n])
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


def _to_device(leaf):
    return jax.device_put(leaf) if isinstance(leaf, np.ndarray) else leaf


# Output fields the engine reads only for some frames: scores when a lane asked for them, the
# sidecar and survival rows after a round with proposals (RoundOutputs, PrefillOutputs).
SCORE_FIELDS = frozenset({"logprobs", "top_logprobs", "top_tokens"})
PROPOSAL_FIELDS = frozenset({"sidecar", "survival"})


def unread_fields(plan: ScheduledPlan, info: Mapping[int, RequestInputs]) -> frozenset[str]:
    """Output fields the engine will not read for `plan`: no copy to the host is started for
    them (one read anyway copies synchronously)."""
    unread = frozenset()
    if not any(getattr(info.get(lane.handle.rid), "logprobs", True) for lane in plan.lanes):
        unread |= SCORE_FIELDS
    graph = plan.graph
    if graph.kind not in (GraphKind.SPECULATIVE, GraphKind.MIXED) or graph.proposal_depth <= 0:
        unread |= PROPOSAL_FIELDS
    return unread


def _copy_to_host_async(outputs, unread: frozenset[str] = frozenset()) -> None:
    if unread and dataclasses.is_dataclass(outputs):
        fields = dataclasses.fields(outputs)
        outputs = [getattr(outputs, f.name) for f in fields if f.name not in unread]
    for leaf in jax.tree_util.tree_leaves(outputs):
        if isinstance(leaf, jax.Array):
            leaf.copy_to_host_async()


def outputs_ready(outputs) -> bool:
    """Whether every device array of `outputs` is ready (a non-blocking check)."""
    return all(leaf.is_ready() for leaf in jax.tree_util.tree_leaves(outputs) if isinstance(leaf, jax.Array))


class Executor:
    """Dispatches plans onto prepared programs over one donated device state.

    A program may define ``wait(outputs)`` (block until done) and ``is_ready(outputs)`` (poll);
    the defaults are ``jax.block_until_ready`` and :func:`outputs_ready`. Test fakes without
    ``is_ready`` are observed only by blocking waits.
    """

    def __init__(
        self,
        programs: Mapping,
        params,
        state,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        copies: Callable | None = None,
    ):
        self.programs = programs
        # Snapshot and restore inputs: (program, plan, request inputs) -> the copy's inputs
        # (``runtime.state_copies.StateCopies.pack``: they need the checkpoint rows' geometry).
        self.copies = copies
        self.params = params
        self.state = state
        self.clock = clock
        self.inflight: list[Dispatch] = []
        self.history: collections.deque = collections.deque(maxlen=1024)  # (graph, ExecutionTiming)
        self.graph_counts: dict[str, int] = {}
        self.graph_ns: dict[str, int] = {}  # device time of the executions with an interval
        self.graph_timed: dict[str, int] = {}  # those executions (graph_ns / graph_timed: a mean)
        self.observations = {"waited": 0, "polled": 0, "late": 0, "missing_interval": 0}
        # Per generation program: its last lane sets, oldest first, with their request inputs
        # and packed inputs on the device.
        self._packed: dict[Any, collections.OrderedDict] = {}

    def _inputs(self, program, plan: ScheduledPlan, info: Mapping[int, RequestInputs], token_masks=None):
        """The program's inputs, on the device. Decode and speculative inputs (slots, page tables,
        query lengths or ceilings) depend only on the lanes and their requests' fixed host data,
        so while the same lanes run the same program (every step of a steady batch, or a batch
        split into a few groups that take turns) the packed inputs of one of the last
        `PACKED_PER_PROGRAM` lane sets are reused: nothing is packed or transferred again. Token
        masks change every step: a frame with any is packed afresh."""
        if plan.graph.kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE) and self.copies is not None:
            return self.copies(program, plan, info)
        if token_masks:
            return pack_inputs(program, plan, info, token_masks=token_masks)
        if plan.graph.kind not in (GraphKind.DECODE, GraphKind.SPECULATIVE):
            return pack_inputs(program, plan, info)
        lanes = plan.lanes
        key = tuple((lane.handle.rid, lane.slot, lane.query_length, lane.ceiling) for lane in lanes)
        held = tuple(info[lane.handle.rid] for lane in lanes)
        recent = self._packed.setdefault(plan.graph.key, collections.OrderedDict())
        entry = recent.get(key)
        if entry is not None and all(a is b for a, b in zip(entry[0], held)):
            recent.move_to_end(key)
            return entry[1]
        inputs = jax.tree_util.tree_map(_to_device, pack_inputs(program, plan, info))
        recent[key] = (held, inputs)  # the request inputs held: identity, not equality, is compared
        recent.move_to_end(key)
        if len(recent) > PACKED_PER_PROGRAM:
            recent.popitem(last=False)
        return inputs

    def pack(self, plan: ScheduledPlan, info: Mapping[int, RequestInputs], token_masks=None):
        """The plan's program inputs (`dispatch` packs them itself when given none). Raises what
        packing raises, before anything is dispatched: the engine packs ahead of committing.
        `token_masks`: lane index -> i32 words of the lanes whose sample is restricted."""
        return self._inputs(self.programs[plan.graph.key], plan, info, token_masks)

    def reset(self, state) -> None:
        """A failed program left the donated state unusable: serve on `state`, nothing in flight."""
        self.state = state
        self.inflight.clear()
        self._packed.clear()

    def dispatch(
        self, plan: ScheduledPlan, fence: int, info: Mapping[int, RequestInputs], inputs=None
    ) -> Dispatch:
        program = self.programs[plan.graph.key]
        if inputs is None:
            inputs = self._inputs(program, plan, info)
        predecessor = self.inflight[-1] if self.inflight else None
        called = self.clock()
        self.state, outputs = program(self.params, self.state, inputs)
        dispatched = self.clock()
        # The host reads them at completion: start the copy of the fields it will read now.
        _copy_to_host_async(outputs, unread_fields(plan, info))
        frame = Dispatch(
            fence,
            plan,
            outputs,
            called,
            dispatched,
            queued=predecessor is not None,
            predecessor=predecessor,
            pending_ns=dispatched,
        )
        self.inflight.append(frame)
        return frame

    def _is_ready(self, frame: Dispatch) -> bool:
        is_ready = getattr(self.programs[frame.plan.graph.key], "is_ready", None)
        if is_ready is None and not hasattr(self.programs[frame.plan.graph.key], "wait"):
            is_ready = outputs_ready
        return bool(is_ready(frame.outputs)) if is_ready is not None else False

    def poll(self) -> int:
        """Stamp the frames that finished since the last observation; returns how many frames
        at the head of the window are done. Frames finish in fence order, so the first pending
        frame ends the scan."""
        done = 0
        for frame in self.inflight:
            if frame.ready_ns is None:
                now = self.clock()
                if not self._is_ready(frame):
                    frame.pending_ns = now
                    break
                frame.ready_ns = now
                self.observations["polled"] += 1
                self._check(frame)
            done += 1
        return done

    def wait_oldest(self) -> Dispatch:
        """Block until the oldest frame in flight finishes; stamp it. A failed program leaves
        its error on the frame (the engine fails that frame's requests)."""
        frame = self.inflight[0]
        wait = getattr(self.programs[frame.plan.graph.key], "wait", jax.block_until_ready)
        if frame.ready_ns is None and self._is_ready(frame):
            frame.ready_ns = self.clock()  # finished while the host was busy: a late stamp
            self.observations["late"] += 1
        try:
            wait(frame.outputs)  # returns at once when done; raises a failed program's error
        except BaseException as e:  # reported to the engine loop, which fails the frame's requests
            frame.error = e
        if frame.ready_ns is None:
            frame.ready_ns = frame.pending_ns = self.clock()
            self.observations["waited"] += 1
        self._check(frame)
        return frame

    def _check(self, frame: Dispatch) -> None:
        """A program may define ``check(outputs)``: run once its frame is stamped ready (so its
        host work stays out of the device interval); what it raises fails the frame. Several
        processes: the ranks' committed tokens agree (``distributed/leader.py``)."""
        check = getattr(self.programs[frame.plan.graph.key], "check", None)
        if check is None or frame.error is not None or frame.checked:
            return
        frame.checked = True
        try:
            check(frame.outputs)
        except Exception as e:  # reported to the engine loop, which fails the frame's requests
            frame.error = e

    def retire(self, frame: Dispatch) -> None:
        """The engine processed `frame`'s completion."""
        self.inflight.remove(frame)
        name = frame.plan.graph.name
        t = frame.timing()
        if not t.device_ns:
            self.observations["missing_interval"] += 1
        self.history.append((frame.plan.graph, t))
        self.graph_counts[name] = self.graph_counts.get(name, 0) + 1
        self.graph_ns[name] = self.graph_ns.get(name, 0) + int(max(t.device_intervals_ns))
        self.graph_timed[name] = self.graph_timed.get(name, 0) + bool(t.device_ns)
