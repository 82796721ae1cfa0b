"""Terminal snapshot programs: finished requests' terminal snapshots, which retire them.

Terminal rows are valued at the policy's terminal value plus their age cost, under the same
score and padding rules as inference; rows a snapshot program does not need for terminal rows
advance blocked requests whose next prerequisite is a window snapshot.
"""

from __future__ import annotations

import numpy as np

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection, free_prerequisite_rows
from helios_jax.scheduler.view import Lane, LaneRole, RequestView


def terminal_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Each snapshot program with the oldest terminal rows (ties: less recently used)."""
    if not sel.terminals or not sel.prepared.snapshots:
        return []
    ages = np.array([v.terminal_age_ms for v in sel.terminals])
    order = np.lexsort((np.array([v.last_selected_ns for v in sel.terminals]), -ages))
    free = [v for v in sel.blocked if v.prerequisites[0] is GraphKind.SNAPSHOT]
    return [_snapshot_candidate(sel, g, ages, order, free) for g in sel.prepared.snapshots]


def _snapshot_candidate(
    sel: Selection, g: GraphDescriptor, ages: np.ndarray, order: np.ndarray, free: list[RequestView]
) -> ScoredCandidate:
    decision = sel.decision
    per_row = decision.terminal_age * decision.sigma_terminal
    m = min(g.batch_capacity, len(order))
    idx = order[:m]
    t = sel.duration(g) or 0.0

    def lanes() -> list[Lane]:
        out = [
            Lane(
                sel.terminals[i].rid,
                sel.terminals[i].slot,
                LaneRole.TERMINAL,
                value=float(decision.terminal_lane(ages[i], t)),
            )
            for i in idx
        ]
        return out + free_prerequisite_rows(free, g.batch_capacity - m, ())

    n_free = min(len(free), g.batch_capacity - m)
    signature = (g.kind, "terminal", m, n_free)
    value_at_zero = float(decision.terminal_lane(ages[idx], 0.0).sum())
    return sel.score(g, value_at_zero, m * per_row, signature, lanes)
