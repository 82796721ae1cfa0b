"""One selection: its input, and the state every program family scores against.

:class:`Selection` sorts the views into the solvers' tie order, builds the decision-wide
quantities (``utility.Decision``: log scale, reference intervals sigma, waiting cost), the lane
tables of runnable decoders and prompts, the terminal and blocked rows, and the duration
estimate of every prepared program. The families (``generation``, ``prefill``, ``mixed``,
``snapshots``, ``prerequisites``) read it and return :class:`~.ranking.ScoredCandidate` lists.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from helios_jax.catalog import MAX_REQUEST_SLOTS, DecodeMode, GraphDescriptor
from helios_jax.scheduler import utility
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy.prepared import PreparedGraphs, as_prepared
from helios_jax.scheduler.policy.ranking import ScoredCandidate, Signature
from helios_jax.scheduler.policy.tables import DecoderTable, PromptTable
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase, RequestView, assemble
from helios_jax.scheduler.view_columns import DecoderColumns, ResidentViews

LaneBuilder = Callable[[], Sequence[Lane]]
_TIE_ORDER = operator.attrgetter("last_selected_ns", "rid")  # the views' order in every solver
_PHASES = tuple(Phase)  # (iterating the enum itself costs a microsecond a decision)


@dataclasses.dataclass(frozen=True)
class SelectionInput:
    views: Sequence[RequestView]
    graphs: Sequence[GraphDescriptor] | PreparedGraphs  # eligible under `mode`
    costs: CostModel
    now_ns: int
    policy: PolicyConfig
    mode: DecodeMode = DecodeMode.ADAPTIVE
    # The loaded programs that set decision-wide references (sigma), when `graphs` is a subset
    # to score (acceptance probes score only drafted programs on the ordinary decision's scale).
    reference: Sequence[GraphDescriptor] | PreparedGraphs | None = None


class Selection:
    """The population of one decision, as the program families score it."""

    decision: utility.Decision
    decoders: DecoderTable
    prompts: PromptTable

    def __init__(self, inp: SelectionInput, base: Selection | None = None):
        """`base`: the ordinary selection of the same decision when `inp.views` are its views
        with other survival and optimistic estimates (an acceptance probe's, ``learning.probe``):
        its decision-wide quantities, prompt table and the decoders' survival-free arrays are
        shared rather than rebuilt."""
        if len(inp.views) > MAX_REQUEST_SLOTS:
            raise ValueError(
                f"selection is bounded to {MAX_REQUEST_SLOTS} request slots, got {len(inp.views)}"
            )
        self.inp = inp
        self.prepared = as_prepared(inp.graphs)
        self.reference = self.prepared if inp.reference is None else as_prepared(inp.reference)
        self.costs = inp.costs
        if base is not None and not base.shares_decision(inp, self.reference):
            base = None
        # Least recently used first (never selected, -1, first of all), then earlier admitted:
        # every cohort solver sorts lanes stably, so lanes of equal value go in this order
        # (duration-estimates/tie-order), whatever order the caller listed the views in.
        resident = ResidentViews.of(inp.views)  # the decoders as columns, beside the others
        others, columns = resident.others, resident.decoders
        self.decision = self._decision(others, columns) if base is None else base.decision
        by_phase: dict[Phase, list[RequestView]] = {phase: [] for phase in _PHASES}
        for v in sorted(others, key=_TIE_ORDER):
            if v.runnable:
                by_phase[v.phase].append(v)
        self.decoders = DecoderTable(
            columns.tie_ordered_runnable(),  # in the same tie order
            self.decision,
            self.prepared.max_width,
            self.prepared.max_depth,
            base=None if base is None else base.decoders,
        )
        prompts = by_phase[Phase.PREFILL]
        if base is not None and _same(prompts, base.prompts.views):
            self.prompts = base.prompts  # prompt rows read no survival estimate
        else:
            self.prompts = PromptTable(prompts, self.decision)
        self.terminals = by_phase[Phase.TERMINAL]
        self.blocked = [v for v in by_phase[Phase.BLOCKED] if v.prerequisites]
        self._durations = dict(self.prepared.durations(self.costs))  # a copy: duration() may add to it
        self._prompt_prices: dict[int, tuple[float, float]] = {}
        self._prompt_tables: dict[tuple[int, ...], PromptTable] = {}

    def _decision(self, others: list[RequestView], decoders: DecoderColumns) -> utility.Decision:
        """The decision-wide quantities of every view: the decoders' and `others`."""
        bearing, terminal = utility.population(others)
        bearing += decoders.count
        return utility.Decision.build(
            others,
            self.inp.policy,
            sigma_decode=self.reference.reference_interval("delivery", bearing, self.costs),
            sigma_terminal=self.reference.reference_interval("snapshots", terminal, self.costs),
            counts=(bearing, terminal),
            log_scale=decoders.max_finite_price(),
        )

    def shares_decision(self, inp: SelectionInput, reference: PreparedGraphs) -> bool:
        """Whether a selection of `inp` scored against `reference` has this one's decision-wide
        quantities, given views that differ from this one's only in survival estimates."""
        mine = self.inp
        return (
            reference is self.reference
            and inp.costs is mine.costs
            and inp.policy is mine.policy
            and inp.now_ns == mine.now_ns
            and len(inp.views) == len(mine.views)
        )

    @property
    def mode(self) -> DecodeMode:
        return self.inp.mode

    def duration(self, g: GraphDescriptor) -> float | None:
        """The program's duration estimate in ms (None: unmeasured)."""
        try:
            return self._durations[id(g)]
        except KeyError:
            t = self._durations[id(g)] = self.costs.estimate_ms(g.key)
            return t

    def prompt_prices(self, v: RequestView) -> tuple[float, float]:
        """A prompt's scaled (prefill token, output token) prices, kept per request for the
        decision (a blocked prompt is priced once for every chunk that may follow it)."""
        hit = self._prompt_prices.get(v.rid)
        if hit is None:
            scaled = self.decision.scaled
            hit = self._prompt_prices[v.rid] = (
                float(scaled(v.log_prefill_price)),
                float(scaled(v.log_output_price)),
            )
        return hit

    def prompt_table(self, views: Sequence[RequestView]) -> PromptTable:
        """A :class:`PromptTable` of `views` (blocked prompts a prerequisite would enable), kept
        for the decision by their requests: every chunk that may follow reads the same one."""
        key = tuple(v.rid for v in views)
        hit = self._prompt_tables.get(key)
        if hit is None:
            hit = self._prompt_tables[key] = PromptTable(list(views), self.decision)
        return hit

    def is_stale(self, g: GraphDescriptor) -> bool:
        return self.costs.is_stale(g.key, self.inp.now_ns)

    def score(
        self,
        g: GraphDescriptor,
        value_at_zero: float,
        value_per_ms: float,
        signature: Signature,
        lanes: LaneBuilder,
    ) -> ScoredCandidate:
        """Score one candidate whose useful value grows by value_per_ms * T (the age terms); an
        unknown duration gets the optimistic work score, its useful value."""
        t = self._durations[id(g)]
        if t is None:
            score = value = value_at_zero
        else:
            value = value_at_zero + value_per_ms * t
            score = self.decision.rate(value, t)
        return ScoredCandidate(
            g,
            float(score),
            t,
            signature,
            functools.partial(self._materialise, g, t, float(score), float(value), lanes),
        )

    def _materialise(
        self, g: GraphDescriptor, t: float | None, score: float, value: float, lanes: LaneBuilder
    ) -> Candidate:
        return assemble(
            Candidate,
            graph=g,
            lanes=tuple(lanes()),
            duration_ms=t,
            score=score,
            useful_value=value,
            log_scale=self.decision.log_scale,
            stale=self.is_stale(g),
            following=None,
            sequence_ms=None,
        )

    def decoder_lanes(
        self, idx: np.ndarray, widths: np.ndarray, g: GraphDescriptor, device: bool
    ) -> LaneBuilder:
        """The builder of decode lanes `idx` at `widths` on `g` (device: widths are ceilings)."""
        decoders = self.decoders
        t = self.duration(g) or 0.0
        return lambda: decoders.lanes(idx, widths, t, ceilings=widths if device else None)


def _same(views: Sequence[RequestView], others: Sequence[RequestView]) -> bool:
    """The same view objects in the same order."""
    return len(views) == len(others) and all(a is b for a, b in zip(views, others))


def free_prerequisite_rows(views: Iterable[RequestView], room: int, taken: Iterable[int]) -> list[Lane]:
    """Unused prerequisite capacity advances further rows at no extra physical cost."""
    return [
        Lane(v.rid, v.slot, LaneRole.PREREQUISITE, value=0.0)
        for v in free_prerequisite_views(views, room, taken)
    ]


def free_prerequisite_views(
    views: Iterable[RequestView], room: int, taken: Iterable[int]
) -> list[RequestView]:
    """The rows :func:`free_prerequisite_rows` advances: the first `room` not `taken`."""
    taken = set(taken)
    out = []
    for v in views:
        if room <= 0:
            break
        if v.rid not in taken:
            out.append(v)
            room -= 1
    return out
