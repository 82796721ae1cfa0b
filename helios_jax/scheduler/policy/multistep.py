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

from typing import NamedTuple

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


class StepLimits(NamedTuple):
    """What K-step lanes read of the decoders, whatever K: read from the views once per
    decision and shared by its K-step programs (:func:`step_limits`)."""

    limit: np.ndarray  # i64[n]: min(output left, context left, width limit)
    eligible: np.ndarray  # bool[n]: no host token mask (a K-step program may hold the lane)

    def steps(self, steps: int) -> np.ndarray:
        """i64[n]: each decoder's :func:`view_steps` on a program of `steps` steps."""
        return np.maximum(np.minimum(self.limit, steps), 1)


_ONE_LANE, _NO_LANE = np.zeros(1, dtype=np.intp), np.zeros(0, dtype=np.intp)


def step_limits(decoders: DecoderTable) -> StepLimits:
    """The decoders' :class:`StepLimits`, read from their columns once per decision (a width
    limit that is None is ``view_columns.NO_LIMIT``)."""
    c = decoders.columns
    left = np.minimum(c.output_remaining, c.context_remaining)
    return StepLimits(np.minimum(left, c.width_cap), ~c.host_mask)


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


def k_step_lanes(decoders: DecoderTable, steps: int, until_ms: float) -> list[tuple[float, Lane]]:
    """(value, lane) of every eligible decoder on a K-step program that completes `until_ms` from
    now: its steps' tokens, one delivery and its age term (a prerequisite's follower)."""
    limits = step_limits(decoders)
    counts = limits.steps(steps)
    values = decoders.output_price * counts + decoders.delivery_value + decoders.age_value_per_ms * until_ms
    idx = np.flatnonzero(limits.eligible)
    return [(float(values[i]), lane) for i, lane in zip(idx, _lanes(decoders, idx, counts, values))]


class RankedLanes(NamedTuple):
    """The eligible decoders' lanes on K-step programs of one K, best first: shared by those
    programs whatever their batch capacity (:func:`ranked_lanes`)."""

    steps: np.ndarray  # i64[n]: each decoder's steps
    values: np.ndarray  # f64[n]: each decoder's lane value at T = 0
    order: np.ndarray  # i64[m]: the eligible decoders, best first
    reach: np.ndarray  # i64[m]: the most steps among the first i + 1 of `order`
    ranked: np.ndarray  # f64[m]: `values` along `order`
    prefix: np.ndarray  # f64[m]: the first i + 1 of `ranked`, summed one after another
    head: np.ndarray  # f64[m]: the first i of `ranked`, summed one after another (0.0 for none)


def ranked_lanes(decoders: DecoderTable, steps: int, limits: StepLimits) -> RankedLanes:
    """The decoders' :class:`RankedLanes` on programs of `steps` steps. Ties rank the less
    recently used request first, then the lower slot, as for every generation table."""
    counts = limits.steps(steps)
    values = decoders.output_price * counts + decoders.delivery_value
    if counts.size == 1:  # one decoder: its own order and sums (no sort, no running sums)
        order = _ONE_LANE if limits.eligible[0] else _NO_LANE
        ranked = values[order]
        return RankedLanes(counts, values, order, counts[order], ranked, ranked, np.zeros(order.size))
    order = np.lexsort((decoders.slots, decoders.last_selected_ns, -values))
    order = order[limits.eligible[order]]
    ranked = values[order]
    prefix = np.cumsum(ranked)
    head = np.concatenate(([0.0], prefix[:-1]))
    return RankedLanes(counts, values, order, np.maximum.accumulate(counts[order]), ranked, prefix, head)


class KStepRanking:
    """One decision's :func:`ranked_lanes` by K, each built when first asked for."""

    def __init__(self, decoders: DecoderTable):
        self.decoders = decoders
        self._limits: StepLimits | None = None
        self._by_steps: dict[int, RankedLanes] = {}

    def __call__(self, steps: int) -> RankedLanes:
        hit = self._by_steps.get(steps)
        if hit is None:
            hit = self._by_steps[steps] = ranked_lanes(self.decoders, steps, self.limits)
        return hit

    @property
    def limits(self) -> StepLimits:
        if self._limits is None:
            self._limits = step_limits(self.decoders)
        return self._limits

    def extent(self) -> tuple[int, int]:
        """(the eligible decoders' count, the longest steps limit among them; 0 for none): what
        ``prepared.GenerationRows.live`` reads, without ranking."""
        limits = self.limits
        return int(limits.eligible.sum()), int(limits.limit[limits.eligible].max(initial=0))


def multistep_candidate(sel: Selection, g: GraphDescriptor, ranked: RankedLanes) -> ScoredCandidate | None:
    """The best non-dominated cohort of a K-step decode program (None: every cohort is).

    Lanes are ranked by value (:func:`ranked_lanes`). A cohort is dominated when a prepared
    decode program with capacities all at most this one's (one smaller) does the same work: it
    holds the cohort (B' >= size) and gives every lane the same steps (each lane's steps at most
    its K'). So a cohort of size c survives only with a lane of more steps than the largest K'
    among the dominators holding c lanes: the best such cohort is the top c, or the top c - 1
    plus the best lane with more steps. The best over every size is the largest legal size's
    (:func:`_largest_cohort`), exact against ``reference/cohorts.py``. `ranked`: the decoders'
    lanes on `g`'s K (:class:`KStepRanking`, shared between the programs of one K).
    ``generation_candidates`` asks only for programs with a legal size (``prepared.GenerationRows``).
    """
    decoders = sel.decoders
    size = min(g.batch_capacity, ranked.order.size)
    if size == 0:
        return None
    kappa = sel.prepared.generation_rows.dominated[g]  # ``prepared.dominated_steps``, kept per catalog
    found = _largest_cohort(ranked, int(kappa[size - 1]), size)
    if found is None:
        return None
    total, idx = found
    t = sel.duration(g) or 0.0
    per_ms = decoders.age_value_per_ms

    def lanes() -> list[Lane]:
        return _lanes(decoders, idx, ranked.steps, ranked.values + per_ms * t)

    # Dominance is settled here, per cohort: the candidate joins no dominance group.
    return sel.score(g, total, idx.size * per_ms, None, lanes)


def _largest_cohort(ranked: RankedLanes, kappa: int, size: int) -> tuple[float, np.ndarray] | None:
    """The best non-dominated cohort of at most `size` lanes: (its value, its decoders), or None
    when every size is dominated; `kappa`: the dominated steps at `size` lanes.

    With f the first ranked lane of more steps than `kappa`, the cohort is the top `size` when f
    is among them, else the top size - 1 plus lane f (no f: every size is dominated), its value
    summed lane after lane in that order. A smaller size is never better: its dominated steps
    are at least `kappa` (a dominator holding more lanes holds fewer), so its f comes no earlier,
    and its cohort's lanes are each worth no more than one of this cohort's, which holds more of
    them (lane values and the age term per lane are not negative; rounding is monotone); of
    equal scores the larger size wins."""
    n = ranked.order.size
    f = int(np.searchsorted(ranked.reach, kappa, side="right"))
    if f == n:
        return None
    order = ranked.order
    if f < size:  # lane f is among the top `size`
        return float(ranked.prefix[size - 1]), order[:size]
    if size == 1:  # lane f alone: its own value (0.0 + v is not -0.0)
        return float(ranked.ranked[f]), order[f : f + 1]
    return float(ranked.head[size - 1] + ranked.ranked[f]), np.append(order[: size - 1], order[f])
