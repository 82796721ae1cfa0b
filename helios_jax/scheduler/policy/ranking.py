"""Scored candidates, the dominance filter and the spec's tie order.

Order: an indeterminate candidate beats any determinate one; then the higher score (value rate,
or useful value for indeterminate ones); equal values prefer the shorter known time, more served
requests, less recently used requests, and smaller physical padding, in that order.

Dominance: among candidates of the same kind, cohort and logical per-request work (mixed: also
the same prompt row and prompt work; speculative: the same proposal depth), a shape whose
capacities are all at least another's, one strictly larger, is discarded, so timing noise can
never make redundant padding preferable.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.prepared import PreparedGraphs, capacities
from helios_jax.scheduler.view import Candidate, RequestView

# A dominance group: candidates with equal signatures do the same logical work (None: never compared).
Signature = Hashable | None


class ScoredCandidate:
    """A scored candidate whose lanes are built on demand (``build()``)."""

    __slots__ = ("_build", "duration_ms", "graph", "score", "signature")

    def __init__(
        self,
        graph: GraphDescriptor,
        score: float,
        duration_ms: float | None,
        signature: Signature,
        build: Callable[[], Candidate],
    ):
        self.graph = graph
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
            for r in group:
                if not dominators[id(r.graph)].isdisjoint(present):
                    dropped.add(id(r))
    return [r for r in candidates if id(r) not in dropped] if dropped else list(candidates)


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
    return {v.rid: v.last_selected_ns for v in views}


def best(cands: Sequence[Candidate], views: Sequence[RequestView]) -> Candidate | None:
    """The preferred candidate of a materialised list (spec order)."""
    rec = recency(views)
    winner = None
    for c in cands:
        if winner is None or better(c, winner, rec):
            winner = c
    return winner
