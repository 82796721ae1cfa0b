"""The spec's startup traces and the exploration-budget bounds, on the simulator."""

import dataclasses
import functools

import numpy as np
import pytest

from helios_jax import simulation as sim
from helios_jax.catalog import Catalog, GraphKind
from helios_jax.scheduler import refresh
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import Scheduler

from .helpers import SPEC

spec = pytest.mark.spec


@spec(
    "verification/startup-traces",
    "verification/first-output-100ms",
    "verification/gaps-150ms",
    "verification/hundred-rounds-spread",
    "verification/selector-output-gaps",
)
@pytest.mark.parametrize("history", ["untrained", "preseeded"])
@pytest.mark.parametrize("accepted", [0, 3, 7])
@pytest.mark.parametrize("requests", [5, 16])
def test_startup_trace(requests, accepted, history):
    """Every 64-token prompt delivers its first output within 100 ms, later gaps stay below
    150 ms, and another hundred rounds give every stream progress within one 8-token burst."""
    result = sim.run(
        sim.SimConfig(
            SPEC, requests=requests, accepted_drafts=accepted, acceptance_history=history, rounds=100
        )
    )
    _assert_startup_bounds(result)


def _assert_startup_bounds(result):
    firsts = [r.first_output_ms for r in result.requests]
    assert all(f is not None and f <= 100.0 for f in firsts), firsts
    assert max(r.max_gap_ms for r in result.requests) < 150.0
    assert result.progress_spread_tokens is not None and result.progress_spread_tokens <= 8
    gained_min = min(r.output_tokens for r in result.requests)
    assert gained_min >= 100  # every stream progressed through the hundred rounds


class _CountingSnapshots(Scheduler):
    """The scheduler, counting the snapshot lanes it commits."""

    snapshot_lanes = 0

    def commit(self, plan, fence):
        if plan.graph.kind is GraphKind.SNAPSHOT:
            type(self).snapshot_lanes += len(plan.lanes)
        return super().commit(plan, fence)


@spec(
    "verification/startup-traces",
    "verification/first-output-100ms",
    "verification/gaps-150ms",
    "verification/hundred-rounds-spread",
)
@pytest.mark.parametrize(("accepted", "history"), [(0, "untrained"), (7, "preseeded")])
def test_sixteen_request_startup_holds_with_checkpoint_retention(accepted, history, monkeypatch):
    """As the engine serves (RESOLUTIONS.md 31): retention and initialize on, every prompt
    distinct, so each of the sixteen captures its own prompt-end anchor before it decodes; the
    bounds still hold. (The two traces closest to the gap bound with one-row snapshots only.)"""
    monkeypatch.setattr(_CountingSnapshots, "snapshot_lanes", 0)
    config = sim.SimConfig(
        SPEC, requests=16, accepted_drafts=accepted, acceptance_history=history, rounds=100, serving=True
    )
    result = sim.run(config, _CountingSnapshots)
    assert _CountingSnapshots.snapshot_lanes == 16  # every anchor was captured
    _assert_startup_bounds(result)


def _slow(catalog: Catalog, factor: float) -> Catalog:
    """The same catalog with every duration scaled (fewer rounds per virtual minute)."""
    return dataclasses.replace(
        catalog,
        graphs=tuple(dataclasses.replace(g, duration_ms=g.duration_ms * factor) for g in catalog.graphs),
    )


