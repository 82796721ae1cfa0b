"""Exploration and learning (learning.py): what funds a discovery, that the ordinary rows handed
to `explore` only save work, the probe's information measure, and what a completed round
teaches the acceptance pool and the forecasts.

Rules checked against independent computations:

- discovery (an indeterminate winner) is never funded: its exploration credit is 0 whatever
  the ledgers hold (spec, "timing-refresh/discovery-no-credit");
- `explore`'s funded choice is the same whether or not the caller hands it the ordinary
  selection and rows (``policy.selection_rows``): they are shared only to save work;
- the information a wider round adds is the least aged weight over the depths it adds: a round
  of width w verifies depths 1..w-1, so widening from a to b adds depths a..b-1 (none: inf);
- a round's acceptance observations are censored only where a stop or limit among its accepted
  proposals ended the request (committed <= accepted); the pool of completed observations
  starts at 0.5**d with weight 2 and never ages (RESOLUTIONS.md, 18);
- a lane's forecast observes only the depths its program proposed (min(ceiling, D + 1) rows):
  a K-step decode lane, whose ceiling counts steps, observes none.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from helios_jax.catalog import Allocation, DecodeMode, GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler import learning, service
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass
from helios_jax.scheduler.speculation import INITIAL_WEIGHT, SOURCE_LEARNED, PrefixEstimate, initial_prior

from .helpers import ORDINARY, SPEC, TIMING, burst_records, first_generation_plan
from .test_core import records, scheduler, timing

MS = 1_000_000


def test_discovery_is_funded_by_no_credit():
    """A cold catalog: the first plan is discovery, and with both ledgers full it carries no
    exploration credit (discovery neither pays from a ledger nor reports one's balance)."""
    s = Scheduler(SPEC)
    s.admit([1] * 8, max_output=100)
    s.advance_to(0)
    s.timing_ledger.earn(2495.0)
    s.acceptance_ledger.earn(495.0)
    assert s.timing_ledger.can_start() and s.acceptance_ledger.can_start()
    plan = s.plan()
    assert plan.reason is ExecutionClass.DISCOVERY
    assert plan.exploration_credit_ms == 0.0


def _run_round(s, fence: int, now_ms: float, accepted: int) -> float:
    """plan, commit and complete one round (a device-allocated one with its confidence sidecar)
    after its expected duration, publishing every burst; returns the round's end in ms."""
    s.advance_to(int(now_ms * MS))
    plan = s.plan()
    s.commit(plan, fence)
    ms = plan.expected_duration_ms or 1.0
    s.advance_to(int((now_ms + ms) * MS))
    recs = records(plan, accepted)
    if plan.graph.allocation is Allocation.PREFIX_LIMIT:
        sidecar = np.full((2, s.catalog.request_slots, plan.graph.proposal_depth), 0.5, np.float32)
        gen = s.complete_packed_round(fence, recs, timing(ms), sidecar)
    else:
        gen = s.complete(fence, recs, timing(ms))
    for g in gen:
        s.published_output(g.handle, fence)
    return now_ms + ms


def test_the_funded_choice_does_not_depend_on_the_rows_handed_over(monkeypatch):
    """At every decision of a run whose estimates go stale and whose ledgers fill, `explore`
    without the ordinary selection and rows (recomputing them) chooses exactly what it chooses
    with them (ordinary, timing refresh and acceptance probe decisions all occur)."""
    real = learning.explore
    seen: list[ExecutionClass] = []

    def both(*args, **kw):
        got = real(*args, **kw)
        base = args[6] if len(args) > 6 else kw.get("base")
        assert base is not None  # Scheduler.plan hands its selection and rows over
        assert real(*args[:6], **{k: v for k, v in kw.items() if k != "base"}) == got
        seen.append(got[1])
        return got

    monkeypatch.setattr(learning, "explore", both)
    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 900):
        s.admit([1] * n, max_output=200)
    t = 0.0
    for fence in range(1, 40):
        if fence % 6 == 0:
            t += s.policy.estimate_ttl_ns / service.NS_PER_MS  # every estimate goes stale
        if fence % 4 == 0:
            s.timing_ledger.earn(2495.0) if fence % 8 == 0 else s.acceptance_ledger.earn(495.0)
        t = _run_round(s, fence, t, fence % 4)
    assert {ExecutionClass.ORDINARY, ExecutionClass.TIMING_REFRESH} <= set(seen)
    assert ExecutionClass.ACCEPTANCE_LEARNING in seen


def _least_weight(weights, from_width: int, to_width: int) -> float:
    """Independent: the smallest weight over the depths d = from_width..to_width-1 (1-based)."""
    added = [weights[d - 1] for d in range(from_width, to_width)]
    return min(added) if added else math.inf


