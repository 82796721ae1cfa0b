"""Prerequisite programs: initialize, restore, vision and window snapshots before other work
(spec, "Prerequisites and completion").

A prerequisite earns nothing itself; it is scored by the inference it enables:

- requests with one prerequisite left: the exact fixed-pair two-stage calculation against every
  following inference shape (``following``), scored over U = T + F with output ages resetting
  at the following graph's completion and terminal rows' ages stopping at T;
- longer chains: the individual continuation index V*T/(T+F), where V is the request's value
  once ready and F the further time until it is earned.

Unused prerequisite capacity advances further blocked rows at no extra physical cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.follower_rows import DecoderRows
from helios_jax.scheduler.policy.following import (
    FollowerCohort,
    Pair,
    Population,
    following_graphs,
    is_ragged,
    population_choice,
    population_cohort,
    populations,
    prefill_population,
    prompt_value,
    ragged_cohort,
)
from helios_jax.scheduler.policy.ranking import ScoredCandidate, pair_dominated
from helios_jax.scheduler.policy.selection import Selection, free_prerequisite_rows, free_prerequisite_views
from helios_jax.scheduler.utility import PairCohort
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase, RequestView


class Sequence(NamedTuple):
    """A two-stage sequence candidate, scored; its row (lanes, dominance signature) built on
    demand. `key`: (prerequisite kind, enabled phase, :func:`follower_class`, the follower's
    lane count), the sequences whose rows may share a dominance signature."""

    key: tuple
    prerequisite: GraphDescriptor
    following: GraphDescriptor
    score: float
    determinate: bool
    row: Callable[[], ScoredCandidate]


Entry = ScoredCandidate | Sequence  # a prerequisite family's row, or one still to build


def prerequisite_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Each prerequisite program's two-stage sequences and continuation candidate."""
    return [e.row() if isinstance(e, Sequence) else e for e in prerequisite_entries(sel)]


def prerequisite_entries(sel: Selection) -> list[Entry]:
    """:func:`prerequisite_candidates`, with the sequences' rows not yet built."""
    if not sel.blocked:
        return []
    found: list[Entry] = []
    groups: dict = {}  # prerequisite kind -> (its blocked group, their single-stage rows)
    followers: dict = {}  # (kind, enables) -> its live followers (what does not depend on g1)
    for g1 in sel.prepared.prerequisites:
        if g1.kind not in groups:
            group = [v for v in sel.blocked if v.prerequisites[0] is g1.kind]
            groups[g1.kind] = group, [v for v in group if len(v.prerequisites) == 1]
        group, singles = groups[g1.kind]
        if not group:
            continue
        found.extend(_sequence_candidates(sel, g1, group, singles, followers))
        candidate = _continuation_candidate(sel, g1, group)
        if candidate is not None:
            found.append(candidate)
    return found


def bounded_entries(
    sel: Selection, entries: list[Entry], floor: float | None, fresh: bool
) -> list[ScoredCandidate]:
    """The rows of `entries` that could matter against `floor` (None: every row), in order.

    A sequence whose score is below the floor by more than four times the tie tolerance is
    neither :func:`selector.select`'s choice nor in its tie set (the floor is at most the best
    row's score), so its row is not built, unless it is indeterminate, or its prerequisite's
    estimate is stale and `fresh` (a timing refresh reads stale rows whatever their score).
    Dominance stays exact: a sequence's row can share a signature only with sequences of the
    same key, so every sequence of that key whose pair of shapes dominates a kept one's
    (``ranking.pair_dominated``) is kept as well (the dominator relation holds every smaller
    shape: one pass closes it)."""
    if floor is None:
        return [e.row() if isinstance(e, Sequence) else e for e in entries]
    keep = [
        not isinstance(e, Sequence)
        or not e.determinate
        or (fresh and sel.is_stale(e.prerequisite))
        or not _below(e.score, floor)
        for e in entries
    ]
    dominators = sel.prepared.dominator_ids
    kept: dict[tuple, list[tuple[GraphDescriptor, GraphDescriptor]]] = {}  # key -> kept pairs
    for e, k in zip(entries, keep):
        if k and isinstance(e, Sequence):
            kept.setdefault(e.key, []).append((e.prerequisite, e.following))
    for i, e in enumerate(entries):
        if not keep[i] and isinstance(e, Sequence):
            mine = [(e.prerequisite, e.following)]
            keep[i] = any(pair_dominated(g1, g2, mine, dominators) for g1, g2 in kept.get(e.key, ()))
    return [(e.row() if isinstance(e, Sequence) else e) for e, k in zip(entries, keep) if k]


