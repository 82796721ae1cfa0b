"""Scheduler.plan and Scheduler.commit through the public API: the loaded decode mode reaches the
selection (a fixed-width scheduler serves complete prefixes on a ragged program), fences must
strictly increase, and which committed dispatches note a refresh attempt on the program."""

import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import ExecutionClass
from helios_jax.scheduler.view import LaneRole

from .helpers import RAGGED, SPEC
from .test_core import decode_frame_in_flight, run_once, scheduler

MS = NS_PER_MS


def _fixed_ragged_rounds(rounds: int) -> list[tuple[object, dict[int, int]]]:
    """ragged-small loaded in fixed-width mode (width 4) with four long decoders: each plan with
    each request's output left when it was planned, over `rounds` planned rounds."""
    s = Scheduler(RAGGED, mode=DecodeMode.FIXED, fixed_width=4)
    s.seed_costs(0)
    for n in (8, 9, 10, 11):
        s.admit([1] * n, max_output=400)
    out, t = [], 0.0
    for fence in range(1, rounds + 1):
        s.advance_to(int(t * MS))
        remaining = {v.rid: v.output_remaining for v in s.views()}
        plan, _, t = run_once(s, fence, t)
        out.append((plan, remaining))
    return out


def test_a_fixed_width_scheduler_serves_complete_prefixes_on_ragged_programs():
    """Fixed-width mode (useful-service/fixed-complete-prefixes): every decode lane of a
    speculative round is the request's complete fixed-width prefix, min(W, output left), and a
    host ragged program takes only the cohorts whose complete prefixes fit its B lanes and P rows.
    With four decoders of 4 rows each, the P=6 program can hold one of them only; adaptive
    selection would instead narrow lanes (e.g. 3+1+1+1) to serve all four on it, which the
    loaded fixed mode must never do."""
    speculative = 0
    for plan, remaining in _fixed_ragged_rounds(8):
        decode = [lane for lane in plan.lanes if lane.role is LaneRole.DECODE]
        if plan.graph.kind is GraphKind.SPECULATIVE:
            speculative += 1
            g = plan.graph
            assert g.token_capacity == 4
            assert len(decode) <= g.batch_capacity
            assert sum(lane.query_length for lane in decode) <= g.target_capacity
        for lane in decode:
            assert lane.query_length == min(4, remaining[lane.handle.rid]), plan.graph.name
    assert speculative >= 3  # the decoders did reach speculative rounds


def test_a_fence_equal_to_the_last_frames_is_rejected():
    """Fences strictly increase: behind frame 2, a second plan committed as frame 2 again is a
    ValueError that changes nothing; as frame 3 it is accepted."""
    s, _, _ = decode_frame_in_flight()
    plan = s.plan()
    assert plan is not None and not plan.needs_empty_window  # queueable behind frame 2
    with pytest.raises(ValueError, match="fences must increase"):
        s.commit(plan, 2)
    assert [f.fence for f in s.frames] == [2]
    assert all(r.inflight in ([], [2]) for r in s.requests.values())
    s.commit(plan, 3)
    assert [f.fence for f in s.frames] == [2, 3]


def test_an_ordinary_commit_of_a_fresh_program_notes_no_attempt():
    """timing-refresh/attempt-on-commit: an attempt is what a refresh (or a discovery, or a
    dispatch of a stale program) records on commit; an ordinary winner priced on a fresh
    estimate refreshes through its own valid observations, so its commit notes no attempt and
    leaves the program's refresh order at its last valid observation."""
    s = scheduler()
    s.admit([1] * 8, max_output=100)
    s.advance_to(2 * MS)
    plan = s.plan()
    assert plan.reason is ExecutionClass.ORDINARY and s.costs.is_fresh(plan.graph.key, s.now_ns)
    s.commit(plan, 1)
    assert s.costs.last_attempt_ns(plan.graph.key) is None
    assert s.costs.refresh_order_ns(plan.graph.key) == s.costs.last_valid_ns(plan.graph.key) == 0


def test_a_discovery_commit_notes_an_attempt():
    """A cold catalog: the first plan is discovery of an unmeasured program (never stale: it has
    no estimate). Committing it notes an attempt at the commit time."""
    s = Scheduler(SPEC)
    s.admit([1] * 8, max_output=100)
    s.advance_to(3 * MS)
    plan = s.plan()
    assert plan.reason is ExecutionClass.DISCOVERY
    assert not s.costs.is_stale(plan.graph.key, s.now_ns)
    assert s.costs.last_attempt_ns(plan.graph.key) is None
    s.commit(plan, 1)
    assert s.costs.last_attempt_ns(plan.graph.key) == 3 * MS


def test_an_ordinary_commit_of_a_stale_program_notes_an_attempt():
    """Without refresh credit the ordinary winner runs on its stale estimate (alone: it needs an
    empty window). That dispatch is an attempt: committing it advances the program's refresh
    order to the commit time, so a later refresh alternative prefers programs attempted longer
    ago."""
    s = scheduler()
    s.admit([1] * 8, max_output=1000)
    _, _, t = run_once(s, 1, 0.0)
    later = t + 31_000.0  # past the 30 s freshness interval: every estimate is stale
    s.advance_to(int(later * MS))
    assert not s.timing_ledger.can_start()
    plan = s.plan()
    assert plan.reason is ExecutionClass.ORDINARY and plan.needs_empty_window
    assert s.costs.is_stale(plan.graph.key, s.now_ns)
    s.commit(plan, 2)
    assert s.costs.last_attempt_ns(plan.graph.key) == int(later * MS)
    assert s.costs.refresh_order_ns(plan.graph.key) == int(later * MS)
