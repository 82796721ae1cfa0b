"""Multi-step decode programs (``steps`` K > 1): K committed tokens per lane, one delivery.

A K-step decode lane runs min(K, output left, context left, width limit) steps (its *steps*),
each committing one token, and the host publishes them as one visible burst after the
execution: the lane earns steps x its output price plus one delivery and its age term
(``useful-service/burst-one-delivery``), over the program's measured duration T. The longer T
is priced by the score's waiting term like any other nonpreemptible execution, so whether K
single steps or one K-step execution serve a cohort better is a comparison of value per time.

Every lane's work is fixed by its own limits (no aggregate row capacity binds the cohort), so
the best cohort is the highest additive lane values, as for single-step decode. Lanes carry
their steps as the ``ceiling`` of a DECODE lane (the device's immutable per-lane bound).

A decoder whose samples take a host token mask (``host_mask``: a grammar) is never a K-step lane:
the mask holds for one step only, and K-step programs take none.
"""

from __future__ import annotations

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import DecoderTable
from helios_jax.scheduler.view import Lane, LaneRole, RequestView


def view_steps(v: RequestView, steps: int) -> int:
    """Steps a decoder takes on a K-step program: K, its output and context left, and a grammar
    or stop restriction's width limit (copy proposals do not apply); at least one."""
    limit = min(steps, v.output_remaining, v.context_remaining)
    if v.width_limit is not None:
        limit = min(limit, v.width_limit)
    return int(max(1, limit))


def lane_steps(decoders: DecoderTable, steps: int) -> np.ndarray:
    """i64[n]: each decoder's `view_steps` on a K-step program."""
    return np.array([view_steps(v, steps) for v in decoders.views], dtype=np.int64)


def _lanes(decoders: DecoderTable, idx, steps: np.ndarray, values: np.ndarray) -> list[Lane]:
    """K-step DECODE lanes of decoders `idx`: their steps as ceiling and expected tokens."""
    return [
        Lane(
            int(decoders.rids[i]),
            int(decoders.slots[i]),
            LaneRole.DECODE,
            ceiling=int(steps[i]),
            expected_tokens=float(steps[i]),
            value=float(values[i]),
        )
        for i in idx
    ]


def k_step_eligible(decoders: DecoderTable) -> np.ndarray:
    """bool[n]: decoders a K-step program may hold (those without a host token mask)."""
    return np.array([not v.host_mask for v in decoders.views], dtype=bool)


def k_step_lanes(decoders: DecoderTable, steps: int, until_ms: float) -> list[tuple[float, Lane]]:
    """(value, lane) of every eligible decoder on a K-step program that completes `until_ms` from
    now: its steps' tokens, one delivery and its age term (a prerequisite's follower)."""
    counts = lane_steps(decoders, steps)
    values = decoders.output_price * counts + decoders.delivery_value + decoders.age_value_per_ms * until_ms
    idx = np.flatnonzero(k_step_eligible(decoders))
    return [(float(values[i]), lane) for i, lane in zip(idx, _lanes(decoders, idx, counts, values))]


def multistep_candidate(sel: Selection, g: GraphDescriptor) -> ScoredCandidate | None:
    """The best non-dominated cohort of a K-step decode program (None: every cohort is).

    Lanes are ranked by value (ties: the less recently used request, then the lower slot, as
    for every generation table). A cohort is dominated when a prepared decode program with
    capacities all at most this one's (one smaller) does the same work: it holds the cohort
    (B' >= size) and gives every lane the same steps (each lane's steps at most its K'). So a
    cohort of size c survives only with a lane of more steps than the largest K' among the
    dominators holding c lanes: the best such cohort is the top c, or the top c - 1 plus the
    best lane with more steps. The best over every size is exact (``reference/cohorts.py``).
    """
    decoders = sel.decoders
    steps = lane_steps(decoders, g.steps)
    values = decoders.output_price * steps + decoders.delivery_value
    order = np.lexsort((decoders.slots, decoders.last_selected_ns, -values))
    order = order[k_step_eligible(decoders)[order]]
    t = sel.duration(g) or 0.0
    per_ms = decoders.age_value_per_ms
    best: tuple[float, np.ndarray] | None = None
    for c in range(1, min(g.batch_capacity, order.size) + 1):
        idx = _cohort(order, steps, c, sel.prepared.dominators[g])
        if idx is not None:
            total = float(np.cumsum(values[idx])[-1])
            if best is None or total + c * per_ms * t >= best[0] + best[1].size * per_ms * t:
                best = (total, idx)
    if best is None:
        return None
    total, idx = best

    def lanes() -> list[Lane]:
        return _lanes(decoders, idx, steps, values + per_ms * t)

    # Dominance is settled here, per cohort: the candidate joins no dominance group.
    return sel.score(g, total, idx.size * per_ms, None, lanes)


def _cohort(order: np.ndarray, steps: np.ndarray, c: int, dominators) -> np.ndarray | None:
    """The best cohort of size c that no dominator does the same work for (None: none)."""
    kappa = max((h.steps for h in dominators if h.batch_capacity >= c), default=0)
    more = steps[order] > kappa  # lanes some dominator holding c lanes would run shorter
    if more[:c].any():
        return order[:c]
    rest = np.flatnonzero(more[c:])
    if rest.size == 0:
        return None
    return np.concatenate([order[: c - 1], order[[c + int(rest[0])]]])