def surviving_floor(sel: Selection, entries: list[Entry], tries: int = 4) -> float | None:
    """A floor for :func:`bounded_entries` when no other row is built: the score of the best
    determinate sequence whose row no other sequence drops by dominance (at most the best row's
    score), found among the `tries` best-scored ones; None when every sequence is not
    determinate or none of those survives.

    A sequence can be dropped only by one of its key whose pair of shapes dominates its own and
    whose row has the same signature (``ranking.pair_dominated``): those rows are built and
    compared."""
    sequences = [e for e in entries if isinstance(e, Sequence)]
    if not sequences or not all(e.determinate for e in sequences):
        return None
    dominators = sel.prepared.dominator_ids
    for s in sorted(sequences, key=lambda e: -e.score)[:tries]:
        rivals = [
            t
            for t in sequences
            if t.key == s.key
            and pair_dominated(s.prerequisite, s.following, [(t.prerequisite, t.following)], dominators)
        ]
        signature = s.row().signature
        if not any(t.row().signature == signature for t in rivals):
            return s.score
    return None


def _below(score: float, floor: float) -> bool:
    if math.isinf(floor):
        return floor > 0  # an indeterminate row outranks every determinate one
    return score < floor - 4.0 * utility.REL_TIE * max(1.0, abs(score), abs(floor))


def _sequence_candidates(
    sel: Selection,
    g1: GraphDescriptor,
    group: list[RequestView],
    singles: list[RequestView],
    followers: dict,
) -> list[Entry]:
    """Every (g1, following shape) pair's best joint cohort, as two-stage sequence candidates.

    What a follower's rows are worth depends on g1 only through the sequence's length (a
    decode-like follower's age terms) or not at all (a prefill follower's): the followers of
    each prerequisite kind and enabled phase are resolved once for every g1 of the kind
    (:func:`_live_followers`, kept in `followers`), and only the pair's timing, the
    decode-like populations and the ragged cohorts are computed per g1.

    A g1 with a smaller prepared shape of its kind that holds the whole group offers no
    sequence when it finishes no terminal row (:func:`_carried`, RESOLUTIONS 37): it is
    redundant padding, whatever cohort its own measured time would make best."""
    terminals = sel.terminals if g1.kind is GraphKind.SNAPSHOT else []
    if not terminals and _carried(sel, g1, len(group)):
        return []
    found: list[Entry] = []
    terminal_ages = np.array([v.terminal_age_ms for v in terminals])
    for enables in (Phase.DECODE, Phase.PREFILL):
        live = followers.get((g1.kind, enables))
        if live is None:
            live = followers[(g1.kind, enables)] = _live_followers(sel, enables, singles)
        for follower in live:
            g2 = follower.graph
            pair = _pair(sel, g1, g2, group, terminals, terminal_ages)
            if follower.rows is None:  # ragged: its joint cohort, solved for this pair
                cohort = ragged_cohort(sel, pair, follower.new_views)
                if cohort is not None:
                    found.append(_sequence_candidate(sel, pair, cohort))
                continue
            if isinstance(follower.rows, Population):  # a prefill follower's, whatever g1
                shapes = [follower.rows]
            else:
                shapes = populations(sel, g2, follower.new_views, pair.total_ms, follower.rows)
            found.extend(_scored_sequences(sel, (g1.kind, enables, follower.cls), pair, shapes))
    return found


class _Follower(NamedTuple):
    """A following shape of one prerequisite kind and enabled phase, as far as it does not
    depend on the prerequisite's shape."""

    graph: GraphDescriptor
    new_views: list[RequestView]  # the rows the prerequisite enables into this phase
    rows: Population | DecoderRows | None  # a prefill follower's population, a decode-like
    # follower's rows (its populations depend on U), None for a ragged follower
    cls: tuple  # follower_class(graph)


def _live_followers(sel: Selection, enables: Phase, singles: list[RequestView]) -> list[_Follower]:
    """The following shapes a prerequisite may enable `enables` rows of `singles` (its kind's
    blocked rows with no other prerequisite left) into, in ``following_graphs``' order, less
    those with nothing to serve whatever the prerequisite's shape: a prefill follower none of
    whose enabled prompts is worth a chunk, a decode-like non-mixed one with no enabled
    decoder. A prefill follower's population depends on the chunk and whether the follower is
    measured, not on its batch capacity (its room), so followers of one chunk share it; a
    decode-like follower's rows depend on its steps and lane width only."""
    new_views = [v for v in singles if v.enables is enables]
    if not new_views:
        return []
    live = []
    chunks: dict[tuple, Population] = {}
    rows_by_shape: dict[tuple, DecoderRows] = {}
    for g2 in following_graphs(sel, enables):
        rows: Population | DecoderRows | None
        if is_ragged(g2):
            rows = None
        elif g2.kind.is_prefill:
            chunk = (g2.kind, g2.token_capacity, sel.costs.is_known(g2.key))
            if chunk not in chunks:
                chunks[chunk] = prefill_population(sel, g2, new_views)
            rows = chunks[chunk].with_room(g2.batch_capacity)
            if not len(rows.new_values):  # no row it enables is worth a chunk here
                continue
        else:
            shape = (g2.steps, g2.token_capacity, g2.proposal_depth)
            if shape not in rows_by_shape:
                rows_by_shape[shape] = DecoderRows(sel, g2, new_views)
            rows = rows_by_shape[shape]
            if not rows.views and g2.kind is not GraphKind.MIXED:  # none it enables
                continue
        live.append(_Follower(g2, new_views, rows, follower_class(g2)))
    return live


