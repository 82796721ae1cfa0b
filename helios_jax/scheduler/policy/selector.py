"""The selection entry points: every family's candidates, pruned, and the preferred one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.batchprefill import batch_prefill_candidates
from helios_jax.scheduler.policy.generation import (
    Deferred,
    adaptive_ragged_candidate,
    generation_candidates,
    ragged_dual_value,
    ragged_upper_value,
)
from helios_jax.scheduler.policy.mixed import mixed_candidates, mixed_upper_rates
from helios_jax.scheduler.policy.prefill import prefill_candidates
from helios_jax.scheduler.policy.prerequisites import (
    bounded_entries,
    prerequisite_candidates,
    prerequisite_entries,
    surviving_floor,
)
from helios_jax.scheduler.policy.ranking import ScoredCandidate, best, dominated, prune_dominated
from helios_jax.scheduler.policy.selection import Selection, SelectionInput
from helios_jax.scheduler.policy.snapshots import terminal_candidates
from helios_jax.scheduler.view import Candidate


def scored(inp: SelectionInput, sel: Selection | None = None) -> list[ScoredCandidate]:
    """Every program's best non-dominated candidate(s), scored but not yet materialised
    (`sel`: ``Selection(inp)`` when the caller built it already)."""
    sel = Selection(inp) if sel is None else sel
    found = (
        generation_candidates(sel) + _prompt_families(sel) + mixed_candidates(sel) + _capture_families(sel)
    )
    return prune_dominated(found, sel.prepared)


def selection_rows(inp: SelectionInput) -> tuple[Selection, list[ScoredCandidate]]:
    """``Selection(inp)`` and its rows, for a caller that reads them more than once
    (``Scheduler._plan``: the ordinary choice, a refresh alternative, a probe's tables).

    The rows are :func:`scored`'s but for fresh adaptive ragged and mixed rows that cannot reach
    the best row's score (:func:`bounded_rows`), which neither :func:`select` (they are below
    the tie tolerance of its best) nor a refresh alternative (it reads stale rows only) would
    read. They are not kept on the selection: their builders refer to it, and the cycle would
    leave every decision's tables to the cyclic garbage collector."""
    sel = Selection(inp)
    return sel, bounded_rows(sel, _best_score, fresh=True)


def _best_score(rows: list[ScoredCandidate]) -> float | None:
    """What a determinate row must reach to matter to :func:`select`: the best score (an
    indeterminate row takes precedence over every determinate one: inf)."""
    if not rows:
        return None
    if any(r.indeterminate for r in rows):
        return math.inf
    return max(r.score for r in rows)


def bounded_rows(
    sel: Selection, floor_of: Callable[[list[ScoredCandidate]], float | None], *, fresh: bool
) -> list[ScoredCandidate]:
    """:func:`scored`'s rows without those that cannot reach `floor_of` the other rows (None:
    no floor): each adaptive ragged row whose upper bounds (``generation.ragged_upper_value``,
    ``ragged_dual_value``) fall below it is left out before its cohort search, and the mixed
    family when every shape's bound does (``mixed.mixed_upper_rates``), and a prerequisite's
    two-stage sequences scored below it before their rows are built
    (``prerequisites.bounded_entries``); `fresh`: only programs whose estimate is fresh may be
    left out. The rows kept are in :func:`scored`'s order.

    Exact: a row left out scores below the floor by more than the tie tolerance and the bound's
    rounding; the ragged programs left out dominate none (``generation.boundable``), mixed
    programs dominate only mixed ones and a sequence only sequences of its own follower class (whose
    dominating ones are kept beside it), so every other row's dominance is unchanged."""
    parts = _first_rows(sel, floor_of, fresh)
    if not parts.deferred and not parts.mixed_later:
        return parts.rows
    floor = floor_of(parts.rows)
    ragged = [(i, c) for i, g in parts.deferred if (c := _ragged_row(sel, g, floor, fresh)) is not None]
    mixed = _later_mixed(sel, parts, floor)
    if not ragged and mixed is parts.mixed:  # nothing built after the floor
        return parts.rows
    generation = _in_place(parts.generation, ragged)
    return prune_dominated(generation + parts.prompts + mixed + parts.captures, sel.prepared)


