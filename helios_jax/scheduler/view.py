"""The selector's plain-data interface: request views in, candidates out.

``pricing.py`` builds one :class:`RequestView` per resident request from its state (for
``Scheduler.views()``; a decoder's as a row of ``view_columns.DecoderColumns``, read as a
view on demand), with prices and ages already projected to the planning start time; the selector
(the ``policy`` package) turns views and the catalog into :class:`Candidate` programs. Both are frozen so
that a plan can outlive later state changes.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

import numpy as np

from helios_jax.catalog import GraphDescriptor, GraphKind

T = TypeVar("T")


def assemble(cls: type[T], **fields: Any) -> T:
    """``cls(**fields)`` for a frozen dataclass without its constructor's per-field dispatch
    (about a microsecond for ten fields; plans, candidates and decisions are built at every
    decision). The caller names every field: test_plan_cost_bounds checks each such call."""
    new = object.__new__(cls)
    new.__dict__.update(fields)
    return new


class Phase(str, enum.Enum):
    PREFILL = "prefill"  # uncached prompt tokens remain
    DECODE = "decode"  # a delivery-bearing stream generating output
    TERMINAL = "terminal"  # finished; its terminal snapshot retires it
    BLOCKED = "blocked"  # waiting for prerequisites (initialize, restore, vision, window snapshot)


class LaneRole(str, enum.Enum):
    PROMPT = "prompt"  # consumes prompt tokens (a prefill lane or the mixed prompt row)
    DECODE = "decode"  # generates output (decode, speculative or mixed decode row)
    TERMINAL = "terminal"  # terminal snapshot
    PREREQUISITE = "prerequisite"  # enabling state operation (initialize, restore, vision, snapshot)


@dataclasses.dataclass(frozen=True, eq=False)
class RequestView:
    """One resident request as the selector sees it.

    Prices are natural logs in value units per token or delivery (``service.log_prices``).
    ``survival`` are acceptance means (prefix survival, depth 1..) of the request's proposal
    source; ``optimistic`` the bounded optimistic estimates used by acceptance learning;
    ``forecast`` the confidence forecast (joint prefix probabilities) used to predict device
    allocation.
    """

    rid: int
    slot: int
    phase: Phase
    runnable: bool = True
    last_selected_ns: int = -1
    log_prefill_price: float = 0.0
    log_output_price: float = 0.0
    log_delivery_price: float = -np.inf
    # prefill
    prompt_remaining: int = 0  # uncached prompt tokens left
    prompt_limit: int | None = None  # tokens consumable before a stop (window boundary, cut)
    atomic_spans: tuple[tuple[int, int], ...] = ()  # [start, end) offsets from the cursor
    endpoint: int | None = None  # tokens to the next message or prompt endpoint
    needs_scores: bool = False  # prompt log-probabilities requested: scored prefill
    # decode
    age_ms: float = 0.0  # age of the last visible output (projected)
    output_remaining: int = 0
    context_remaining: int = 1 << 30
    copy_limit: int | None = None  # copy proposals: supplied prefix length; None: learned
    width_limit: int | None = None  # grammar or stop restrictions: target rows per round (None: none)
    host_mask: bool = False  # its samples take a host token mask: never a lane of a K-step program
    survival: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    optimistic: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    forecast: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    # terminal
    terminal_age_ms: float = 0.0
    # blocked
    prerequisites: tuple[GraphKind, ...] = ()  # remaining prerequisite executions, next first
    enables: Phase | None = None  # PREFILL or DECODE once the prerequisites are done

    @classmethod
    def make(cls, **fields) -> RequestView:
        """``RequestView(**fields)`` without the frozen constructor's per-field dispatch (views()
        builds one per resident at every decision); unknown names raise like the constructor."""
        unknown = fields.keys() - _FIELDS
        if unknown or not fields.keys() >= _REQUIRED:
            return cls(**fields)  # the constructor's own error
        new = object.__new__(cls)
        d = new.__dict__
        d.update(_DEFAULTS)
        for name in _FACTORIES:
            d[name] = np.zeros(0)
        d.update(fields)
        return new

    @classmethod
    def unchecked(cls, fields: dict) -> RequestView:
        """:meth:`make` from a dict of field values the caller guarantees are valid names with
        every required one present (``pricing.views``): no name checks; `fields` is not kept."""
        new = object.__new__(cls)
        d = new.__dict__
        d.update(DEFAULT_FIELDS)
        d.update(fields)
        return new

    @classmethod
    def complete(cls, fields: dict) -> RequestView:
        """A view from a dict naming every field (``pricing.views`` builds a decoder's from
        :data:`DEFAULT_FIELDS`): the dict becomes the view's own, so the caller must not keep it."""
        new = object.__new__(cls)
        object.__setattr__(new, "__dict__", fields)
        return new

    def with_survival(self, survival: np.ndarray) -> RequestView:
        """This view with other survival estimates (``dataclasses.replace`` without its
        per-field dispatch: an acceptance probe copies every view of a decision)."""
        new = object.__new__(RequestView)
        fields = self.__dict__.copy()
        fields["survival"] = survival
        object.__setattr__(new, "__dict__", fields)  # the copy itself: no second pass over it
        return new

    @property
    def delivery_bearing(self) -> bool:
        """Counts toward K and the common waiting cost: decoders, and streams blocked before decode."""
        return self.phase is Phase.DECODE or (self.phase is Phase.BLOCKED and self.enables is Phase.DECODE)

    @property
    def row_limit(self) -> float:
        """Target rows one round may give this request, pending token included: its output and
        context left, a copy prefix plus the pending token, and grammar or stop restrictions
        (``width_limit``); conditional acceptance is request-local and respects all of them."""
        limit = min(self.output_remaining, self.context_remaining)
        if self.copy_limit is not None:
            limit = min(limit, self.copy_limit + 1)
        if self.width_limit is not None:
            limit = min(limit, self.width_limit)
        return limit

    def prompt_work(self, capacity: int) -> int:
        """Prompt tokens a chunk of `capacity` may consume: prompt length, stops, atomic spans."""
        n = min(capacity, self.prompt_remaining)
        if self.prompt_limit is not None:
            n = min(n, self.prompt_limit)
        for start, end in self.atomic_spans:
            if start < n < end:  # a cut inside an atomic image span moves back to its start
                n = start
        return max(n, 0)


