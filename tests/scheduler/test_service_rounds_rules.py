"""Service histories of one measured interval, missing rates, and the causal-frontier allocation
of a cohort's speculative rows, each against a computation written out here.

Service (docs/spec/scheduling-runtime-design.md, "Service accounting and publication"): every
participant still resident under its committed handle receives one measured interval (zero
service when unselected); a cancelled handle charges nothing; a missing token history is priced
at min(-log sigma(K), min_i log x_i) - waited/tau over the K active residents and starts from that
rate at its first service. Rounds ("Device allocation repeatedly admits the best immediate causal
frontier using joint prefix probability, with ties resolved by shorter prefixes and original
request slots"): checked against ``reference.prefix_allocation.prefix_allocation_naive``.
"""

import dataclasses
import itertools
import math

import numpy as np
import pytest

from helios_jax.reference.prefix_allocation import prefix_allocation_naive
from helios_jax.scheduler import service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.plan import Frame
from helios_jax.scheduler.rounds import allocate_cohort_rows, allocate_prefix_rows

from .helpers import ORDINARY

P = PolicyConfig()
MS = service.NS_PER_MS
# One measured generation program: batch capacity 4 in 2 ms, so sigma(K) = K * 2 / min(4, K).
NORM = service.Normalizers(((4, 2.0),))


def _residents(n: int, admitted_ms: float = 0.0):
    """`n` resident requests admitted at `admitted_ms` (their histories still missing)."""
    s = Scheduler(ORDINARY)
    s.seed_costs(0)
    s.advance_to(int(admitted_ms * MS))
    reqs = [s.requests[s.admit([1] * 8, max_output=4).rid] for _ in range(n)]
    return s, reqs


def _decayed(x: float, served: float, dt: float) -> float:
    """x <- a*x + (1 - a)*s/dt with a = exp(-dt/tau), in linear space."""
    a = math.exp(-dt / P.adaptation_ms)
    return a * x + (1 - a) * served / dt


def test_resident_rates_are_the_active_residents_histories_only():
    """K and the worst-served bound read only active residents that have a history entry: a
    cancelled request keeps its history but is no longer a resident competitor, and an active
    request outside `histories` is skipped (not looked up)."""
    s, (a, b, c, d) = _residents(4)
    a.history.log_x, b.history.log_x, c.history.log_x = -1.0, -9.0, -2.0
    s.cancel(b.handle)
    assert a.active and not b.active and c.active and d.active
    requests = {r.rid: r for r in (a, b, c, d)}
    histories = {r.rid: r.history for r in (a, b, c)}
    assert service.resident_rates(requests, histories) == [-1.0, -2.0]
    histories[d.rid] = d.history
    assert service.resident_rates(requests, histories) == [-1.0, -2.0, None]


def test_missing_rate_decays_from_admission():
    """Admitted at 3 ms, priced at 8 ms: waited 5 ms. K = 3 residents, sigma(3) = 3 * 2 / 3 = 2,
    known worst -0.5 > -log 2, so log x0 = -log 2 - 5 / tau."""
    _, (req,) = _residents(1, admitted_ms=3.0)
    assert req.admitted_ns == 3 * MS
    known = [None, -0.5, None]
    got = service.missing_rate(req, 8 * MS, NORM, known, P)
    assert got == pytest.approx(-math.log(2.0) - 5.0 / P.adaptation_ms, rel=1e-12)
    # priced at its admission it has not waited: the undecayed base
    assert service.missing_rate(req, 3 * MS, NORM, known, P) == pytest.approx(-math.log(2.0), rel=1e-12)


def _interval_setup():
    """Six requests admitted at 2 ms and a frame committed at 7 ms whose participants are, in order:
    a released request (no longer resident), a stale handle of `stale`, the cancelled `gone`, the
    served `a`, the unserved `d` (missing history) and the served `e` (missing history)."""
    s, (a, gone, stale, d, e, late) = _residents(6, admitted_ms=2.0)
    a.history.log_x, a.history.log_z = math.log(2.0), math.log(0.5)
    gone.history.log_x, gone.history.log_z = math.log(0.01), math.log(0.25)
    stale.history.log_x, stale.history.log_z = math.log(3.0), math.log(0.2)
    s.cancel(gone.handle)
    released = dataclasses.replace(a.handle, rid=max(r.rid for r in (a, gone, stale, d, e, late)) + 1)
    other_generation = dataclasses.replace(stale.handle, generation=stale.handle.generation + 1)
    participants = (released, other_generation, gone.handle, a.handle, d.handle, e.handle)
    frame = Frame(1, None, 7 * MS, None, participants, NORM, {})
    requests = {r.rid: r for r in (a, gone, stale, d, e, late)}
    return requests, frame, (a, gone, stale, d, e, late)