@spec(
    "timing-refresh/aggregate-bound",
    "acceptance-learning/aggregate-bound",
    "timing-refresh/first-2495ms",
    "timing-refresh/full-credit-displace",
    "acceptance-learning/execution-metrics",
)
def test_exploration_budgets_over_a_virtual_minute():
    """About a minute of continuous decoding: estimates go stale after 30 s and refreshes start;
    refresh time <= 0.002/0.998 * ordinary + one episode, probes <= 0.01/0.99 * ordinary + one
    episode, and the first refresh waited for 2,495 ms of credited ordinary execution."""
    catalog = _slow(SPEC, 8.0)
    result = sim.run(
        sim.SimConfig(
            catalog,
            requests=6,
            output_tokens=400_000,
            accepted_drafts=None,
            acceptance_probs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
            horizon_ms=70_000.0,
            rounds=10**9,
            noise=0.05,
            seed=3,
        )
    )
    assert result.virtual_ms >= 65_000
    assert result.refresh_bound_ok and result.acceptance_bound_ok
    assert result.executions.get("timing_refresh", 0) >= 1
    assert result.executions.get("acceptance_learning", 0) >= 1
    assert result.first_refresh_after_ms is not None and result.first_refresh_after_ms >= 2495.0 - 1e-6
    assert result.timing_refresh_ms <= 0.002 / 0.998 * result.ordinary_ms + max(result.execution_ms.values())


@spec("duration-estimates/unknown-needs-empty")
def test_cold_catalog_discovers_then_serves():
    result = sim.run(sim.SimConfig(SPEC, requests=5, accepted_drafts=3, costs="cold", rounds=50))
    assert result.executions["discovery"] >= 1 and result.executions["ordinary"] >= 20
    assert all(r.first_output_ms is not None for r in result.requests)


# -- the measurement itself (issue 12, section 2: spread, gaps; section 3: exploration budgets) -------


def _stats(n: int) -> list[sim.RequestStats]:
    return [
        sim.RequestStats(0.0, 64, first_output_ms=1.0, publications=[1.0], output_tokens=1) for _ in range(n)
    ]


def _serve(stats, window, cohort, now, tokens=8) -> bool:
    for i in cohort:
        stats[i].output_tokens += tokens
        stats[i].publications.append(now)
    return window.observe(now, set(cohort), stats)


def _rotate(stats, window, cohorts, start_round=0, limit=1000):
    for k in range(limit):
        if _serve(stats, window, cohorts[(start_round + k) % len(cohorts)], float(k)):
            return k + 1
    raise AssertionError("the spread window never closed")


@spec("verification/hundred-rounds-spread")
@pytest.mark.parametrize("phase", [0, 1, 2])
def test_spread_counts_whole_rotation_cycles(phase):
    """Six streams served two at a time, eight tokens a service: a rotation of three rounds. A fixed
    hundred rounds (33 rotations and one round) would report one cohort a burst ahead (spread 8)
    whatever the scheduler does; whole cycles from a symmetric start report 0."""
    cohorts = [(0, 1), (2, 3), (4, 5)]
    stats = _stats(6)
    window = sim.SpreadWindow(100)
    _rotate(stats, window, cohorts, start_round=phase)
    w = window.result
    assert w["spread_tokens"] == 0 and w["rounds"] == 102 and w["cycles"] == 34 and w["cut_cycles"] == 0
    # what a fixed count of rounds reads for the same service
    gained = [0] * 6
    for k in range(100):
        for i in cohorts[(phase + k) % 3]:
            gained[i] += 8
    assert max(gained) - min(gained) == 8


@spec("verification/hundred-rounds-spread")
def test_spread_still_shows_unfair_service_within_cycles():
    """Whole cycles remove phase, not unfairness: a stream served twice in every cycle gains twice."""
    stats = _stats(3)
    window = sim.SpreadWindow(100)
    _rotate(stats, window, [(0, 1), (0, 2)])  # stream 0 in every round, 1 and 2 every other
    assert window.result["spread_tokens"] == 8 * 50 and window.result["cycles"] == 50


@spec("verification/hundred-rounds-spread")
def test_a_starved_stream_cuts_cycles_and_shows_as_spread():
    """A cycle that never closes is cut after `rounds` rounds, so the window still ends."""
    stats = _stats(3)
    window = sim.SpreadWindow(10)
    rounds = _rotate(stats, window, [(0, 1)])  # stream 2 never served
    assert rounds == 20  # a cut first cycle (the start), then one cut cycle of ten (the window)
    assert window.result["cut_cycles"] == 1 and window.result["spread_tokens"] == 8 * 10


