"""Plain data crossing the scheduler's boundary: plans in, completion records and timing out.

The engine never reaches into the scheduler: it receives a frozen :class:`ScheduledPlan` from
``plan()``, submits it with ``commit(plan, fence)``, runs the prepared program and reports back
one :class:`CompletionRecord` per lane (in plan order) with an :class:`ExecutionTiming`.

The scheduler's own records of a plan live here too: a committed plan in flight is a
:class:`Frame`, the latest completion a :class:`Completed`, and :func:`validate_completion`
checks a completion's records, timing and sidecars against its frame before any state changes.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.view import Candidate, LaneRole

if TYPE_CHECKING:  # the request records, which import this module
    from helios_jax.scheduler.requests import Request


class ExecutionClass(str, enum.Enum):
    """How an execution is accounted (helios_scheduler_executions_total{class=...})."""

    ORDINARY = "ordinary"
    DISCOVERY = "discovery"
    TIMING_REFRESH = "timing_refresh"
    ACCEPTANCE_LEARNING = "acceptance_learning"


@dataclasses.dataclass(frozen=True, order=True)
class Handle:
    """A request's identity: slot reuse bumps the generation, so a stale handle never matches."""

    rid: int
    generation: int


@dataclasses.dataclass(frozen=True)
class PlanLane:
    """One lane of a plan: the logical work frozen for one request."""

    handle: Handle
    slot: int
    epoch: int
    role: LaneRole
    prompt_tokens: int = 0  # PROMPT: prompt tokens this execution consumes
    prompt_start: int = 0  # PROMPT: first prompt position consumed
    query_length: int = 0  # DECODE, host binding: target rows including the pending token
    ceiling: int = 0  # DECODE, device binding: immutable row ceiling
    expected_tokens: float = 0.0
    finishes_prompt: bool = False  # PROMPT: this chunk emits the first output token
    snapshot_row: int | None = None  # PREREQUISITE/TERMINAL snapshot destination or source
    images: tuple[int, ...] = ()  # VISION: the request's image indices this execution encodes
    feature_offset: int = 0  # VISION: where they go in the window's compact feature storage


@dataclasses.dataclass(frozen=True)
class ScheduledPlan:
    """A frozen decision: physical shape, lanes, epochs, decode mode, duration and score."""

    graph: GraphDescriptor
    lanes: tuple[PlanLane, ...]
    decode_mode: DecodeMode
    expected_duration_ms: float | None  # None: indeterminate (discovery)
    value_rate: float
    log_scale: float
    reason: ExecutionClass
    exploration_credit_ms: float  # the ledger balance that funded a refresh or probe (0 otherwise)
    needs_empty_window: bool  # submit only when nothing is queued (then replan)
    planned_at_ns: int
    planning_start_ns: int  # now, or the expected end of queued work
    following: Candidate | None = None  # lookahead only; never executed from this plan

    def selection_value_rate(self) -> float:
        """The decision-wide scaled score (value per ms, or value for an indeterminate plan)."""
        return self.value_rate

    def selection_log_scale(self) -> float:
        """log of the decision's shared scaling factor: unscaled = value_rate * exp(log_scale)."""
        return self.log_scale

    @property
    def kind(self) -> GraphKind:
        return self.graph.kind

    @property
    def prefill_row(self) -> int | None:
        """The prompt row's index in the dense lane list (mixed programs), or None."""
        for i, lane in enumerate(self.lanes):
            if lane.role is LaneRole.PROMPT:
                return i
        return None

    @property
    def handles(self) -> tuple[Handle, ...]:
        return tuple(lane.handle for lane in self.lanes)

    def max_advance(self, lane: PlanLane) -> int:
        """Upper bound on the tokens `lane` commits: a queued speculative lane advances by at
        most min(lane ceiling, P), a prompt lane by its first output token when it finishes."""
        if lane.role is LaneRole.PROMPT:
            return 1 if lane.finishes_prompt else 0
        if lane.role is LaneRole.DECODE and self.graph.steps > 1:
            return lane.ceiling  # a K-step decode lane: its steps
        if lane.role is LaneRole.DECODE:
            return min(max(lane.query_length, lane.ceiling), max(self.graph.target_capacity, 1))
        return 0


