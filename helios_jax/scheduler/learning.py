"""Funded acceptance probes (spec, "Funded acceptance learning").

With full acceptance-learning credit and no open episode, an adaptive scheduler may replace its
ordinary winner by a probe: a complete speculative program that

1. offers some request at least one depth beyond the ordinary choice,
2. can beat the ordinary choice under its optimistic yield estimate
   (survival min(1, mean + sqrt(ln 20 / (2 * aged_weight))) in place of the means), and
3. leaves that request future output in which to use the observation.

Candidates rank by optimistic score improvement per physical execution time; equal gains prefer
the least-informed added prefix, then the shorter execution and the smaller physical geometry;
a tie in all of these keeps the candidate scored first, so the probe is deterministic.
Timing refresh takes precedence (the caller checks it first); fixed-width execution never probes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from helios_jax.catalog import DecodeMode
from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.view import Candidate, LaneRole, RequestView


def lane_width(lane) -> int:
    return max(lane.query_length, lane.ceiling)


def probe(
    inp: policy.SelectionInput,
    ordinary: Candidate,
    optimistic_views: Sequence[RequestView],
    information: Callable[[int, int, int], float],
) -> Candidate | None:
    """The best acceptance probe, or None.

    Args:
      inp: the ordinary selection input (views carry mean survival estimates).
      ordinary: the ordinary winner (determinate).
      optimistic_views: the same views with optimistic survival estimates.
      information: (rid, from_width, to_width) -> aged weight of the least-informed added depth.
    """
    if inp.mode is not DecodeMode.ADAPTIVE or ordinary.indeterminate:
        return None
    prepared = policy.as_prepared(inp.graphs)
    speculative = prepared.drafted()
    if not speculative.graphs:
        return None
    ordinary_width = {l.rid: lane_width(l) for l in ordinary.lanes if l.role is LaneRole.DECODE}
    remaining = {v.rid: v.output_remaining for v in inp.views}
    # Scored on the ordinary decision's scale: the same sigma (from every loaded program) and
    # waiting cost, so that "beats the ordinary choice" compares like with like.
    opt_inp = dataclasses.replace(inp, views=list(optimistic_views), graphs=speculative, reference=prepared)
    best, best_key = None, None
    # Only rows that beat the ordinary winner are materialised (building lanes is the cost).
    for row in policy.scored(opt_inp):
        if row.indeterminate or not row.score > ordinary.score:
            continue
        c = row.build()
        duration = c.duration_ms
        if duration is None:
            continue  # not indeterminate: built with a known duration
        added = [(l.rid, ordinary_width.get(l.rid, 1), lane_width(l)) for l in c.lanes
                 if l.role is LaneRole.DECODE and lane_width(l) > ordinary_width.get(l.rid, 1)
                 and remaining.get(l.rid, 0) > lane_width(l)]
        if not added:
            continue
        gain = (c.score - ordinary.score) / duration
        informed = min(information(*a) for a in added)
        key = (gain, -informed, -duration, tuple(-x for x in policy.capacities(c.graph)))
        if best is None or _greater(key, best_key):
            best, best_key = c, key
    return best


def _greater(a, b) -> bool:
    if not utility.nearly_equal(a[0], b[0]):
        return a[0] > b[0]
    return a[1:] > b[1:]