@spec("verification/gaps-150ms")
def test_the_largest_gap_includes_the_wait_still_open_at_the_end():
    served = sim.RequestStats(0.0, 64, first_output_ms=5.0, publications=[5.0, 15.0, 30.0], end_ms=200.0)
    assert served.open_wait_ms == 170.0 and served.max_gap_ms == 170.0
    never = sim.RequestStats(0.0, 64, end_ms=120.0)  # no output yet: its first-output wait counts
    assert never.max_gap_ms == 120.0
    done = sim.RequestStats(
        0.0, 64, first_output_ms=5.0, publications=[5.0, 15.0], finished_ms=15.0, end_ms=200.0
    )
    assert done.max_gap_ms == 10.0
    future = sim.RequestStats(300.0, 64, end_ms=200.0)  # not arrived yet
    assert future.max_gap_ms == 0.0


@spec("verification/gaps-150ms")
def test_requests_that_never_get_a_slot_show_their_wait():
    """Sixteen startup requests on eight request slots: the eight left out wait the whole run."""
    from helios_jax.catalog_family import build

    small = Catalog.from_json(build(slots=8, R=32))
    result = sim.run(sim.SimConfig(small, requests=16, accepted_drafts=0, horizon_ms=300.0))
    waiting = [r for r in result.requests if r.first_output_ms is None]
    assert len(waiting) == 8 and result.progress_spread_tokens is None
    assert all(r.max_gap_ms == pytest.approx(result.virtual_ms) for r in waiting)
    assert max(r.max_gap_ms for r in result.requests) >= 150.0


def test_admit_seeds_the_forecast_from_forecast_history():
    from helios_jax.scheduler.core import Scheduler
    from helios_jax.scheduler.speculation import PrefixEstimate

    s = Scheduler(SPEC)
    seeded = PrefixEstimate(np.linspace(0.9, 0.3, s.depth), np.full(s.depth, 64.0), 0)
    h = s.admit([1] * 8, max_output=100, forecast_history=seeded)
    forecast = s.requests[h.rid].forecast
    assert np.allclose(forecast.means(), seeded.means()) and forecast is not seeded
    plain = s.requests[s.admit([1] * 8, max_output=100).rid].forecast
    assert np.allclose(plain.means(), s.population.forecast_prior.mean)


@pytest.mark.parametrize("history", ["untrained", "preseeded"])
def test_preseeded_startup_seeds_acceptance_and_forecast(history):
    """--acceptance_history=preseeded starts every request with the acceptance model's survival in
    both its acceptance estimate and its confidence forecast; untrained starts both at the prior."""
    from helios_jax.scheduler.core import Scheduler
    from helios_jax.scheduler.speculation import SOURCE_LEARNED

    seen = []

    class Recording(Scheduler):
        def admit(self, prompt, **kwargs):
            h = super().admit(prompt, **kwargs)
            req = self.requests[h.rid]
            seen.append(
                (
                    req.acceptance.get(SOURCE_LEARNED).means().copy(),
                    req.forecast.means().copy(),
                    self.population.forecast_prior.mean.copy(),
                )
            )
            return h

    sim.run(
        sim.SimConfig(SPEC, requests=2, accepted_drafts=3, acceptance_history=history, rounds=5),
        scheduler_factory=Recording,
    )
    truth = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert len(seen) == 2
    for acceptance, forecast, prior in seen:
        if history == "preseeded":
            assert np.allclose(acceptance, truth) and np.allclose(forecast, truth)
        else:
            assert np.allclose(forecast, prior) and not np.allclose(forecast, truth)


class _FreeLedger(refresh.Ledger):
    """A ledger whose episodes are always funded: the exploration budget broken on purpose."""

    def can_start(self) -> bool:
        return not self.episode_active