_T = TypeVar("_T")
RaggedBuilder = Callable[[GraphDescriptor, float], ScoredCandidate | None]


def rows_with_ragged_programs(
    sel: Selection, floor: float
) -> tuple[list[ScoredCandidate | GraphDescriptor], RaggedBuilder]:
    """:func:`bounded_rows`' rows under a fixed `floor` (estimates stale or not), with each
    adaptive ragged program whose row it would build left as the program itself, in the row's
    place, for a caller that may know a higher floor by the time it reaches it (an acceptance
    probe: the best probe found before it). The second value builds such a program's row against
    a floor at least `floor` (None: it scores below it, or a kept row dominates it), so that
    taking every row it builds at `floor` gives :func:`bounded_rows`' list."""
    parts = _first_rows(sel, lambda _: floor, False)
    mixed = _later_mixed(sel, parts, floor)
    found = parts.generation + parts.prompts + mixed + parts.captures
    kept = {id(r) for r in (prune_dominated(found, sel.prepared) if parts.mixed_later else parts.rows)}
    placed = _in_place(parts.generation, parts.deferred) + parts.prompts + mixed + parts.captures
    out = [e for e in placed if isinstance(e, GraphDescriptor) or id(e) in kept]

    def build(g: GraphDescriptor, higher: float) -> ScoredCandidate | None:
        c = _ragged_row(sel, g, max(floor, higher), False)
        return None if c is None or dominated(c, found, sel.prepared) else c

    return out, build


def _in_place(
    generation: list[ScoredCandidate], deferred: list[tuple[int, _T]]
) -> list[ScoredCandidate | _T]:
    """`generation` with each deferred program's entry (its row, or the program itself) where
    its row would have been: entry k of `deferred`, (i, e), after generation[:i] and the k before."""
    out: list[ScoredCandidate | _T] = list(generation)
    for k, (i, e) in enumerate(deferred):
        out.insert(i + k, e)
    return out


class _Rows(NamedTuple):
    """The rows :func:`bounded_rows` builds before its floor: the families' lists as built,
    their rows pruned, the adaptive ragged programs deferred and whether the mixed family waits."""

    generation: list[ScoredCandidate]
    prompts: list[ScoredCandidate]
    mixed: list[ScoredCandidate]
    captures: list[ScoredCandidate]
    rows: list[ScoredCandidate]
    deferred: Deferred
    mixed_later: bool


def _first_rows(
    sel: Selection, floor_of: Callable[[list[ScoredCandidate]], float | None], fresh: bool
) -> _Rows:
    deferred: Deferred = []
    generation = generation_candidates(sel, deferred)
    prompts, terminals, sequences = _prompt_families(sel), terminal_candidates(sel), prerequisite_entries(sel)
    mixed_later = _mixed_boundable(sel, fresh)
    mixed = [] if mixed_later else mixed_candidates(sel)
    # The sequences' rows (prerequisites.bounded_entries) against the floor of every row already
    # built (the other families', the continuations' and ragged followers'), which no sequence
    # left to build can lower: it shares a signature with none of them.
    built = [e for e in sequences if isinstance(e, ScoredCandidate)]
    floor = None
    if len(built) < len(sequences):
        floor = floor_of(prune_dominated(generation + prompts + mixed + terminals + built, sel.prepared))
        if floor is None:  # nothing else built (a probe's floor is never None): a sequence's own
            floor = surviving_floor(sel, sequences)
    captures = terminals + bounded_entries(sel, sequences, floor, fresh)
    rows = prune_dominated(generation + prompts + mixed + captures, sel.prepared)
    return _Rows(generation, prompts, mixed, captures, rows, deferred, mixed_later)


