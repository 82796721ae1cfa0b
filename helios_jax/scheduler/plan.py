"""Plain data crossing the scheduler's boundary: plans in, completion records and timing out.

The engine never reaches into the scheduler: it receives a frozen :class:`ScheduledPlan` from
``plan()``, submits it with ``commit(plan, fence)``, runs the prepared program and reports back
one :class:`CompletionRecord` per lane (in plan order) with an :class:`ExecutionTiming`.
"""
from __future__ import annotations

import dataclasses
import enum
import numpy as np

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler.view import Candidate, LaneRole


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
    def prefill_row(self) -> int:
        """The prompt row's index in the dense lane list (mixed programs), or -1."""
        for i, lane in enumerate(self.lanes):
            if lane.role is LaneRole.PROMPT:
                return i
        return -1

    @property
    def handles(self) -> tuple[Handle, ...]:
        return tuple(l.handle for l in self.lanes)

    def max_advance(self, lane: PlanLane) -> int:
        """Upper bound on the tokens `lane` commits: a queued speculative lane advances by at
        most min(lane ceiling, P), a prompt lane by its first output token when it finishes."""
        if lane.role is LaneRole.PROMPT:
            return 1 if lane.finishes_prompt else 0
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


def validate_probabilities(name: str, values: np.ndarray) -> None:
    if np.any(~np.isfinite(values)) or np.any((values < 0) | (values > 1)):
        raise ValueError(f"{name} must hold probabilities in [0, 1]")