def _free(which: str):
    from helios_jax.scheduler.core import Scheduler

    class Free(Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            ledger = getattr(self, which)
            setattr(self, which, _FreeLedger(ledger.rate))

    return Free


def _budget_run(factory, ttl_s: float = 0.5, horizon_ms: float = 3_000.0):
    """Three virtual seconds with estimates stale after half a second (so refreshes come early)."""
    policy = PolicyConfig(estimate_ttl_ns=int(ttl_s * 1e9))
    return sim.run(
        sim.SimConfig(
            SPEC,
            requests=6,
            output_tokens=400_000,
            accepted_drafts=None,
            acceptance_probs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
            horizon_ms=horizon_ms,
            rounds=10**9,
            seed=3,
            policy=policy,
        ),
        scheduler_factory=factory,
    )


@functools.lru_cache(maxsize=1)
def _fair_budget_run():
    from helios_jax.scheduler.core import Scheduler

    return _budget_run(Scheduler)


@spec("timing-refresh/aggregate-bound")
def test_refresh_bound_check_fails_when_refresh_is_free():
    """The bound is refresh <= 0.002/0.998 x ordinary + one episode: with refresh made free it must
    report the violation (summing every episode into "one episode" could never fail)."""
    fair = _fair_budget_run()
    assert fair.refresh_bound_ok and len(fair.refresh_episodes_ms) >= 1
    free = _budget_run(_free("timing_ledger"))
    allowance = 0.002 / 0.998 * free.ordinary_ms + free.largest_refresh_episode_ms
    assert len(free.refresh_episodes_ms) > 2 * len(fair.refresh_episodes_ms)
    assert free.timing_refresh_ms > allowance and not free.refresh_bound_ok
    assert free.timing_refresh_ms == pytest.approx(sum(free.refresh_episodes_ms))
    assert free.to_json()["bounds"]["refresh_bound_ok"] is False


@spec("acceptance-learning/aggregate-bound")
def test_acceptance_bound_check_fails_when_probes_are_free():
    fair = _fair_budget_run()
    assert fair.acceptance_bound_ok and len(fair.probe_episodes_ms) >= 1
    free = _budget_run(_free("acceptance_ledger"))
    allowance = 0.01 / 0.99 * free.ordinary_ms + free.largest_probe_episode_ms
    assert free.acceptance_learning_ms > allowance and not free.acceptance_bound_ok
    assert free.acceptance_learning_ms == pytest.approx(sum(free.probe_episodes_ms))


def test_k_step_decode_programs_run_in_the_simulator():
    """The fake executor commits one token per step of a K-step lane (RESOLUTIONS.md, 25): a
    simulated startup over a catalog with K-step programs runs them and serves every output."""
    from helios_jax.reference.crosscheck import with_decode_steps

    from .helpers import ORDINARY

    catalog = with_decode_steps(ORDINARY, (4,), 0.5)  # K = 4 steps for two single steps' time
    steps = []

    class Recording(Scheduler):
        def commit(self, plan, fence):
            steps.append(plan.graph.steps)
            return super().commit(plan, fence)

    config = sim.SimConfig(catalog, requests=4, accepted_drafts=0, output_tokens=24, rounds=20)
    result = sim.run(config, Recording)
    assert 4 in steps
    assert [r.output_tokens for r in result.requests] == [24] * 4


@spec("verification/startup-traces", "verification/first-output-100ms", "verification/gaps-150ms")
@pytest.mark.parametrize("accepted", [0, 3])
@pytest.mark.parametrize("requests", [5, 16])
def test_startup_trace_with_k_step_width_one_programs(requests, accepted):
    """The startup bounds hold with width-one rounds of 4 and 8 steps loaded beside the single
    ones (RESOLUTIONS.md, 25: `--decode_steps` under speculation), measured at 0.6 x K single
    rounds, and the K-step rounds run."""
    from helios_jax.reference.crosscheck import with_decode_steps

    catalog = with_decode_steps(SPEC, (4, 8), 0.6)
    steps = []

    class Recording(Scheduler):
        def commit(self, plan, fence):
            steps.append(plan.graph.steps)
            return super().commit(plan, fence)

    config = sim.SimConfig(catalog, requests=requests, accepted_drafts=accepted, rounds=100)
    _assert_startup_bounds(sim.run(config, Recording))
    assert any(k > 1 for k in steps)