def test_information_is_the_least_aged_weight_of_the_added_depths():
    """Every (from, to) pair of widths 1..D+1 on a request with distinct per-depth weights,
    including its own aging (half-life 128 generated tokens) and equal widths (nothing added)."""
    s = Scheduler(SPEC)
    depth = s.depth
    weights = np.array([5.0, 3.0, 9.0, 2.0, 7.0, 4.0, 6.0, 8.0])[:depth]
    own = PrefixEstimate(initial_prior(depth), weights.copy(), 0)
    h = s.admit([1] * 8, max_output=300, acceptance_history={SOURCE_LEARNED: own})
    information = learning.aged_information(s.requests)
    for a in range(1, depth + 2):
        for b in range(1, depth + 2):
            assert information(h.rid, a, b) == _least_weight(list(weights), a, b), (a, b)
    s.requests[h.rid].output.extend([5] * 64)  # 64 generated tokens: weights aged by 2 ** -0.5
    aged = [w * 0.5**0.5 for w in weights]
    for a, b in ((1, 2), (1, 4), (2, 6), (4, depth + 1), (3, 3), (5, 2)):
        assert information(h.rid, a, b) == pytest.approx(_least_weight(aged, a, b), rel=1e-12)


def _first_round(tokens, accepted):
    """One request (output limit 6, stop token 7) through its prefill to a speculative round of
    3 proposals, completed with `tokens` of which `accepted` proposals: (scheduler, request)."""
    s, plan, fence = first_generation_plan(SPEC, GraphKind.SPECULATIVE, stop_token_ids=(7,))
    (lane,) = plan.lanes
    assert lane.query_length == 4
    req = s.requests[lane.handle.rid]
    s.commit(plan, fence)
    s.complete(
        fence,
        [CompletionRecord(lane.handle, lane.epoch, tokens=tokens, offered=3, accepted=accepted)],
        TIMING,
    )
    return s, req


N = math.nan


@pytest.mark.parametrize(
    "tokens, accepted, finished, observed",
    [
        ((5, 6), 1, False, (1.0, 0.0, 0.0)),  # a rejection zeroes every longer offered prefix
        ((5, 7), 1, True, (1.0, 0.0, 0.0)),  # a stop on the replacement token: all verified
        ((5, 7, 6), 2, True, (1.0, 1.0, N)),  # a stop at the last accepted proposal: censored
        ((7, 5, 6), 2, True, (1.0, N, N)),  # a stop at the first accepted proposal
        ((5, 6, 6, 6), 3, False, (1.0, 1.0, 1.0)),
    ],
)
def test_a_round_teaches_the_pool_what_its_request_verified(tokens, accepted, finished, observed):
    """The pool of completed observations (fresh: 0.5**d, weight 2, no aging) after one round
    moves each observed depth by (x - mean) / 3 and keeps the others; the population prior moves
    1/64 of the way; depths past the offered three are unobserved."""
    s, req = _first_round(tokens, accepted)
    assert req.finished is finished
    depth = s.depth
    obs = np.full(depth, np.nan)
    obs[:3] = observed
    seen = ~np.isnan(obs)
    prior = initial_prior(depth)
    pool = s.population.acceptance_pools[SOURCE_LEARNED]
    want = prior.copy()
    want[seen] = prior[seen] + (obs[seen] - prior[seen]) / (INITIAL_WEIGHT + 1.0)
    np.testing.assert_array_equal(pool.mean, want)
    np.testing.assert_array_equal(pool.weight, np.where(seen, INITIAL_WEIGHT + 1.0, INITIAL_WEIGHT))
    moved = prior.copy()
    moved[seen] += (obs[seen] - prior[seen]) / 64.0
    np.testing.assert_allclose(s.population.acceptance_priors[SOURCE_LEARNED].mean, moved, rtol=1e-15)
    own = req.acceptance.get(SOURCE_LEARNED)
    np.testing.assert_array_equal(own.mean[~seen], prior[~seen])  # censored depths keep their means
    assert np.all(own.mean[seen] != prior[seen])


def test_a_k_step_lane_observes_no_forecast_from_a_sidecar():
    """A K-step decode lane (ceiling = its 5 steps, program proposal depth 0) completed with a
    confidence sidecar: its program proposed nothing, so neither the request's forecast nor the
    population's forecast prior observes anything (min(ceiling, D + 1) = 1 row: no depth)."""
    catalog = with_decode_steps(ORDINARY, (8,), 0.3)
    s, plan, fence = first_generation_plan(catalog, GraphKind.DECODE)
    (lane,) = plan.lanes
    assert plan.graph.steps == 8 and plan.graph.proposal_depth == 0 and lane.ceiling == 5
    req = s.requests[lane.handle.rid]
    before, prior_before = req.forecast.mean.copy(), s.population.forecast_prior.mean.copy()
    s.commit(plan, fence)
    sidecar = np.full((2, catalog.request_slots, 4), 0.9, dtype=np.float32)
    s.complete_packed_round(fence, burst_records(plan, (1, 2, 3)), TIMING, sidecar)
    np.testing.assert_array_equal(req.forecast.mean, before)
    np.testing.assert_array_equal(s.population.forecast_prior.mean, prior_before)