def test_one_interval_charges_every_current_participant_and_no_one_else():
    """dt = 10 ms. Served a (20 tokens): x = a*2 + (1-a)*2, z decays with zero deliveries.
    Unserved d keeps its missing histories. e (5 tokens) starts its history from the missing rate
    at commit: K = 5 active residents (a, stale, d, e, late; the cancelled one is not), sigma(5) =
    5 * 2 / 4 = 2.5, worst known log 2 > -log 2.5, waited 7 - 2 = 5 ms. The released participant,
    the other generation's handle and the cancelled handle charge nothing, and a participant that
    is not resident does not end the interval for those after it."""
    requests, frame, (a, gone, stale, d, e, late) = _interval_setup()
    before = {r.rid: (r.history.log_x, r.history.log_z) for r in requests.values()}
    served = {a.rid: 20.0, e.rid: 5.0, gone.rid: 7.0, stale.rid: 3.0}
    delivery_before = service.record_interval(requests, frame, served, 10.0, P)
    assert delivery_before == {a.rid: math.log(0.5), d.rid: None, e.rid: None}
    assert math.exp(a.history.log_x) == pytest.approx(_decayed(2.0, 20.0, 10.0), rel=1e-12)
    assert math.exp(a.history.log_z) == pytest.approx(_decayed(0.5, 0.0, 10.0), rel=1e-12)
    assert (d.history.log_x, d.history.log_z) == (None, None)
    x0 = math.exp(-math.log(2.5) - 5.0 / P.adaptation_ms)
    assert math.exp(e.history.log_x) == pytest.approx(_decayed(x0, 5.0, 10.0), rel=1e-12)
    assert e.history.log_z is None
    for r in (gone, stale, late):
        assert (r.history.log_x, r.history.log_z) == before[r.rid]


def _sort_reference(prob32, ceilings, active, capacity) -> np.ndarray:
    """Monotone rows: the frontier admits extension rows in (float32 probability desc, depth asc,
    slot asc) order, each lane up to its ceiling, until the budget is spent."""
    lengths = np.asarray(active, dtype=int).copy()
    rows = sorted(
        (-float(prob32[i, k - 1]), k, i)
        for i in range(len(lengths))
        if active[i]
        for k in range(1, int(ceilings[i]))
    )
    for _, _, i in rows[: capacity - int(lengths.sum())]:
        lengths[i] += 1
    return lengths


# Near ties: HI and LO are one float32 value (HI is the larger float64); 0.3 is below both.
HI, LO = 0.6 + 1e-9, 0.6


def test_near_tie_constants_are_one_float32_value():
    assert np.float32(HI) == np.float32(LO) and HI > LO


def test_cohort_rows_rank_float64_forecasts_in_device_precision():
    """Probabilities equal in float32 tie on the device, whatever float64 says. Lower slot: lanes
    [LO] and [HI] at depth 1 tie, the one spare row goes to lane 0. Shorter prefix: after lane 0's
    0.9 is admitted, lane 0's depth-2 HI ties lane 1's depth-1 LO; the shorter prefix (lane 1)
    wins. The selector's entry agrees with the checked entry and the naive oracle."""
    cases = [
        (np.array([[LO], [HI]]), np.array([2, 2]), 3, [2, 1]),
        (np.array([[0.9, HI], [LO, 0.3]]), np.array([3, 3]), 4, [2, 2]),
        (np.array([[0.9, HI], [LO, 0.3]]), np.array([3, 3]), 5, [3, 2]),
    ]
    for prob, ceilings, capacity, expected in cases:
        active = [True] * len(prob)
        got = allocate_cohort_rows(prob, ceilings, capacity)
        assert got.dtype == np.int32 and got.tolist() == expected
        np.testing.assert_array_equal(got, allocate_prefix_rows(prob, ceilings, active, capacity))
        np.testing.assert_array_equal(got, prefix_allocation_naive(prob, ceilings, active, capacity))


@pytest.mark.parametrize("lanes, values", [(2, (HI, LO, 0.3)), (3, (HI, LO))])
def test_every_budget_over_near_tied_monotone_cohorts(lanes, values):
    """Every cohort of `lanes` monotone rows of depth 2 from `values`, every ceiling 1..3 and every
    budget from one row per lane to every lane at its ceiling and one beyond: both host entries
    return i32 lengths equal to the sorted (float32) admission order and to the naive oracle."""
    monotone = [(p, q) for p in values for q in values if q <= p]
    for rows in itertools.product(monotone, repeat=lanes):
        prob = np.array(rows)
        prob32 = prob.astype(np.float32)
        for ceilings in itertools.product((1, 2, 3), repeat=lanes):
            ceil, active = np.array(ceilings), [True] * lanes
            for capacity in range(lanes, int(ceil.sum()) + 2):
                expected = _sort_reference(prob32, ceil, active, capacity)
                assert expected.tolist() == prefix_allocation_naive(prob, ceil, active, capacity).tolist()
                cohort = allocate_cohort_rows(prob, ceil, capacity)
                checked = allocate_prefix_rows(prob, ceil, active, capacity)
                assert cohort.dtype == np.int32 and checked.dtype == np.int32
                np.testing.assert_array_equal(cohort, expected)
                np.testing.assert_array_equal(checked, expected)


def test_a_budget_of_exactly_the_active_lanes_gives_each_its_pending_row():
    """capacity = number of active lanes: every active lane keeps only its pending-token row, an
    inactive lane gets none, and the result is the documented i32[B] query lengths."""
    prob = [[0.9, 0.8], [0.7, 0.6], [0.95, 0.9]]
    got = allocate_prefix_rows(prob, [3, 3, 3], [True, False, True], 2)
    assert got.dtype == np.int32 and got.tolist() == [1, 0, 1]
    got = allocate_cohort_rows(np.array(prob), np.array([3, 3, 3]), 3)
    assert got.dtype == np.int32 and got.tolist() == [1, 1, 1]