def _carried(sel: Selection, g1: GraphDescriptor, group_size: int) -> bool:
    """Whether a smaller prepared shape of g1's kind (a dominator) holds all `group_size` blocked
    rows of the kind. Then, with no terminal rows, the smaller shape runs the same prerequisite
    rows (the group, nothing left to advance) and can run every follower cohort g1 can: g1's
    sequences differ from its only through g1's measured time, which changes a decode-like
    follower's cohort through the sequence's length (its rows' age terms), never through work
    g1 does. A prefill follower's cohort does not depend on g1 at all (no age term), so its
    sequence after g1 is dropped by dominance anyway (``ranking.pair_dominated``)."""
    return any(h.batch_capacity >= group_size for h in sel.prepared.dominators[g1])


def follower_class(g2: GraphDescriptor) -> tuple:
    """What two sequences' followers must share for their rows to be compared by dominance
    (with equal work): the kind, allocation and proposal depth a generation row's signature
    holds, and whether rows are host-ragged (those sequences are built before the others are
    bounded, ``selector.bounded_rows``, so the two never share a signature)."""
    return (g2.kind, g2.allocation, g2.proposal_depth, g2.speculative, is_ragged(g2))


def _scored_sequences(sel: Selection, key: tuple, pair: Pair, shapes: list[Population]) -> list[Sequence]:
    """Each population shape's joint cohort, scored as :func:`_sequence_candidate` scores it."""
    out = []
    for pop in shapes:
        res = population_choice(pair, pop)
        if res is None:
            continue
        score = _sequence_score(sel, pair, res.total + pop.fixed_value)  # the cohort's value

        def row(pop: Population = pop, res: PairCohort = res) -> ScoredCandidate:
            return _sequence_candidate(sel, pair, population_cohort(pop, res))

        served = len(pop.fixed) + res.new_count + res.ready_count  # the follower's lanes
        out.append(
            Sequence(
                (*key, served),
                pair.prerequisite,
                pair.following,
                float(score),
                pair.prerequisite_ms is not None,
                row,
            )
        )
    return out


def _sequence_score(sel: Selection, pair: Pair, value: float) -> float:
    """A two-stage sequence's score: its value rate over U = T + F, or its value when either
    duration is unknown."""
    return value if pair.unknown else sel.decision.sequence_rate(value, pair.total_ms)


def _pair(
    sel: Selection,
    g1: GraphDescriptor,
    g2: GraphDescriptor,
    group: list[RequestView],
    terminals: list[RequestView],
    terminal_ages: np.ndarray,
) -> Pair:
    decision = sel.decision
    t1, f = sel.duration(g1), sel.duration(g2)
    if t1 is None or f is None:
        return Pair(g1, g2, group, terminals, decision.terminal_lane(terminal_ages, 0.0), t1, f, 0.0)
    u = t1 + f
    if not terminals:  # no terminal row to value
        return Pair(g1, g2, group, terminals, terminal_ages, t1, f, u)
    # Terminal rows finish at T: their age stops there, saving the waiting cost they would
    # otherwise accrue over the rest of the sequence.
    values = decision.terminal_lane(terminal_ages, t1)
    values = values + decision.terminal_age * (terminal_ages * f + 0.5 * (u * u - t1 * t1))
    return Pair(g1, g2, group, terminals, values, t1, f, u)