def _ragged_row(
    sel: Selection, g: GraphDescriptor, floor: float | None, fresh: bool
) -> ScoredCandidate | None:
    """A deferred adaptive ragged program's row, None when its bounds fall below `floor` (a
    stale program's too unless `fresh`) or its cohort search finds none."""
    if floor is not None and not (fresh and sel.is_stale(g)) and _below(sel, g, floor):
        return None
    return adaptive_ragged_candidate(sel, g)


def _later_mixed(sel: Selection, parts: _Rows, floor: float | None) -> list[ScoredCandidate]:
    """The mixed family's rows once the floor is known (``parts.mixed`` when it did not wait)."""
    if parts.mixed_later and (floor is None or not _mixed_below(sel, floor)):
        return mixed_candidates(sel)
    return parts.mixed


def _mixed_boundable(sel: Selection, fresh: bool) -> bool:
    """Whether the mixed family may wait for the floor: it has programs and rows to offer, all
    of them measured (else their rows are indeterminate) and, `fresh`, none stale (a refresh
    alternative reads stale rows whatever their score; ``CostModel.any_stale`` over every
    loaded program first, kept across decisions)."""
    prepared = sel.prepared
    if not prepared.mixed or not (sel.decoders.count or sel.prompts.count):
        return False
    if prepared.mixed_durations(sel.costs) is None:
        return False
    if fresh and sel.costs.any_stale(prepared.graphs, sel.inp.now_ns):
        return not any(sel.is_stale(g) for g in prepared.mixed)
    return True


def _mixed_below(sel: Selection, floor: float) -> bool:
    """Whether every mixed candidate scores below `floor` by more than the tie tolerance and
    its bound's rounding (False when a mixed duration is unmeasured)."""
    bounds = mixed_upper_rates(sel)
    if bounds is None:
        return False
    if math.isinf(floor):
        return floor > 0
    rates, magnitudes = bounds
    margin = utility.REL_TIE * (2.0 * max(1.0, abs(floor)) + magnitudes)
    return bool(np.all(rates < floor - margin))


def _below(sel: Selection, g: GraphDescriptor, floor: float) -> bool:
    """Whether every adaptive ragged candidate of `g` scores below `floor` by more than the tie
    tolerance (``utility.nearly_equal``) and the rounding of its bound's sums (either bound)."""
    if math.isinf(floor):
        return floor > 0
    t = sel.duration(g)
    assert t is not None  # generation.boundable
    decision = sel.decision
    tie = 2.0 * max(1.0, abs(floor)) + 0.5 * t * abs(decision.waiting)
    for bound in (ragged_upper_value, ragged_dual_value):  # the cheaper first
        value = bound(sel, g)
        if decision.rate(value, t) < floor - utility.REL_TIE * (tie + abs(value) / t):
            return True
    return False


def _prompt_families(sel: Selection) -> list[ScoredCandidate]:
    return prefill_candidates(sel) + batch_prefill_candidates(sel)


def _capture_families(sel: Selection) -> list[ScoredCandidate]:
    return terminal_candidates(sel) + prerequisite_candidates(sel)


def candidates(inp: SelectionInput) -> list[Candidate]:
    """Every program's best non-dominated candidate(s), materialised."""
    return [r.build() for r in scored(inp)]


def select(
    inp: SelectionInput, sel: Selection | None = None, rows: list[ScoredCandidate] | None = None
) -> Candidate | None:
    """The preferred candidate, or None when nothing is runnable.

    Only the leading candidates (all indeterminate ones, or those within the tie tolerance of
    the best score) are materialised and compared in full.
    """
    found = scored(inp, sel) if rows is None else rows  # rows: scored(inp), computed already
    if not found:
        return None
    pool = [r for r in found if r.indeterminate] or found
    top = max(r.score for r in pool)
    tied = [r for r in pool if utility.nearly_equal(r.score, top)]
    return best([r.build() for r in tied], inp.views)
