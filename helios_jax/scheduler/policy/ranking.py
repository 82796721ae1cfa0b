"""Scored candidates, the dominance filter and the spec's tie order.

Order: an indeterminate candidate beats any determinate one; then the higher score (value rate,
or useful value for indeterminate ones); equal values prefer the shorter known time, more served
requests, less recently used requests, and smaller physical padding, in that order.

Dominance: among candidates of the same kind, cohort and logical per-request work (mixed: also
the same prompt row and prompt work; speculative: the same proposal depth), a shape whose
capacities are all at least another's, one strictly larger, is discarded, so timing noise can
never make redundant padding preferable. A two-stage sequence is a pair of shapes: it is discarded
when a sequence of the same work runs a prerequisite and a follower each the same shape or a
dominating one, not both the same (so an unmeasured larger follower cannot win on its unknown
time, nor a larger prerequisite on its measured one).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.prepared import PreparedGraphs, capacities
from helios_jax.scheduler.view import Candidate, RequestView
from helios_jax.scheduler.view_columns import ResidentViews

# A dominance group: candidates with equal signatures do the same logical work (None: never compared).
Signature = Hashable | None


class ScoredCandidate:
    """A scored candidate whose lanes are built on demand (``build()``); `following`: a two-stage
    sequence's follower program (None for every other row)."""

    __slots__ = ("_build", "duration_ms", "following", "graph", "score", "signature")

    def __init__(
        self,
        graph: GraphDescriptor,
        score: float,
        duration_ms: float | None,
        signature: Signature,
        build: Callable[[], Candidate],
        following: GraphDescriptor | None = None,
    ):
        self.graph = graph
        self.following = following
        self.score = score
        self.duration_ms = duration_ms
        self.signature = signature
        self._build = build

    def build(self) -> Candidate:
        return self._build()

    @property
    def indeterminate(self) -> bool:
        return self.duration_ms is None


def prune_dominated(candidates: list[ScoredCandidate], prepared: PreparedGraphs) -> list[ScoredCandidate]:
    """The dominance filter within groups of equal kind, cohort and logical work."""
    groups: dict[Hashable, list[ScoredCandidate]] = {}
    for r in candidates:
        signature = r.signature
        if signature is not None:
            group = groups.get(signature)
            if group is None:
                groups[signature] = [r]
            else:
                group.append(r)
    dominators = prepared.dominator_ids
    dropped = set()
    for group in groups.values():
        if len(group) > 1:
            present = {id(o.graph) for o in group}
            pairs = [(o.graph, o.following) for o in group]
            for r in group:
                if r.following is not None:
                    if pair_dominated(r.graph, r.following, pairs, dominators):
                        dropped.add(id(r))
                elif not dominators[id(r.graph)].isdisjoint(present):
                    dropped.add(id(r))
    return [r for r in candidates if id(r) not in dropped] if dropped else list(candidates)


def dominated(row: ScoredCandidate, others: Iterable[ScoredCandidate], prepared: PreparedGraphs) -> bool:
    """Whether :func:`prune_dominated` drops `row`, a single-program row that dominates none of
    `others`, from `others` and `row` together: a row of its group runs a dominating program."""
    if row.signature is None:
        return False
    dominators = prepared.dominator_ids[id(row.graph)]
    return any(o.signature == row.signature and id(o.graph) in dominators for o in others)


def pair_dominated(
    g1: GraphDescriptor,
    g2: GraphDescriptor,
    pairs: Iterable[tuple[GraphDescriptor, GraphDescriptor | None]],
    dominators: dict[int, set[int]],
) -> bool:
    """Whether one of `pairs` (of the same work) runs a prerequisite and a follower each the same
    shape as (g1, g2) or one that dominates it, and is not (g1, g2) itself."""
    first, then = dominators[id(g1)], dominators[id(g2)]
    for h1, h2 in pairs:
        if h2 is None or (h1 is g1 and h2 is g2):
            continue
        if (h1 is g1 or id(h1) in first) and (h2 is g2 or id(h2) in then):
            return True
    return False


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


def recency(views: Sequence[RequestView]) -> dict[int, int]:
    """rid -> last selection of every view."""
    return ResidentViews.of(views).recency()


def best(cands: Sequence[Candidate], views: Sequence[RequestView]) -> Candidate | None:
    """The preferred candidate of a materialised list (spec order)."""
    if len(cands) < 2:  # nothing to compare (the views' recency is read only for a tie)
        return cands[0] if cands else None
    rec = recency(views)
    winner = None
    for c in cands:
        if winner is None or better(c, winner, rec):
            winner = c
    return winner