@dataclasses.dataclass(frozen=True)
class CompletionRecord:
    """What one lane of a completed program produced, reported in plan order.

    - PROMPT lanes report the prompt tokens consumed (must equal the plan) and, when the chunk
      finishes the prompt, the first output token in ``tokens``.
    - DECODE lanes report the committed tokens (accepted proposals plus the replacement or bonus
      token) in ``tokens``, the proposals offered for verification (``offered``, device binding:
      the rows the device allocated minus one) and accepted (``accepted``).
    - TERMINAL and PREREQUISITE lanes report nothing but their identity.
    """

    handle: Handle
    epoch: int
    prompt_tokens: int = 0
    tokens: tuple[int, ...] = ()
    offered: int = 0
    accepted: int = 0


@dataclasses.dataclass(frozen=True)
class ExecutionTiming:
    """Measured intervals of one execution (nanoseconds).

    device_intervals_ns: rank-local device intervals (one per rank); zero or missing when unknown.
    wall_ns: host wall interval from dispatch through observed completion.
    queued: whether the frame ran behind another frame (its device interval then starts at the
      predecessor's completion).
    readiness_delay_ns: exposed embedding-readiness delay, subtracted from the cost sample only.
    """

    device_intervals_ns: tuple[float, ...]
    wall_ns: float
    queued: bool = False
    readiness_delay_ns: float = 0.0

    @property
    def device_ns(self) -> float:
        return max((x for x in self.device_intervals_ns if x and x > 0), default=0.0)

    @property
    def service_interval_ns(self) -> float:
        """One measured interval: max device interval if queued, else max(device, wall)."""
        return self.device_ns if self.queued else max(self.device_ns, self.wall_ns)


@dataclasses.dataclass(frozen=True)
class GeneratedToken:
    """Tokens a completion committed for one request, for the engine to detokenize and publish."""

    handle: Handle
    tokens: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # "stop", "length" or None


@dataclasses.dataclass(frozen=True)
class TraceRecord:
    """Attached to each committed plan (spec: trace fields)."""

    fence: int
    kind: GraphKind
    batch_capacity: int
    proposal_depth: int
    token_capacity: int
    target_capacity: int
    selected_cost_ms: float | None
    observation_age_ns: int | None
    reason: ExecutionClass
    exploration_credit_ms: float
    served: int

    @classmethod
    def of(cls, fence: int, plan: ScheduledPlan, observation_age_ns: int | None) -> TraceRecord:
        g = plan.graph
        return cls(
            fence=fence,
            kind=g.kind,
            batch_capacity=g.batch_capacity,
            proposal_depth=g.proposal_depth,
            token_capacity=g.token_capacity,
            target_capacity=g.target_capacity,
            selected_cost_ms=plan.expected_duration_ms,
            observation_age_ns=observation_age_ns,
            reason=plan.reason,
            exploration_credit_ms=plan.exploration_credit_ms,
            served=len(plan.lanes),
        )


