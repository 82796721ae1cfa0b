"""The spec's startup traces and the exploration-budget bounds, on the simulator."""
import dataclasses

import pytest

from helios_jax import simulation as sim
from helios_jax.catalog import Catalog

from .helpers import SPEC

spec = pytest.mark.spec


@spec("verification/startup-traces", "verification/first-output-100ms", "verification/gaps-150ms",
      "verification/hundred-rounds-spread", "verification/selector-output-gaps")
@pytest.mark.parametrize("history", ["untrained", "preseeded"])
@pytest.mark.parametrize("accepted", [0, 3, 7])
@pytest.mark.parametrize("requests", [5, 16])
def test_startup_trace(requests, accepted, history):
    """Every 64-token prompt delivers its first output within 100 ms, later gaps stay below
    150 ms, and another hundred rounds give every stream progress within one 8-token burst."""
    result = sim.run(sim.SimConfig(SPEC, requests=requests, accepted_drafts=accepted, acceptance_history=history,
                                   rounds=100))
    firsts = [r.first_output_ms for r in result.requests]
    assert all(f is not None and f <= 100.0 for f in firsts), firsts
    assert max(r.max_gap_ms for r in result.requests) < 150.0
    assert result.progress_spread_tokens is not None and result.progress_spread_tokens <= 8
    gained_min = min(r.output_tokens for r in result.requests)
    assert gained_min >= 100  # every stream progressed through the hundred rounds


def _slow(catalog: Catalog, factor: float) -> Catalog:
    """The same catalog with every duration scaled (fewer rounds per virtual minute)."""
    return dataclasses.replace(catalog, graphs=tuple(
        dataclasses.replace(g, duration_ms=g.duration_ms * factor) for g in catalog.graphs))


@spec("timing-refresh/aggregate-bound", "acceptance-learning/aggregate-bound", "timing-refresh/first-2495ms",
      "timing-refresh/full-credit-displace", "acceptance-learning/execution-metrics")
def test_exploration_budgets_over_a_virtual_minute():
    """About a minute of continuous decoding: estimates go stale after 30 s and refreshes start;
    refresh time <= 0.002/0.998 * ordinary + one episode, probes <= 0.01/0.99 * ordinary + one
    episode, and the first refresh waited for 2,495 ms of credited ordinary execution."""
    catalog = _slow(SPEC, 8.0)
    result = sim.run(sim.SimConfig(catalog, requests=6, output_tokens=400_000, accepted_drafts=None,
                                   acceptance_probs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3), horizon_ms=70_000.0,
                                   rounds=10**9, noise=0.05, seed=3))
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