def _sequence_candidate(sel: Selection, pair: Pair, cohort: FollowerCohort) -> ScoredCandidate:
    """The prerequisite's lanes (the rows it enables, the best terminal rows, then free rows)
    and the two-stage score over U = T + F. Its lanes are built with the candidate (`build`);
    the dominance signature reads their work, which the rows give without them."""
    g1, g2, decision = pair.prerequisite, pair.following, sel.decision
    terminals, values = pair.terminals, pair.terminal_values
    enabled = [v for v in pair.group if v.rid in cohort.enabled]
    finished = np.argsort(-values, kind="stable")[: cohort.terminal_count] if cohort.terminal_count else ()
    free = free_prerequisite_views(
        pair.group, g1.batch_capacity - len(enabled) - len(finished), cohort.enabled
    )
    follow_lanes = tuple(cohort.lanes)
    value = cohort.value
    score = _sequence_score(sel, pair, value)
    # The prerequisite's rows consume no tokens: (rid, role) is all of their work.
    prerequisite, terminal = LaneRole.PREREQUISITE.value, LaneRole.TERMINAL.value
    first_work = [(v.rid, prerequisite) for v in enabled + free]
    first_work += [(terminals[i].rid, terminal) for i in finished]
    signature = (
        g1.kind,
        tuple(sorted(first_work)),
        follower_class(g2),
        tuple(sorted(lane.work for lane in follow_lanes)),
    )

    def first() -> tuple[Lane, ...]:
        lanes = [Lane(v.rid, v.slot, LaneRole.PREREQUISITE) for v in enabled]
        lanes += [
            Lane(terminals[i].rid, terminals[i].slot, LaneRole.TERMINAL, value=float(values[i]))
            for i in finished
        ]
        return tuple(lanes + [Lane(v.rid, v.slot, LaneRole.PREREQUISITE, value=0.0) for v in free])

    def build() -> Candidate:
        following = Candidate(
            graph=g2,
            lanes=follow_lanes,
            duration_ms=pair.following_ms,
            score=0.0,
            useful_value=float(sum(lane.value for lane in follow_lanes)),
            log_scale=decision.log_scale,
        )
        return Candidate(
            graph=g1,
            lanes=first(),
            duration_ms=pair.prerequisite_ms,
            score=float(score),
            useful_value=float(value),
            log_scale=decision.log_scale,
            stale=sel.is_stale(g1),
            following=following,
            sequence_ms=None if pair.unknown else pair.total_ms,
        )

    return ScoredCandidate(g1, float(score), pair.prerequisite_ms, signature, build, following=g2)


def _continuation_candidate(
    sel: Selection, g1: GraphDescriptor, group: list[RequestView]
) -> ScoredCandidate | None:
    """Chains with more prerequisite stages: each row contributes V*T/(T+F)."""
    multis = [v for v in group if len(v.prerequisites) > 1]
    if not multis:
        return None
    t1 = sel.duration(g1)
    shares = []
    for v in multis:
        value, further = _continuation(sel, v)
        if t1 is None or further is None:
            shares.append(value)  # unknown durations compare optimistically by value
        else:
            shares.append(value * t1 / (t1 + further))
    contributions = np.array(shares)
    order = np.argsort(-contributions, kind="stable")[: g1.batch_capacity]

    def lanes() -> list[Lane]:
        out = [
            Lane(multis[i].rid, multis[i].slot, LaneRole.PREREQUISITE, value=float(contributions[i]))
            for i in order
        ]
        return out + free_prerequisite_rows(group, g1.batch_capacity - len(out), {lane.rid for lane in out})

    signature = (g1.kind, "continuation", tuple(sorted(multis[i].rid for i in order)))
    return sel.score(g1, float(contributions[order].sum()), 0.0, signature, lanes)


def _continuation(sel: Selection, v: RequestView) -> tuple[float, float | None]:
    """(V, F): the request's value once ready and the further time until it is earned.

    F sums the fastest known duration of each remaining prerequisite kind and the following
    inference; V is the first inference's value (the best prefill chunk by value rate, or a
    width-one decode step with its delivery and age terms).
    """
    further = _further_prerequisites_ms(sel, v)
    if v.enables is Phase.PREFILL:
        value, t = _first_prefill(sel, v)
    else:
        known = [t for g in sel.prepared.delivery if (t := sel.duration(g)) is not None]
        t = min(known) if known else None
        total = None if (further is None or t is None) else further + t
        output_price = float(sel.decision.scaled(v.log_output_price))
        delivery_price = float(sel.decision.scaled(v.log_delivery_price))
        age = 0.0 if total is None else sel.decision.decode_age * total * (v.age_ms + total)
        value = output_price + delivery_price + age
    if further is None or t is None:
        return value, None
    return value, further + t


def _further_prerequisites_ms(sel: Selection, v: RequestView) -> float | None:
    """The fastest known duration of each prerequisite after the next one (None: one unknown)."""
    further = 0.0
    for kind in v.prerequisites[1:]:
        known = [t for g in sel.prepared.graphs if g.kind is kind and (t := sel.duration(g)) is not None]
        if not known:
            return None
        further += min(known)
    return further


def _first_prefill(sel: Selection, v: RequestView) -> tuple[float, float | None]:
    """(value, duration) of the first prefill chunk: the best measured one by value rate; with
    none measured, the most valuable one."""
    options = [
        (prompt_value(sel, v, g.token_capacity, g.kind is GraphKind.SCORED_PREFILL), sel.duration(g))
        for g in sel.prepared.prefill
    ]
    known = [(value / t, value, t) for value, t in options if value > 0 and t is not None]
    if known:
        _, value, t = max(known)
        return value, t
    return max([value for value, _ in options] + [0.0]), None
