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
Timing refresh takes precedence (:func:`explore` checks it first); fixed-width execution never
probes. :func:`explore` makes the whole funded choice for ``Scheduler.plan``: discovery for an
indeterminate winner, else a timing refresh, else a probe, else the ordinary winner. What
completed rounds teach, pooled over requests, is kept here too (:class:`Population`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from helios_jax.catalog import DecodeMode, GraphDescriptor
from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass, PlanLane
from helios_jax.scheduler.refresh import Ledger
from helios_jax.scheduler.requests import Request
from helios_jax.scheduler.rounds import forecast_observations
from helios_jax.scheduler.speculation import (
    SOURCES,
    AcceptanceHistory,
    PopulationPrior,
    PrefixEstimate,
    acceptance_observations,
    initial_prior,
)
from helios_jax.scheduler.view import Candidate, LaneRole, RequestView
from helios_jax.scheduler.view_columns import ResidentViews


def explore(
    inp: policy.SelectionInput,
    ordinary: Candidate,
    loaded: Sequence[GraphDescriptor],
    timing: Ledger,
    acceptance: Ledger,
    information: Callable[[int, int, int], float],
    base: tuple[policy.Selection, list[policy.ScoredCandidate]] | None = None,
    build_probe_views: Callable[[], Sequence[RequestView]] | None = None,
) -> tuple[Candidate, ExecutionClass, float]:
    """The plan's candidate, accounting class and the credit that funds it (0 unless funded);
    `base`: the ordinary selection and its rows (``policy.selection_rows(inp)``), which a
    refresh alternative rereads and whose tables a probe shares; `build_probe_views`: builds the
    probe's views (:func:`probe_views`) when `inp.views` were priced without optimistic
    estimates, called only if a probe could widen a lane (None: from `inp.views`' own)."""
    sel, rows = (None, None) if base is None else base
    if ordinary.indeterminate:
        return ordinary, ExecutionClass.DISCOVERY, 0.0
    if timing.can_start():
        alternative = refresh_alternative(inp, ordinary, loaded, sel, rows)
        if alternative is not None:
            return alternative, ExecutionClass.TIMING_REFRESH, timing.balance_ms
    if acceptance.can_start():
        optimistic = (lambda: probe_views(inp.views)) if build_probe_views is None else build_probe_views
        found = probe(inp, ordinary, optimistic, information, sel)
        if found is not None:
            return found, ExecutionClass.ACCEPTANCE_LEARNING, acceptance.balance_ms
    return ordinary, ExecutionClass.ORDINARY, 0.0


def probe_views(
    views: Sequence[RequestView], estimates: Mapping[int, np.ndarray] | None = None
) -> ResidentViews:
    """The views a probe scores: each decoder's survival replaced by its optimistic estimate, the
    view's own or (`estimates`, by rid, for views priced without them) the given one. Other views
    are kept as they are: a probe scores drafted programs, whose lanes are decoders'."""
    resident = ResidentViews.of(views)
    c = resident.decoders  # their survival column replaced
    rows = c.optimistic if estimates is None else [estimates[rid] for rid in c.rid.tolist()]
    return resident.with_decoder_survival(list(rows))


def aged_information(requests: Mapping[int, Request]) -> Callable[[int, int, int], float]:
    """The probe's information measure: (rid, from_width, to_width) -> the aged weight of the
    least-informed depth a wider round would add to the request's acceptance estimate (inf when
    it adds none)."""

    def information(rid: int, from_width: int, to_width: int) -> float:
        req = requests[rid]
        weights = req.acceptance.get(req.proposal_source).aged_weight(len(req.output))
        return float(np.min(weights[from_width - 1 : to_width - 1])) if to_width > from_width else math.inf

    return information


def refresh_alternative(
    inp: policy.SelectionInput,
    ordinary: Candidate,
    loaded: Sequence[GraphDescriptor],
    sel: policy.Selection | None = None,
    rows: list[policy.ScoredCandidate] | None = None,
) -> Candidate | None:
    """The stale alternative a full timing-refresh ledger lets displace the ordinary winner:
    oldest by the later of last valid observation and last attempt, then by value."""
    costs, now = inp.costs, inp.now_ns
    if not costs.any_stale(loaded, now):
        return None
    rows = [
        r
        for r in (policy.scored(inp, sel) if rows is None else rows)
        if not r.indeterminate and r.graph != ordinary.graph and costs.is_stale(r.graph.key, now)
    ]
    if not rows:
        return None
    return min(rows, key=lambda r: (costs.refresh_order_ns(r.graph.key), -r.score)).build()


class Population:
    """What completed rounds teach, pooled over requests (the learned population estimates).

    Per proposal source: a population prior that new requests start from, and a pool of every
    completed observation (weight 2 at 0.5**d, cap 128) that selection reads hierarchically where
    a request's own evidence is thin; and the population prior of confidence forecasts.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.acceptance_priors = {s: PopulationPrior(depth) for s in SOURCES}
        self.acceptance_pools = {s: PrefixEstimate.from_prior(initial_prior(depth)) for s in SOURCES}
        self.forecast_prior = PopulationPrior(depth)

    def new_acceptance(self, preseeded: dict[str, PrefixEstimate] | None) -> AcceptanceHistory:
        return AcceptanceHistory(self.acceptance_priors, preseeded=preseeded)

    def check_preseeded(self, preseeded: dict[str, PrefixEstimate] | None) -> None:
        """ValueError for a preseeded acceptance estimate shallower than the catalog's proposal
        depth (or of an unknown source): observations, conditional acceptance and the probe's
        information are read per depth 1..D, and depths no estimate covers have no value (a
        funded probe took the minimum of an empty slice). Deeper estimates are fine: the
        depths past D are kept as they are."""
        for source, estimate in (preseeded or {}).items():
            if source not in SOURCES:
                raise ValueError(f"acceptance_history: unknown proposal source {source!r}")
            if len(estimate.mean) < self.depth:
                raise ValueError(
                    f"acceptance_history[{source!r}] has depth {len(estimate.mean)}; "
                    f"the catalog's proposal depth is {self.depth}"
                )

    def new_forecast(self, history: PrefixEstimate | None) -> PrefixEstimate:
        return PrefixEstimate.from_prior(self.forecast_prior.mean) if history is None else history.copy()

    def observe_acceptance(
        self, req: Request, rec: CompletionRecord, committed: int, survival: Sequence[float] | None
    ) -> None:
        """A completed round's verified proposals, observed by the request's estimate of its
        proposal source, that source's prior and its pool (`committed`: tokens the round kept)."""
        # A stop or limit at accepted proposal j ends the request: depths 1..j were accepted
        # (observed), the suffix after j is censored.
        terminated = committed if req.finished and committed <= rec.accepted else None
        obs = acceptance_observations(
            self.depth, rec.offered, rec.accepted, terminated_after=terminated, survival=survival
        )
        req.acceptance.get(req.proposal_source).observe(obs, len(req.output))
        self.acceptance_priors[req.proposal_source].observe(obs)
        self.acceptance_pools[req.proposal_source].observe(obs, 0)

    def observe_forecast(self, req: Request, lane: PlanLane, joint: np.ndarray, proposal_depth: int) -> None:
        """A confidence sidecar's joint prefix probabilities for one lane, observed by the
        request's forecast and the population forecast prior."""
        ceiling = lane.ceiling or lane.query_length
        obs = forecast_observations(joint, min(ceiling, proposal_depth + 1), self.depth)
        req.forecast.observe(obs, len(req.output))
        self.forecast_prior.observe(obs)


def lane_width(lane) -> int:
    return max(lane.query_length, lane.ceiling)


def probe(
    inp: policy.SelectionInput,
    ordinary: Candidate,
    optimistic_views: Sequence[RequestView] | Callable[[], Sequence[RequestView]],
    information: Callable[[int, int, int], float],
    base: policy.Selection | None = None,
) -> Candidate | None:
    """The best acceptance probe, or None.

    Args:
      inp: the ordinary selection input (views carry mean survival estimates).
      ordinary: the ordinary winner (determinate).
      optimistic_views: the same views with optimistic survival estimates (``probe_views``), or
        a function that builds them, called only when some drafted row could widen a lane.
      information: (rid, from_width, to_width) -> aged weight of the least-informed added depth.
      base: ``Selection(inp)``, when built: the probe's selection shares its tables.
    """
    if inp.mode is not DecodeMode.ADAPTIVE or ordinary.indeterminate:
        return None
    prepared = policy.as_prepared(inp.graphs)
    speculative = prepared.drafted()
    if not speculative.graphs:
        return None
    ordinary_width = {lane.rid: lane_width(lane) for lane in ordinary.lanes if lane.role is LaneRole.DECODE}
    remaining = ResidentViews.of(inp.views).output_remaining()
    if not _can_widen(remaining, ordinary_width, speculative.max_width):
        return None
    # Scored on the ordinary decision's scale: the same sigma (from every loaded program) and
    # waiting cost, so that "beats the ordinary choice" compares like with like.
    if callable(optimistic_views):
        optimistic_views = optimistic_views()
    opt_inp = dataclasses.replace(inp, views=optimistic_views, graphs=speculative, reference=prepared)
    best, best_key = None, None
    # Only rows that beat the ordinary winner are materialised (building lanes is the cost), and
    # an adaptive ragged program's cohort is searched only when its bounds could beat both the
    # ordinary winner and the best probe before it in the rows' order.
    sel = policy.Selection(opt_inp, base)
    rows, build_ragged = policy.rows_with_ragged_programs(sel, ordinary.score)
    for entry in rows:
        # An adaptive ragged program (its cohort unsearched) is built here, if it could win.
        row = (
            build_ragged(entry, _floor_to_displace(ordinary.score, best_key, sel.duration(entry)))
            if isinstance(entry, GraphDescriptor)
            else entry
        )
        if row is None or row.indeterminate or not row.score > ordinary.score:
            continue
        c = row.build()
        key = _probe_key(c, ordinary.score, ordinary_width, remaining, information)
        if key is None:
            continue
        if best is None or _greater(key, best_key):
            best, best_key = c, key
    return best


def _probe_key(
    c: Candidate,
    ordinary_score: float,
    ordinary_width: Mapping[int, int],
    remaining: Mapping[int, int],
    information: Callable[[int, int, int], float],
) -> tuple | None:
    """A built row's probe ranking key (gain per ms over the ordinary score, the least-informed
    added prefix, the shorter execution, the smaller geometry: compared by :func:`_greater`), or
    None when it adds no depth that leaves output after it."""
    duration = c.duration_ms
    if duration is None:
        return None  # not reached: rows are built with a known duration
    added = [
        (lane.rid, ordinary_width.get(lane.rid, 1), lane_width(lane))
        for lane in c.lanes
        if lane.role is LaneRole.DECODE
        and lane_width(lane) > ordinary_width.get(lane.rid, 1)
        and remaining.get(lane.rid, 0) > lane_width(lane)
    ]
    if not added:
        return None
    gain = (c.score - ordinary_score) / duration
    informed = min(information(*a) for a in added)
    return (gain, -informed, -duration, tuple(-x for x in policy.capacities(c.graph)))


def _floor_to_displace(score: float, best_key: tuple | None, duration: float | None) -> float:
    """The score a row of `duration` must reach to displace the best probe so far (`best_key`;
    `score`: the ordinary winner's, all a row must beat before any probe is found): a gain per
    ms below the best's by more than the tie tolerance never displaces it in :func:`_greater`.
    A row below ``score + duration * (gain - 2 * REL_TIE * max(1, |gain|))`` has a gain below
    the best's by more than ``REL_TIE * max(1, |gain|, |its gain|)``."""
    if best_key is None or duration is None:
        return score
    gain = best_key[0]
    return score + duration * (gain - 2.0 * utility.REL_TIE * max(1.0, abs(gain)))


def _can_widen(remaining: Mapping[int, int], ordinary_width: Mapping[int, int], max_width: int) -> bool:
    """Whether any drafted row could add depth: a probe lane is wider than the request's ordinary
    lane (1 when it has none) yet leaves output after it, and no lane is wider than the widest
    drafted program. When every request's ordinary width already reaches ``min(max_width,
    remaining - 1)`` (one resident on its widest program: most decisions), no row qualifies and
    the probe's selection need not be built."""
    return any(min(max_width, left - 1) > ordinary_width.get(rid, 1) for rid, left in remaining.items())


def _greater(a, b) -> bool:
    if not utility.nearly_equal(a[0], b[0]):
        return a[0] > b[0]
    return a[1:] > b[1:]