_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestView))
_REQUIRED = frozenset(
    f.name
    for f in dataclasses.fields(RequestView)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(RequestView) if f.default is not dataclasses.MISSING
}
_FACTORIES = tuple(
    f.name for f in dataclasses.fields(RequestView) if f.default_factory is not dataclasses.MISSING
)
# An estimate left empty (a view without survival, optimistic or forecast rows), read-only.
NO_ESTIMATE = np.zeros(0)
NO_ESTIMATE.setflags(write=False)
# Every field with a default (unchecked()'s defaults): the factories' empty arrays are one
# shared read-only array.
DEFAULT_FIELDS = {**_DEFAULTS, **{name: NO_ESTIMATE for name in _FACTORIES}}


@dataclasses.dataclass(frozen=True)
class Lane:
    """One request's logical work in a candidate program."""

    rid: int
    slot: int
    role: LaneRole
    prompt_tokens: int = 0  # prompt tokens consumed (PROMPT lanes)
    query_length: int = 0  # target rows incl. the pending token (host allocation)
    ceiling: int = 0  # device allocation ceiling (prefix_limit binding), 0 otherwise
    expected_tokens: float = 0.0  # expected committed tokens
    value: float = 0.0  # scaled contribution to the score's numerator

    @property
    def work(self) -> tuple:
        return (self.rid, self.role.value, self.prompt_tokens, self.query_length, self.ceiling)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A physical program with its cohort and logical work, scored.

    ``score`` is the scaled value rate (value per ms) for a known duration, and the optimistic
    work score (scaled useful value) for an indeterminate one. ``log_scale`` is the decision's
    shared log scaling factor: unscaled = scaled * exp(log_scale).
    """

    graph: GraphDescriptor
    lanes: tuple[Lane, ...]
    duration_ms: float | None
    score: float
    useful_value: float
    log_scale: float
    stale: bool = False
    following: Candidate | None = None  # lookahead only: never executed from this plan
    sequence_ms: float | None = None  # T + F of a two-stage sequence

    @property
    def indeterminate(self) -> bool:
        return self.duration_ms is None

    @property
    def kind(self) -> GraphKind:
        return self.graph.kind

    @property
    def rids(self) -> tuple[int, ...]:
        return tuple(lane.rid for lane in self.lanes)

    @property
    def served(self) -> int:
        return len(self.lanes)

    @property
    def prefill_row(self) -> int | None:
        """Index of the prompt row in the dense lane list (mixed programs), or None."""
        for i, lane in enumerate(self.lanes):
            if lane.role is LaneRole.PROMPT:
                return i
        return None

    @property
    def padding(self) -> int:
        """Unused physical rows (tokens for prefill chunks) of the program."""
        g = self.graph
        if g.kind.is_prefill:
            return g.batch_capacity * g.token_capacity - sum(lane.prompt_tokens for lane in self.lanes)
        if g.kind is GraphKind.MIXED:
            used = sum(lane.prompt_tokens + lane.query_length for lane in self.lanes)
            return g.max_packed_extent - used
        if g.kind in (GraphKind.SPECULATIVE, GraphKind.DECODE):
            rows = max(g.target_capacity, g.batch_capacity)
            host = sum(lane.query_length for lane in self.lanes)
            device = min(rows, sum(lane.ceiling for lane in self.lanes))
            return rows - (host or device)
        return g.batch_capacity - len(self.lanes)