def validate_probabilities(name: str, values: np.ndarray) -> None:
    if np.any(~np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        raise ValueError(f"{name} must hold probabilities in [0, 1]")


class PlanRejected(RuntimeError):
    """commit() refused a plan: stale epochs, lost ownership, a full window or a dependency."""


def check_commit(
    plan: ScheduledPlan,
    requests: Mapping[int, Request],
    *,
    queued: bool,
    window_blocked: bool,
    fresh: bool,
    funded: bool,
) -> None:
    """Recheck a plan at commit without rerunning selection; raises PlanRejected.

    Every lane's request must still be resident under its handle, active, in the planned epoch
    and (prompt lanes) at the planned prompt position. Behind queued work (`queued`) the plan
    must not need an empty window (nor be priced on an estimate that is no longer `fresh`), the
    window must not be `window_blocked`, and no lane may need completion feedback. A refresh or
    probe must still be `funded` by a full ledger.
    """
    for i, lane in enumerate(plan.lanes):
        req = requests.get(lane.handle.rid)
        if req is None or req.handle != lane.handle:
            raise PlanRejected(f"lane {i}: request {lane.handle} is no longer resident")
        if not req.active:
            raise PlanRejected(f"lane {i}: request {lane.handle} was cancelled or finished")
        if req.epoch != lane.epoch:
            raise PlanRejected(
                f"lane {i}: request {lane.handle} moved from epoch {lane.epoch} to {req.epoch}"
            )
        if lane.role is LaneRole.PROMPT and lane.prompt_start != req.consumed:
            raise PlanRejected(f"lane {i}: prompt position moved")
    if queued:
        if plan.needs_empty_window or not fresh:
            raise PlanRejected("this plan needs an empty window; wait for queued work to complete")
        if window_blocked:
            raise PlanRejected("the execution window is full, draining or overrun")
        if any(requests[each.handle.rid].needs_feedback for each in plan.lanes):
            raise PlanRejected("a lane needs completion feedback before another frame")
    if not funded:
        raise PlanRejected(f"the {plan.reason.value} credit that funded this plan is no longer full")


@dataclasses.dataclass
class Frame:
    """A committed plan in flight."""

    fence: int
    plan: ScheduledPlan
    committed_ns: int
    expected_end_ns: int | None
    participants: tuple[Handle, ...]
    normalizers: service.Normalizers
    expected_service: dict[int, tuple[float, float]]  # rid -> (expected tokens, expected deliveries)


@dataclasses.dataclass
class Completed:
    """The most recent completion, kept until the next one for publication reports."""

    fence: int
    interval_ms: float | None  # the measured service interval; None: no device interval
    frame_ms: float
    delivery_before: dict[int, float | None]  # rid -> log z before the interval's zero-delivery update
    publishable: set[int]  # rids that received tokens in this completion
    published: set[int] = dataclasses.field(default_factory=set)

    def publish(self, rid: int, history: service.ServiceHistory, policy: PolicyConfig) -> None:
        """The first publication of `rid` replaces the interval's zero-delivery update with one
        served delivery (a missing delivery history starts at one delivery over the frame); a
        completion without a measured interval changes no delivery history."""
        if rid in self.published or self.interval_ms is None:
            return
        self.published.add(rid)
        before = self.delivery_before.get(rid, history.log_z)
        if before is None:
            history.log_z = service.first_delivery_log_rate(self.frame_ms)
        else:
            history.log_z = service.delivery_update(before, 1.0, self.interval_ms, policy)


def validate_completion(
    frame: Frame,
    records: Sequence[CompletionRecord],
    timing: ExecutionTiming,
    confidence: ArrayLike | None,
    survival: ArrayLike | None,
    request_slots: int,
) -> np.ndarray | None:
    """Check a completion against its frame; raises before anything changes.

    Returns rank zero's confidence sidecar as float64 (None without one)."""
    plan = frame.plan
    if len(records) != len(plan.lanes):
        raise ValueError(f"fence {frame.fence}: {len(records)} records for {len(plan.lanes)} lanes")
    device_rows = (
        plan.graph.kind is GraphKind.SPECULATIVE
        and plan.graph.allocation is not None
        and plan.graph.allocation.value == "prefix_limit"
        and plan.graph.proposal_depth > 0
    )
    if device_rows and confidence is None:
        raise ValueError(
            f"fence {frame.fence}: a device-allocated speculative program completes through "
            "complete_packed_round with its confidence sidecar"
        )
    for i, (lane, rec) in enumerate(zip(plan.lanes, records)):
        _validate_lane(f"fence {frame.fence} lane {i} ({lane.handle})", plan, lane, rec)
    for x in tuple(timing.device_intervals_ns) + (timing.wall_ns, timing.readiness_delay_ns):
        if not (isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(x) and x >= 0):
            raise ValueError(f"fence {frame.fence}: timing values must be finite and nonnegative")
    conf = None
    if confidence is not None:
        conf = _validate_sidecars(frame, confidence, request_slots)
    if survival is not None:
        _validate_survival(frame, records, survival, request_slots)
    return conf


def _validate_lane(where: str, plan: ScheduledPlan, lane: PlanLane, rec: CompletionRecord) -> None:
    if not isinstance(rec, CompletionRecord):
        raise TypeError(f"{where}: expected a CompletionRecord, got {type(rec).__name__}")
    if rec.handle != lane.handle or rec.epoch != lane.epoch:
        raise ValueError(
            f"{where}: record is for {rec.handle} epoch {rec.epoch}, plan has epoch {lane.epoch}"
        )
    if any((not isinstance(t, (int, np.integer))) or t < 0 for t in rec.tokens):
        raise ValueError(f"{where}: token ids must be nonnegative integers")
    if lane.role is LaneRole.PROMPT:
        if rec.prompt_tokens != lane.prompt_tokens:
            raise ValueError(
                f"{where}: consumed {rec.prompt_tokens} prompt tokens, plan has {lane.prompt_tokens}"
            )
        if len(rec.tokens) != (1 if lane.finishes_prompt else 0):
            raise ValueError(f"{where}: a prompt chunk emits one token only when it finishes the prompt")
        if rec.offered or rec.accepted:
            raise ValueError(f"{where}: a prompt row verifies no proposals")
    elif lane.role is LaneRole.DECODE:
        _validate_decode(where, plan, lane, rec)
    elif rec.tokens or rec.prompt_tokens or rec.offered or rec.accepted:
        raise ValueError(f"{where}: {lane.role.value} rows produce no tokens")


def _validate_steps(where: str, lane: PlanLane, rec: CompletionRecord) -> None:
    """A K-step decode lane: 1..its steps tokens (fewer after a stop token), no proposals."""
    if rec.prompt_tokens or rec.offered or rec.accepted:
        raise ValueError(f"{where}: a multi-step decode row consumes no prompt and verifies no proposals")
    if not 1 <= len(rec.tokens) <= lane.ceiling:
        raise ValueError(f"{where}: {len(rec.tokens)} tokens from a lane of {lane.ceiling} steps")


def _validate_decode(where: str, plan: ScheduledPlan, lane: PlanLane, rec: CompletionRecord) -> None:
    if plan.graph.steps > 1:
        _validate_steps(where, lane, rec)
        return
    rows = lane.query_length or lane.ceiling
    most = min(rows - 1, plan.graph.proposal_depth)
    if rec.prompt_tokens:
        raise ValueError(f"{where}: a decode row consumes no prompt tokens")
    if not 0 <= rec.offered <= most:
        raise ValueError(f"{where}: offered {rec.offered} proposals, at most {most}")
    if lane.query_length and rec.offered != lane.query_length - 1:
        raise ValueError(
            f"{where}: the host binding fixed {lane.query_length - 1} proposals, "
            f"the record offered {rec.offered}"
        )
    if not 0 <= rec.accepted <= rec.offered:
        raise ValueError(f"{where}: accepted {rec.accepted} of {rec.offered} proposals")
    if len(rec.tokens) != rec.accepted + 1:
        raise ValueError(
            f"{where}: a round commits its accepted proposals plus one token, "
            f"got {len(rec.tokens)} tokens for {rec.accepted} accepted"
        )


def _validate_sidecars(frame: Frame, confidence: ArrayLike, request_slots: int) -> np.ndarray:
    """Every rank's confidence sidecar [2, request_slots, >= P] holds probabilities on the
    frame's lanes; returns rank zero's."""
    plan = frame.plan
    depth = plan.graph.proposal_depth
    sidecars = confidence if isinstance(confidence, (list, tuple)) else [confidence]
    arrays = []
    for rank, sc in enumerate(sidecars):
        arr = _real(sc, f"fence {frame.fence}: rank {rank} confidence must be valid probabilities")
        arrays.append(arr)
        if arr.ndim != 3 or arr.shape[0] != 2 or arr.shape[1] != request_slots or arr.shape[2] < depth:
            raise ValueError(
                f"fence {frame.fence}: rank {rank} sidecar shape {arr.shape}, expected "
                f"[2, {request_slots}, >= {depth}]"
            )
        used = arr[:, [lane.slot for lane in plan.lanes], :depth]
        if np.any(~np.isfinite(used)) or np.any((used < 0) | (used > 1)):
            raise ValueError(f"fence {frame.fence}: rank {rank} confidence must be valid probabilities")
    return arrays[0]


def _real(values: ArrayLike, refusal: str) -> np.ndarray:
    """`values` as float64; complex values (whose imaginary part a cast would drop) or values
    that are not numbers are refused with `refusal` (a missing value becomes NaN, which the
    callers refuse as not a probability)."""
    raw = np.asarray(values)
    if np.iscomplexobj(raw):
        raise ValueError(f"{refusal}, got complex values")
    try:
        return np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{refusal}, got values that are not numbers") from None


def _validate_survival(
    frame: Frame, records: Sequence[CompletionRecord], survival: ArrayLike, request_slots: int
) -> None:
    surv = _real(survival, f"fence {frame.fence}: survival values must be probabilities")
    if surv.ndim != 2 or surv.shape[0] != request_slots:
        raise ValueError(
            f"fence {frame.fence}: survival rows shape {surv.shape}, expected "
            f"[{request_slots}, draft_capacity]"
        )
    for i, (lane, rec) in enumerate(zip(frame.plan.lanes, records)):
        vals = surv[lane.slot, : rec.offered]
        if np.any(~np.isfinite(vals)) or np.any((vals < 0) | (vals > 1)):
            raise ValueError(f"fence {frame.fence} lane {i}: survival values must be probabilities")
