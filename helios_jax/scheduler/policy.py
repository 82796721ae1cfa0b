"""Candidates and selection (spec, "Useful service and selection", "Prerequisites and completion").

:func:`select` returns the prepared program to run next with its cohort and per-lane work,
chosen by expected useful value per execution time (``utility.py``). Every loaded program
competes through its best non-dominated cohort:

- generation (decode, speculative): unconstrained programs take their highest additive lane
  values; fixed host ragged programs solve the B/P capacity problem exactly; adaptive ragged
  programs search cohort prefixes under three orderings priced by the causal allocation;
- prefill and scored prefill: each capacity with the tokens it can actually consume (prompt
  length, stops, atomic image spans); no smallest-fit filter, duration ceiling, oldest filter or
  lateness cost; an *unmeasured* capacity is excluded from exploration when a smaller prepared
  one consumes the same tokens up to the next message or prompt endpoint;
- mixed: per shape, the best decode-only cohort and the best prompt row with the highest-value
  decoders in the remaining rows (exact over every legal cohort); prompt-only is legal;
- terminal snapshots: terminal value and terminal age, under the same score and padding rules;
- prerequisites (initialize, restore, vision, window snapshots): the exact fixed-pair two-stage
  calculation against every following inference shape, and the individual continuation index
  V*T/(T+F) for longer chains.

Dominance: among candidates of the same kind, cohort and logical per-request work (mixed: also
the same prompt row and prompt work; speculative: the same proposal depth), a shape whose
capacities are all at least another's, one strictly larger, is discarded, so timing noise can
never make redundant padding preferable.

Order: an indeterminate candidate beats any determinate one; then the higher score (value rate,
or useful value for indeterminate ones); equal values prefer the shorter known time, more served
requests, less recently used requests, and smaller physical padding, in that order.

Cost: the work is vectorised per family and a candidate's lanes are built only when it is
materialised (the winner, tied rivals, or an explicit :func:`candidates` listing), so a decision
stays near a millisecond with 64 resident requests (``scripts/bench/scheduler_select.py``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterable, Sequence

import numpy as np

from helios_jax.catalog import (MAX_REQUEST_SLOTS, Allocation, DecodeMode, GraphDescriptor,
                                GraphKind)
from helios_jax.scheduler import utility
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.rounds import allocate_prefix_rows, prefix_allocation_order
from helios_jax.scheduler.speculation import expected_output_table, monotone
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase, RequestView

PREREQUISITE_KINDS = (GraphKind.INITIALIZE, GraphKind.RESTORE, GraphKind.VISION, GraphKind.SNAPSHOT)


def capacities(g: GraphDescriptor) -> tuple[int, ...]:
    return (g.batch_capacity, g.token_capacity, g.target_capacity, g.prefill_capacity, g.image_capacity)


def _dominates(small: GraphDescriptor, big: GraphDescriptor) -> bool:
    a, b = capacities(small), capacities(big)
    return a != b and all(x <= y for x, y in zip(a, b))


class PreparedGraphs:
    """The eligible programs of one loaded mode, grouped once for repeated selection."""

    def drafted(self) -> "PreparedGraphs":
        """The speculative programs with proposals (what acceptance probes choose among), grouped
        once and kept."""
        if self._drafted is None:
            self._drafted = PreparedGraphs(
                g for g in self.graphs if g.kind is GraphKind.SPECULATIVE and g.proposal_depth > 0)
        return self._drafted

    def __init__(self, graphs: Iterable[GraphDescriptor]):
        self.graphs = tuple(graphs)
        self.generation = [g for g in self.graphs if g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE)]
        self.prefill = [g for g in self.graphs if g.kind.is_prefill]
        self.mixed = [g for g in self.graphs if g.kind is GraphKind.MIXED]
        self.snapshots = [g for g in self.graphs if g.kind is GraphKind.SNAPSHOT]
        self.prerequisites = [g for g in self.graphs if g.kind in PREREQUISITE_KINDS]
        self.delivery = [g for g in self.graphs if g.kind.is_generation]
        self.dominators = {
            g: [h for h in self.graphs if h.kind is g.kind and _dominates(h, g)] for g in self.graphs}
        self.dominator_ids = {id(g): {id(h) for h in hs} for g, hs in self.dominators.items()}
        self.smaller_prefill = {
            g: [h for h in self.prefill if h.kind is g.kind and h.token_capacity < g.token_capacity]
            for g in self.prefill}
        # A decode-only population on a mixed shape is the same work on every prompt capacity of
        # that (B, W, D): only the smallest capacity can survive the dominance filter.
        smallest = {}
        for g in self.mixed:
            shape = (g.batch_capacity, g.token_capacity, g.proposal_depth)
            if shape not in smallest or g.prefill_capacity < smallest[shape].prefill_capacity:
                smallest[shape] = g
        self.mixed_decode_only = {id(g) for g in smallest.values()}
        self._drafted: PreparedGraphs | None = None
        self.largest_smaller_chunk = {
            id(g): max((h.token_capacity for h in self.dominators[g]), default=None) for g in self.prefill}
        self.largest_smaller_chunk = {k: v for k, v in self.largest_smaller_chunk.items() if v is not None}
        self.smaller_mixed = {
            g: [h for h in self.mixed if h.batch_capacity == g.batch_capacity
                and h.token_capacity == g.token_capacity and h.prefill_capacity < g.prefill_capacity]
            for g in self.mixed}
        # Mixed dominators grouped by the shape that fixes their decoder rows: (B, W, D) -> the
        # largest dominating prompt capacity (prompt work grows with capacity, so it decides).
        self.mixed_dominator_classes = {}
        for g in self.mixed:
            classes: dict = {}
            for h in self.dominators[g]:
                shape = (h.batch_capacity, h.token_capacity, h.proposal_depth)
                classes[shape] = max(classes.get(shape, 0), h.prefill_capacity)
            self.mixed_dominator_classes[g] = tuple(classes.items())
        self.max_width = max([g.token_capacity for g in self.delivery] + [1])
        self.max_depth = max([g.proposal_depth for g in self.delivery] + [0])


def as_prepared(graphs) -> PreparedGraphs:
    return graphs if isinstance(graphs, PreparedGraphs) else PreparedGraphs(graphs)


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


# -- comparison -------------------------------------------------------------------------------

def better(a: Candidate, b: Candidate, recency: dict[int, int]) -> bool:
    """Whether `a` is preferred to `b` (spec tie order; `recency` maps rid to last selection)."""
    if a.indeterminate != b.indeterminate:
        return a.indeterminate
    if not utility.nearly_equal(a.score, b.score):
        return a.score > b.score
    if a.duration_ms is not None and b.duration_ms is not None and a.duration_ms != b.duration_ms:
        return a.duration_ms < b.duration_ms
    if a.served != b.served:
        return a.served > b.served
    ra = sorted(recency.get(r, -1) for r in a.rids)
    rb = sorted(recency.get(r, -1) for r in b.rids)
    if ra != rb:
        return ra < rb
    if a.padding != b.padding:
        return a.padding < b.padding
    return (capacities(a.graph), a.rids) < (capacities(b.graph), b.rids)


@dataclasses.dataclass
class ScoredRow:
    """A scored candidate whose lanes are built on demand (``build()``)."""

    __slots__ = ("graph", "score", "duration_ms", "signature", "_build")

    def __init__(self, graph: GraphDescriptor, score: float, duration_ms: float | None, signature: tuple | None,
                 build: Callable[[], Candidate]):
        self.graph = graph
        self.score = score
        self.duration_ms = duration_ms
        self.signature = signature  # dominance group (None: never compared)
        self._build = build

    def build(self) -> Candidate:
        return self._build()

    @property
    def indeterminate(self) -> bool:
        return self.duration_ms is None


def _prune(rows: list[ScoredRow], prepared: "PreparedGraphs") -> list[ScoredRow]:
    """The dominance filter within groups of equal kind, cohort and logical work."""
    groups: dict = {}
    for r in rows:
        if r.signature is not None:
            groups.setdefault(r.signature, []).append(r)
    dropped = set()
    for group in groups.values():
        if len(group) > 1:
            present = {id(o.graph) for o in group}
            for r in group:
                if prepared.dominator_ids[id(r.graph)] & present:
                    dropped.add(id(r))
    return [r for r in rows if id(r) not in dropped]


# -- lane tables -------------------------------------------------------------------------------

def _padded(rows: list, depth: int) -> np.ndarray:
    if rows and depth and all(getattr(r, "shape", (0,))[-1:] == (depth,) for r in rows):
        return monotone(np.array(rows, dtype=np.float64))  # the common case: one stack
    out = np.zeros((len(rows), depth))
    for i, r in enumerate(rows):
        r = np.asarray(r, dtype=np.float64).reshape(-1)[:depth]
        out[i, : r.size] = r
    return monotone(out) if depth else out


class _Decoders:
    """Runnable decoding requests as arrays (the T-independent parts of their lane values)."""

    def __init__(self, views: list[RequestView], dec: utility.Decision, max_width: int, depth: int):
        self.views = views
        n = self.n = len(views)
        self.dec = dec
        self.rid = np.array([v.rid for v in views], dtype=np.int64)
        self.slot = np.array([v.slot for v in views], dtype=np.int64)
        self.recency = np.array([v.last_selected_ns for v in views], dtype=np.int64)
        self.po = dec.scaled(np.array([v.log_output_price for v in views], dtype=np.float64))
        self.pd = dec.scaled(np.array([v.log_delivery_price for v in views], dtype=np.float64))
        age = np.array([v.age_ms for v in views], dtype=np.float64)
        self.limit = np.array([v.row_limit for v in views], dtype=np.float64)
        self.survival = _padded([v.survival for v in views], depth)
        self.forecast = _padded([v.forecast for v in views], depth)
        self.expected = (expected_output_table(self.survival, max_width, dec.alpha) if n
                         else np.zeros((0, max_width + 1)))
        self.extension = self.po[:, None] * self.survival ** dec.alpha  # value of row d+1
        self.base = self.pd + dec.decode_age_term(age, 0.0)  # delivery and c*sigma*A
        self.age_rate = dec.decode_age * dec.sigma_decode  # c*sigma: value per ms of T per lane
        self._tables: dict = {}

    def widths(self, width: int, depth: int) -> np.ndarray:
        """Per-lane target rows: program width, proposals, output limit and context."""
        return np.maximum(np.minimum(self.limit, min(width, depth + 1)), 1).astype(np.int64)

    def values(self, widths: np.ndarray) -> np.ndarray:
        return self.po * self.expected[np.arange(self.n), widths] + self.base

    def table(self, width: int, depth: int):
        """(widths, values, order, prefix sums, key) for programs of this width and depth.

        Equal values rank the less recently used request first, then the lower slot.
        """
        hit = self._tables.get((width, depth))
        if hit is None:
            widths = self.widths(width, depth)
            vals = self.values(widths)
            order = np.lexsort((self.slot, self.recency, -vals))
            prefix = np.concatenate([[0.0], np.cumsum(vals[order])])
            hit = self._tables[(width, depth)] = (widths, vals, order, prefix, widths.tobytes())
        return hit

    def lanes(self, idx: Iterable[int], rows: np.ndarray, until_ms: float, *,
              ceilings: np.ndarray | None = None) -> list[Lane]:
        """DECODE lanes: host query lengths `rows`, or device `ceilings` with predicted `rows`."""
        out = []
        for i in idx:
            i = int(i)
            expected = float(self.expected[i, int(rows[i])])
            value = float(self.po[i] * expected + self.base[i] + self.age_rate * until_ms)
            out.append(Lane(int(self.rid[i]), int(self.slot[i]), LaneRole.DECODE,
                            query_length=0 if ceilings is not None else int(rows[i]),
                            ceiling=int(ceilings[i]) if ceilings is not None else 0,
                            expected_tokens=expected, value=value))
        return out


class _Prompts:
    """Runnable requests with uncached prompt tokens, vectorised over capacities."""

    def __init__(self, views: list[RequestView], dec: utility.Decision):
        self.views = views
        self.n = len(views)
        self.rid = np.array([v.rid for v in views], dtype=np.int64)
        self.recency = np.array([v.last_selected_ns for v in views], dtype=np.int64)
        self.pp = dec.scaled(np.array([v.log_prefill_price for v in views], dtype=np.float64))
        self.po = dec.scaled(np.array([v.log_output_price for v in views], dtype=np.float64))
        self.remaining = np.array([v.prompt_remaining for v in views], dtype=np.int64)
        self.limit = np.array([v.prompt_remaining if v.prompt_limit is None else v.prompt_limit
                               for v in views], dtype=np.int64)
        self.scores_wanted = np.array([v.needs_scores for v in views], dtype=bool)
        self.spans = [i for i, v in enumerate(views) if v.atomic_spans]
        endpoint = np.array([v.prompt_remaining if v.endpoint is None else v.endpoint for v in views],
                            dtype=np.int64)
        self.endpoint = np.minimum(np.minimum(endpoint, self.remaining), self.limit)
        self._work: dict[int, np.ndarray] = {}
        self._values: dict[int, np.ndarray] = {}

    def work(self, capacity: int) -> np.ndarray:
        hit = self._work.get(capacity)
        if hit is None:
            hit = np.minimum(np.minimum(self.remaining, self.limit), capacity)
            for i in self.spans:
                hit[i] = self.views[i].prompt_work(capacity)
            self._work[capacity] = hit
        return hit

    def values(self, capacity: int) -> np.ndarray:
        hit = self._values.get(capacity)
        if hit is None:
            n = self.work(capacity)
            hit = np.where(n > 0, self.pp * n + np.where(n == self.remaining, self.po, 0.0), 0.0)
            self._values[capacity] = hit
        return hit

    def pick(self, allowed: np.ndarray, capacity: int) -> int | None:
        """The best allowed prompt row; equal values prefer the less recently used request."""
        if not allowed.any():
            return None
        vals = np.where(allowed, self.values(capacity), -np.inf)
        top = vals.max()
        tied = np.flatnonzero(allowed & (vals >= top - utility.REL_TIE * max(1.0, abs(top))))
        if tied.size == 1:
            return int(tied[0])
        return int(tied[np.lexsort((self.rid[tied], -self.work(capacity)[tied], self.recency[tied]))[0]])

    def lane(self, i: int, capacity: int) -> Lane:
        n = int(self.work(capacity)[i])
        return Lane(int(self.rid[i]), self.views[i].slot, LaneRole.PROMPT, prompt_tokens=n,
                    value=float(self.values(capacity)[i]),
                    expected_tokens=1.0 if n == self.remaining[i] else 0.0)


@dataclasses.dataclass(frozen=True)
class _Population:
    """One population shape of a following graph: contributions and lanes of its row groups."""

    new_vals: np.ndarray
    new_lanes: list
    ready_vals: np.ndarray
    ready_lanes: list
    room: int  # following-graph rows left for newly ready and ready rows
    fixed: list = dataclasses.field(default_factory=list)  # a chosen prompt row
    fixed_new: bool = False  # the fixed prompt row is itself enabled by the prerequisite

    @property
    def fixed_value(self) -> float:
        return float(sum(l.value for l in self.fixed))

    @classmethod
    def of(cls, new, ready, room, *, fixed=(), fixed_new=False) -> "_Population":
        return cls(np.array([x[0] for x in new], dtype=np.float64), [x[1] for x in new],
                   np.array([x[0] for x in ready], dtype=np.float64), [x[1] for x in ready],
                   room, list(fixed), fixed_new)


# -- the selection ----------------------------------------------------------------------------

class _Selection:
    def __init__(self, inp: SelectionInput):
        if len(inp.views) > MAX_REQUEST_SLOTS:
            raise ValueError(f"selection is bounded to {MAX_REQUEST_SLOTS} request slots, got {len(inp.views)}")
        self.inp = inp
        self.prepared = as_prepared(inp.graphs)
        reference = self.prepared if inp.reference is None else as_prepared(inp.reference)
        costs = inp.costs
        self.costs = costs
        # Least recently used first (never selected first of all), then earlier admitted: every
        # cohort solver sorts lanes stably, so lanes of equal value go in this order
        # (duration-estimates/tie-order), whatever order the caller listed the views in.
        views = sorted(inp.views, key=lambda v: (-1 if v.last_selected_ns is None else v.last_selected_ns, v.rid))
        self.views = views
        k = sum(1 for v in views if v.delivery_bearing)
        k_term = sum(1 for v in views if v.phase is Phase.TERMINAL)
        self.dec = utility.Decision.build(
            views, inp.policy,
            sigma_decode=utility.reference_interval(k, reference.delivery, costs),
            sigma_terminal=utility.reference_interval(k_term, reference.snapshots, costs))
        runnable = [v for v in views if v.runnable]
        self.decoders = _Decoders([v for v in runnable if v.phase is Phase.DECODE], self.dec,
                                  self.prepared.max_width, self.prepared.max_depth)
        self.prompts = _Prompts([v for v in runnable if v.phase is Phase.PREFILL], self.dec)
        self.terminals = [v for v in runnable if v.phase is Phase.TERMINAL]
        self.blocked = [v for v in runnable if v.phase is Phase.BLOCKED and v.prerequisites]
        self._durations = {id(g): costs.estimate_ms(g.key) for g in self.prepared.graphs}
        self._signatures: dict = {}

    # -- helpers ----------------------------------------------------------------------------
    def duration(self, g: GraphDescriptor) -> float | None:
        try:
            return self._durations[id(g)]
        except KeyError:
            t = self._durations[id(g)] = self.costs.estimate_ms(g.key)
            return t

    def row(self, g: GraphDescriptor, numerator_at_zero: float, per_ms: float, signature,
            lanes: Callable[[], list[Lane]]) -> ScoredRow:
        """Score one candidate whose numerator grows by per_ms * T (the age terms); an unknown
        duration gets the optimistic work score, its useful value."""
        t = self._durations[id(g)]
        if t is None:
            score = value = numerator_at_zero
        else:
            value = numerator_at_zero + per_ms * t
            score = self.dec.rate(value, t)
        return ScoredRow(g, float(score), t, signature,
                         functools.partial(self._candidate, g, t, float(score), float(value), lanes))

    def _candidate(self, g: GraphDescriptor, t, score: float, value: float, lanes) -> Candidate:
        return Candidate(graph=g, lanes=tuple(lanes()), duration_ms=t, score=score, useful_value=value,
                         log_scale=self.dec.log_scale, stale=self.costs.is_stale(g.key, self.inp.now_ns))

    # -- generation -------------------------------------------------------------------------
    def generation(self) -> list[ScoredRow]:
        d = self.decoders
        if d.n == 0:
            return []
        rows = []
        for g in self.prepared.generation:
            device = g.allocation is Allocation.PREFIX_LIMIT
            widths, vals, order, prefix, key = d.table(g.token_capacity, g.proposal_depth)
            if g.kind is GraphKind.DECODE or g.token_capacity == 1 or g.is_rectangular:
                m = min(g.batch_capacity, d.n)
                sig = (g.kind, device, g.proposal_depth, key, m)
                rows.append(self.row(g, float(prefix[m]), m * d.age_rate, sig,
                                     self._decoder_lanes(order[:m], widths, g, device)))
            elif self.inp.mode is DecodeMode.FIXED:
                row = self._fixed_ragged(g, widths, vals)
                if row is not None:
                    rows.append(row)
            else:
                row = self._adaptive_ragged(g, widths, device)
                if row is not None:
                    rows.append(row)
        return rows

    def _decoder_lanes(self, idx, widths, g, device: bool):
        d = self.decoders
        t = self.duration(g) or 0.0
        return lambda: d.lanes(idx, widths, t, ceilings=widths if device else None)

    def _fixed_ragged(self, g: GraphDescriptor, widths: np.ndarray, vals: np.ndarray) -> ScoredRow | None:
        d = self.decoders
        t = self.duration(g) or 0.0
        _, idx = utility.fixed_ragged(vals + d.age_rate * t, widths, g.batch_capacity, g.target_capacity)
        if not idx:
            return None
        sig = (g.kind, False, g.proposal_depth, tuple((int(d.rid[i]), int(widths[i])) for i in idx))
        return self.row(g, float(vals[idx].sum()), len(idx) * d.age_rate, sig,
                        lambda: d.lanes(idx, widths, t))

    def _adaptive_ragged(self, g: GraphDescriptor, widths: np.ndarray, device: bool) -> ScoredRow | None:
        """Adaptive ragged selection: cohort prefixes under the three orderings, each priced by
        the allocation it gets.

        The host ranks its own rows by marginal value. The device ranks its causal frontier by
        joint prefix probability (the forecast), never by host prices, within the lane
        ceilings, and the ceilings are the only way prices reach its allocation
        (:meth:`_price_ceilings`).
        """
        d = self.decoders
        t = self.duration(g) or 0.0
        base = d.po + d.base + d.age_rate * t
        depth = d.extension.shape[1]
        by_slot = np.argsort(d.slot, kind="stable")
        key = d.forecast if device else d.extension
        al, ad = prefix_allocation_order(key[by_slot], np.minimum(widths[by_slot], depth + 1))
        _, cohort, alloc = utility.adaptive_ragged(base, d.extension, widths, by_slot[al], ad, g.batch_capacity,
                                                   g.target_capacity)
        if not cohort:
            return None
        ceilings = self._price_ceilings(cohort, widths, alloc, g.target_capacity) if device else None
        numerator = float(sum(d.po[i] * d.expected[i, alloc[i]] + d.base[i] for i in cohort))
        work = tuple((int(d.rid[i]), int(ceilings[i] if device else alloc[i])) for i in cohort)
        sig = (g.kind, device, g.proposal_depth, work)
        return self.row(g, numerator, len(cohort) * d.age_rate, sig,
                        lambda: d.lanes(cohort, alloc, t, ceilings=ceilings))

    def _price_ceilings(self, cohort: list[int], widths: np.ndarray, alloc: np.ndarray, rows: int) -> np.ndarray:
        """Lane ceilings for a device-allocated cohort; updates `alloc` to the rows they give.

        Maximal ceilings are min(D + 1, W, request limit). A price-aware frontier would rank each
        lane's forecast times its output price; a lane to which it gives fewer rows than the
        device's own frontier has its ceiling lowered to that many, so the rows it would take
        go to the lanes prices favour, while those keep maximal ceilings and the device's
        confidence still allocates among them. Equal prices rank like the device: every ceiling
        stays maximal. (With equal confidences the device would otherwise give every tie to the
        lowest slot, every round.)
        """
        d = self.decoders
        idx = np.array(sorted(cohort, key=lambda i: d.slot[i]))
        active = np.ones(idx.size, dtype=bool)
        priced = allocate_prefix_rows(d.po[idx, None] * d.forecast[idx], widths[idx], active, rows)
        ceilings = widths.copy()
        ceilings[idx] = np.where(priced < alloc[idx], priced, widths[idx])
        if np.array_equal(ceilings[idx], widths[idx]):
            return ceilings
        alloc[idx] = allocate_prefix_rows(d.forecast[idx], ceilings[idx], active, rows)
        return ceilings

    # -- prefill ----------------------------------------------------------------------------
    def prefill(self) -> list[ScoredRow]:
        pr = self.prompts
        if pr.n == 0:
            return []
        rows = []
        for g in self.prepared.prefill:
            cap = g.token_capacity
            work = pr.work(cap)
            allowed = (pr.scores_wanted == (g.kind is GraphKind.SCORED_PREFILL)) & (work > 0)
            smaller = self.prepared.largest_smaller_chunk.get(id(g))
            if smaller is not None:  # the same work on a smaller chunk (work grows with the chunk)
                allowed &= pr.work(smaller) != work
            if not self.costs.is_known(g.key):
                allowed &= ~self._explore_excluded(self.prepared.smaller_prefill[g], work, lambda h: h.token_capacity)
            i = pr.pick(allowed, cap)
            if i is not None:
                rows.append(self.row(g, float(pr.values(cap)[i]), 0.0, None,
                                     lambda i=i, cap=cap: [pr.lane(i, cap)]))
        return rows

    def _explore_excluded(self, smaller: list[GraphDescriptor], work: np.ndarray, capacity_of) -> np.ndarray:
        """Rows for which a smaller prepared capacity consumes the same tokens up to the endpoint."""
        pr = self.prompts
        mine = np.minimum(work, pr.endpoint)
        excluded = np.zeros(pr.n, dtype=bool)
        for h in smaller:
            excluded |= np.minimum(pr.work(capacity_of(h)), pr.endpoint) == mine
        return excluded

    # -- mixed ------------------------------------------------------------------------------
    def mixed(self) -> list[ScoredRow]:
        d, pr = self.decoders, self.prompts
        prompt_ok = ~pr.scores_wanted
        picks: dict = {}
        rows = []
        for g in self.prepared.mixed:
            b = g.batch_capacity
            widths, vals, order, prefix, key = d.table(g.token_capacity, g.proposal_depth)
            if d.n and id(g) in self.prepared.mixed_decode_only:
                m = min(b, d.n)
                sig = (g.kind, -1, 0, g.proposal_depth, key, m)
                rows.append(self.row(g, float(prefix[m]), m * d.age_rate, sig,
                                     self._decoder_lanes(order[:m], widths, g, False)))
            if not pr.n:
                continue
            cap = g.prefill_capacity
            m = min(b - 1, d.n)
            allowed = self._undominated_prompts(g, m, prompt_ok)
            if allowed is None:
                continue
            if not self.costs.is_known(g.key):
                allowed = allowed & ~self._explore_excluded(self.prepared.smaller_mixed[g], pr.work(cap),
                                                            lambda h: h.prefill_capacity)
            pick_key = (cap, allowed.tobytes())
            if pick_key not in picks:
                picks[pick_key] = pr.pick(allowed, cap)
            i = picks[pick_key]
            if i is None:
                continue

            def lanes(i=i, cap=cap, m=m, widths=widths, order=order, g=g):
                return [pr.lane(i, cap)] + d.lanes(order[:m], widths, self.duration(g) or 0.0)

            rows.append(self.row(g, float(pr.values(cap)[i] + prefix[m]), m * d.age_rate, None, lanes))
        return rows

    def _decoder_signature(self, batch: int, width: int, depth: int):
        """The decoder work beside a prompt row in a (B, W, D) shape: lanes and widths (0: none)."""
        key = (batch, width, depth)
        hit = self._signatures.get(key)
        if hit is None:
            m = min(batch - 1, self.decoders.n)
            hit = 0 if m == 0 else (m, depth, self.decoders.table(width, depth)[4])
            self._signatures[key] = hit
        return hit

    def _undominated_prompts(self, g: GraphDescriptor, m: int, prompt_ok: np.ndarray) -> np.ndarray | None:
        """Prompt rows of mixed shape g that no smaller shape serves with the same work.

        A smaller shape h carries the same candidate when it serves the same decoder lanes at the
        same widths and consumes the same prompt tokens. Prompt work grows with capacity, so
        equality with the largest smaller capacity decides; an equal capacity decides for every
        row (None: all dominated).
        """
        pr = self.prompts
        work = pr.work(g.prefill_capacity)
        mine = self._decoder_signature(g.batch_capacity, g.token_capacity, g.proposal_depth)
        largest = None
        for shape, capacity in self.prepared.mixed_dominator_classes[g]:
            if self._decoder_signature(*shape) != mine:
                continue
            if capacity == g.prefill_capacity:
                return None
            largest = capacity if largest is None else max(largest, capacity)
        allowed = prompt_ok & (work > 0)
        if largest is not None:
            allowed &= pr.work(largest) != work
        return allowed

    # -- terminal snapshots -----------------------------------------------------------------
    def terminal(self) -> list[ScoredRow]:
        if not self.terminals:
            return []
        ages = np.array([v.terminal_age_ms for v in self.terminals])
        order = np.lexsort((np.array([v.last_selected_ns for v in self.terminals]), -ages))
        per_row = self.dec.terminal_age * self.dec.sigma_terminal
        free = [v for v in self.blocked if v.prerequisites[0] is GraphKind.SNAPSHOT]
        rows = []
        for g in self.prepared.snapshots:
            m = min(g.batch_capacity, len(order))
            idx = order[:m]
            t = self.duration(g) or 0.0

            def lanes(idx=idx, t=t, g=g, m=m):
                out = [Lane(self.terminals[i].rid, self.terminals[i].slot, LaneRole.TERMINAL,
                            value=float(self.dec.terminal_lane(ages[i], t))) for i in idx]
                return out + self._free_rows(free, g.batch_capacity - m, ())

            n_free = min(len(free), g.batch_capacity - m)
            sig = (g.kind, "terminal", m, n_free)
            rows.append(self.row(g, float(self.dec.terminal_lane(ages[idx], 0.0).sum()), m * per_row, sig, lanes))
        return rows

    @staticmethod
    def _free_rows(views: list[RequestView], room: int, taken) -> list[Lane]:
        """Unused prerequisite capacity advances further rows at no extra physical cost."""
        out = []
        for v in views:
            if room <= 0:
                break
            if v.rid not in taken:
                out.append(Lane(v.rid, v.slot, LaneRole.PREREQUISITE, value=0.0))
                room -= 1
        return out

    # -- prerequisites ------------------------------------------------------------------------
    def prerequisites(self) -> list[ScoredRow]:
        if not self.blocked:
            return []
        rows = []
        for g1 in self.prepared.prerequisites:
            group = [v for v in self.blocked if v.prerequisites[0] is g1.kind]
            if not group:
                continue
            singles = [v for v in group if len(v.prerequisites) == 1]
            rows.extend(self._pairs(g1, group, singles))
            row = self._continuations(g1, group)
            if row is not None:
                rows.append(row)
        return rows

    def _following_graphs(self, enables: Phase) -> list[GraphDescriptor]:
        """Every prepared inference shape that can follow: prefill, scored prefill and mixed
        programs for an enabled prompt; every generation program, ragged ones included, for an
        enabled decoder."""
        if enables is Phase.PREFILL:
            return [g for g in self.prepared.graphs if g.kind.is_prefill or g.kind is GraphKind.MIXED]
        return list(self.prepared.delivery)

    @staticmethod
    def _is_ragged(g: GraphDescriptor) -> bool:
        return g.kind is GraphKind.SPECULATIVE and g.token_capacity > 1 and not g.is_rectangular

    def _new_decoder(self, v: RequestView, g2: GraphDescriptor, until_ms: float):
        """A newly ready decoder's lane in the following graph, with an individual reference.

        A multistage blocked stream's reference interval is its own future-delivery time, the
        length of the sequence that delivers to it.
        """
        surv = _padded([v.survival], self.prepared.max_depth)
        w = int(max(1, min(v.row_limit, g2.token_capacity, g2.proposal_depth + 1)))
        expected = float(expected_output_table(surv, w, self.dec.alpha)[0, w])
        po, pd = float(self.dec.scaled(v.log_output_price)), float(self.dec.scaled(v.log_delivery_price))
        value = po * expected + pd + self.dec.decode_age * until_ms * (v.age_ms + until_ms)
        return value, Lane(v.rid, v.slot, LaneRole.DECODE, query_length=w, expected_tokens=expected,
                           value=value)

    def _prompt_value(self, v: RequestView, capacity: int, scored: bool = False) -> float:
        """A prompt lane's value in a chunk of `capacity`; zero in the wrong prefill family
        (a request that needs prompt scores runs only scored prefill, and no other does)."""
        n = v.prompt_work(capacity)
        if n <= 0 or v.needs_scores != scored:
            return 0.0
        value = float(self.dec.scaled(v.log_prefill_price)) * n
        if n == v.prompt_remaining:
            value += float(self.dec.scaled(v.log_output_price))
        return value

    def _prompt_lane(self, v: RequestView, capacity: int, scored: bool = False) -> Lane:
        n = v.prompt_work(capacity)
        return Lane(v.rid, v.slot, LaneRole.PROMPT, prompt_tokens=n, value=self._prompt_value(v, capacity, scored),
                    expected_tokens=1.0 if n == v.prompt_remaining else 0.0)

    def _populations(self, g2: GraphDescriptor, new_views: list[RequestView], u: float) -> list[_Population]:
        """Every legal population shape of the following graph for one fixed pair of shapes.

        Decode-like followers take newly ready and already ready decoders; prefill followers
        take newly enabled and already ready prompts. A mixed follower's prompt row is absent,
        already ready, or enabled by the prerequisite (then it is itself the newly ready row and
        holds one prerequisite row); each case leaves an exact capacity problem for the decode
        rows.
        """
        d, pr = self.decoders, self.prompts
        b2 = g2.batch_capacity
        if g2.kind.is_prefill:
            cap, scored = g2.token_capacity, g2.kind is GraphKind.SCORED_PREFILL
            new = [(self._prompt_value(v, cap, scored), self._prompt_lane(v, cap, scored)) for v in new_views
                   if v.enables is Phase.PREFILL]
            ready = [(float(pr.values(cap)[i]), pr.lane(i, cap)) for i in range(pr.n)
                     if pr.scores_wanted[i] == scored and pr.work(cap)[i] > 0]
            return [_Population.of([x for x in new if x[0] > 0], ready, b2)]
        new_dec = [self._new_decoder(v, g2, u) for v in new_views if v.enables is Phase.DECODE]
        ready_dec = []
        if d.n:
            widths, vals, _, _, _ = d.table(g2.token_capacity, g2.proposal_depth)
            ready_dec = list(zip((vals + d.age_rate * u).tolist(), d.lanes(range(d.n), widths, u)))
        shapes = [_Population.of(new_dec, ready_dec, b2)]
        if g2.kind is GraphKind.MIXED:
            cap = g2.prefill_capacity
            for i in range(pr.n):
                if pr.work(cap)[i] > 0 and not pr.scores_wanted[i]:
                    shapes.append(_Population.of(new_dec, ready_dec, b2 - 1, fixed=[pr.lane(i, cap)]))
            for v in new_views:
                if v.enables is Phase.PREFILL and self._prompt_value(v, cap) > 0:
                    shapes.append(_Population.of(new_dec, ready_dec, b2 - 1,
                                                 fixed=[self._prompt_lane(v, cap)], fixed_new=True))
        return shapes

    def _pairs(self, g1: GraphDescriptor, group: list[RequestView], singles: list[RequestView]) -> list[ScoredRow]:
        rows = []
        t1 = self.duration(g1)
        terminals = self.terminals if g1.kind is GraphKind.SNAPSHOT else []
        t_ages = np.array([v.terminal_age_ms for v in terminals])
        for enables in (Phase.DECODE, Phase.PREFILL):
            new_views = [v for v in singles if v.enables is enables]
            if not new_views:
                continue
            for g2 in self._following_graphs(enables):
                f = self.duration(g2)
                unknown = t1 is None or f is None
                u = 0.0 if unknown else t1 + f
                term_vals = self.dec.terminal_lane(t_ages, 0.0 if unknown else t1)
                if not unknown:
                    # Terminal rows finish at T: their age stops there, saving the waiting cost
                    # they would otherwise accrue over the rest of the sequence.
                    term_vals = term_vals + self.dec.terminal_age * (t_ages * f + 0.5 * (u * u - t1 * t1))
                if self._is_ragged(g2):
                    row = self._ragged_pair_row(g1, g2, group, new_views, terminals, term_vals, t1, f, u, unknown)
                    if row is not None:
                        rows.append(row)
                    continue
                for pop in self._populations(g2, new_views, u):
                    row = self._pair_row(g1, g2, group, terminals, term_vals, pop, t1, f, u, unknown)
                    if row is not None:
                        rows.append(row)
        return rows

    def _pair_row(self, g1, g2, group, terminals, term_vals, pop: _Population, t1, f, u, unknown):
        room1 = g1.batch_capacity - (1 if pop.fixed_new else 0)
        res = utility.best_pair(pop.new_vals, pop.ready_vals, term_vals, room1, pop.room,
                                min_new=0 if pop.fixed_new else 1)
        if res is None:
            return None
        total, k, jr, jt = res
        new_lanes = [pop.new_lanes[i] for i in np.argsort(-pop.new_vals, kind="stable")[:k]]
        ready_lanes = [pop.ready_lanes[i] for i in np.argsort(-pop.ready_vals, kind="stable")[:jr]]
        enabled = {l.rid for l in new_lanes} | ({l.rid for l in pop.fixed} if pop.fixed_new else set())
        return self._sequence_row(g1, g2, group, enabled, terminals, term_vals, jt, pop.fixed + new_lanes + ready_lanes,
                                  total + pop.fixed_value, t1, f, u, unknown)

    def _ragged_pair_row(self, g1, g2, group, new_views, terminals, term_vals, t1, f, u, unknown):
        """A prerequisite followed by a ragged speculative program, whose aggregate rows P bind
        the cohort as well as B: exact for host allocation in fixed mode (``best_ragged_pair``),
        the adaptive orderings priced by the resulting causal allocation otherwise, in both
        cases with at least one newly ready row and the prerequisite's rows shared with terminal
        rows."""
        views = [v for v in new_views if v.enables is Phase.DECODE]
        if not views:
            return None
        d = self.decoders
        new = _Decoders(views, self.dec, self.prepared.max_width, self.prepared.max_depth)
        # Newly ready streams use their individual future-delivery reference sigma_i = U; every
        # served age resets at U.
        new_rest = new.pd + self.dec.decode_age * u * (np.array([v.age_ms for v in views]) + u)
        ready_rest = d.base + d.age_rate * u if d.n else np.zeros(0)
        width, depth = g2.token_capacity, g2.proposal_depth
        w_new = new.widths(width, depth)
        w_ready = d.widths(width, depth) if d.n else np.zeros(0, dtype=np.int64)
        room1 = g1.batch_capacity
        device = g2.allocation is Allocation.PREFIX_LIMIT
        if self.inp.mode is DecodeMode.FIXED:
            v_new = new.po * new.expected[np.arange(new.n), w_new] + new_rest
            v_ready = d.po * d.expected[np.arange(d.n), w_ready] + ready_rest if d.n else np.zeros(0)
            res = utility.best_ragged_pair(v_new, w_new, v_ready, w_ready, term_vals, room1, g2.batch_capacity,
                                           g2.target_capacity)
            if res is None:
                return None
            _, new_idx, ready_idx, jt = res
            rows_new, rows_ready = w_new, w_ready
        else:
            n_new = new.n
            base = np.concatenate([new.po + new_rest, d.po + ready_rest]) if d.n else new.po + new_rest
            ext = np.vstack([new.extension, d.extension]) if d.n else new.extension
            ceil = np.concatenate([w_new, w_ready])
            key = (np.vstack([new.forecast, d.forecast]) if d.n else new.forecast) if device else ext
            slots = np.concatenate([new.slot, d.slot]) if d.n else new.slot
            by_slot = np.argsort(slots, kind="stable")
            lanes_order, depths_order = prefix_allocation_order(key[by_slot],
                                                                np.minimum(ceil[by_slot], ext.shape[1] + 1))
            term_sorted = np.sort(term_vals)[::-1]
            pt = np.concatenate([[0.0], np.cumsum(term_sorted)])
            ks = np.arange(min(room1, n_new) + 1)
            bonus = pt[np.minimum(room1 - ks, term_sorted.size)]
            bonus[0] = -np.inf  # at least one newly ready row
            is_new = np.arange(ceil.size) < n_new
            _, cohort, alloc = utility.adaptive_ragged(base, ext, ceil, by_slot[lanes_order], depths_order,
                                                       g2.batch_capacity, g2.target_capacity, new=is_new,
                                                       new_bonus=bonus)
            if not cohort:
                return None
            new_idx = [i for i in cohort if i < n_new]
            ready_idx = [i - n_new for i in cohort if i >= n_new]
            jt = int(min(room1 - len(new_idx), term_sorted.size))
            rows_new, rows_ready = alloc[:n_new], alloc[n_new:]

        def lane(group_: _Decoders, rest, i, rows, ceiling) -> Lane:
            expected = float(group_.expected[i, int(rows)])
            return Lane(int(group_.rid[i]), int(group_.slot[i]), LaneRole.DECODE,
                        query_length=0 if device else int(rows), ceiling=int(ceiling) if device else 0,
                        expected_tokens=expected, value=float(group_.po[i] * expected + rest[i]))

        new_lanes = [lane(new, new_rest, i, rows_new[i], w_new[i]) for i in new_idx]
        ready_lanes = [lane(d, ready_rest, i, rows_ready[i], w_ready[i]) for i in ready_idx]
        total = sum(l.value for l in new_lanes + ready_lanes) + float(np.sort(term_vals)[::-1][:jt].sum())
        return self._sequence_row(g1, g2, group, {l.rid for l in new_lanes}, terminals, term_vals, jt,
                                  new_lanes + ready_lanes, total, t1, f, u, unknown)

    def _sequence_row(self, g1, g2, group, enabled: set, terminals, term_vals, jt: int, follow: list,
                      numerator: float, t1, f, u, unknown) -> ScoredRow:
        """The prerequisite's lanes (the rows it enables, the jt best terminal rows, then free
        rows) and the two-stage score over U = T + F."""
        first = [Lane(v.rid, v.slot, LaneRole.PREREQUISITE) for v in group if v.rid in enabled]
        first += [Lane(terminals[i].rid, terminals[i].slot, LaneRole.TERMINAL, value=float(term_vals[i]))
                  for i in np.argsort(-term_vals, kind="stable")[:jt]]
        first += self._free_rows(group, g1.batch_capacity - len(first), enabled)
        follow_lanes = tuple(follow)
        score = numerator if unknown else self.dec.sequence_rate(numerator, u)
        sig = (g1.kind, tuple(sorted(l.work for l in first)), g2.key, tuple(sorted(l.work for l in follow_lanes)))

        def build() -> Candidate:
            following = Candidate(graph=g2, lanes=follow_lanes, duration_ms=f, score=0.0,
                                  useful_value=float(sum(l.value for l in follow_lanes)),
                                  log_scale=self.dec.log_scale)
            return Candidate(graph=g1, lanes=tuple(first), duration_ms=t1, score=float(score),
                             useful_value=float(numerator), log_scale=self.dec.log_scale,
                             stale=self.costs.is_stale(g1.key, self.inp.now_ns),
                             following=following, sequence_ms=None if unknown else u)

        return ScoredRow(g1, float(score), t1, sig, build)

    def _continuations(self, g1: GraphDescriptor, group: list[RequestView]) -> ScoredRow | None:
        """Chains with more prerequisite stages: each row contributes V*T/(T+F)."""
        multis = [v for v in group if len(v.prerequisites) > 1]
        if not multis:
            return None
        t1 = self.duration(g1)
        contrib = []
        for v in multis:
            value, further = self._continuation(v)
            if t1 is None or further is None:
                contrib.append(value)  # unknown durations compare optimistically by value
            else:
                contrib.append(value * t1 / (t1 + further))
        contrib = np.array(contrib)
        order = np.argsort(-contrib, kind="stable")[: g1.batch_capacity]

        def lanes():
            out = [Lane(multis[i].rid, multis[i].slot, LaneRole.PREREQUISITE, value=float(contrib[i]))
                   for i in order]
            return out + self._free_rows(group, g1.batch_capacity - len(out), {l.rid for l in out})

        sig = (g1.kind, "continuation", tuple(sorted(multis[i].rid for i in order)))
        return self.row(g1, float(contrib[order].sum()), 0.0, sig, lanes)

    def _continuation(self, v: RequestView) -> tuple[float, float | None]:
        """(V, F): the request's value once ready and the further time until it is earned.

        F sums the fastest known duration of each remaining prerequisite kind and the following
        inference; V is the first inference's value (the best prefill chunk by value rate, or a
        width-one decode step with its delivery and age terms).
        """
        further = 0.0
        for kind in v.prerequisites[1:]:
            known = [t for g in self.prepared.graphs if g.kind is kind and (t := self.duration(g)) is not None]
            if not known:
                further = None
                break
            further += min(known)
        if v.enables is Phase.PREFILL:
            # The best measured chunk by value rate; with none measured, the most valuable one.
            options = [(self._prompt_value(v, g.token_capacity, g.kind is GraphKind.SCORED_PREFILL), self.duration(g))
                       for g in self.prepared.prefill]
            known = [(val / t, val, t) for val, t in options if val > 0 and t is not None]
            if known:
                _, val, t = max(known)
            else:
                val, t = max([val for val, _ in options] + [0.0]), None
        else:
            known = [t for g in self.prepared.delivery if (t := self.duration(g)) is not None]
            t = min(known) if known else None
            total = None if (further is None or t is None) else further + t
            po, pd = float(self.dec.scaled(v.log_output_price)), float(self.dec.scaled(v.log_delivery_price))
            val = po + pd + (0.0 if total is None else self.dec.decode_age * total * (v.age_ms + total))
        if further is None or t is None:
            return val, None
        return val, further + t

    def rows(self) -> list[ScoredRow]:
        return _prune(self.generation() + self.prefill() + self.mixed() + self.terminal()
                      + self.prerequisites(), self.prepared)


def scored(inp: SelectionInput) -> list[ScoredRow]:
    """Every program's best non-dominated candidate(s), scored but not yet materialised."""
    return _Selection(inp).rows()


def candidates(inp: SelectionInput) -> list[Candidate]:
    """Every program's best non-dominated candidate(s), materialised."""
    return [r.build() for r in scored(inp)]


def recency(views: Sequence[RequestView]) -> dict[int, int]:
    return {v.rid: v.last_selected_ns for v in views}


def best(cands: Sequence[Candidate], views: Sequence[RequestView]) -> Candidate | None:
    """The preferred candidate of a materialised list (spec order)."""
    rec = recency(views)
    winner = None
    for c in cands:
        if winner is None or better(c, winner, rec):
            winner = c
    return winner


def select(inp: SelectionInput) -> Candidate | None:
    """The preferred candidate, or None when nothing is runnable.

    Only the leading rows (all indeterminate ones, or those within the tie tolerance of the
    best score) are materialised and compared in full.
    """
    rows = _Selection(inp).rows()
    if not rows:
        return None
    pool = [r for r in rows if r.indeterminate] or rows
    top = max(r.score for r in pool)
    tied = [r for r in pool if utility.nearly_equal(r.score, top)]
    return best([r.build() for r in tied], inp.views)
