"""A completed frame's lanes, one by one (``residents.py``): a dropped lane does not stop the
others, several terminal captures complete in one frame, tokens published before a terminal
capture carry no finish reason, prerequisites are dated at completion, and a round that
verified no proposal teaches nothing (docs/mutation.md: the residents pass)."""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.core import NS_PER_MS
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.view import LaneRole, Phase

from .test_checkpoints import sched, step
from .test_core import records, timing

spec = pytest.mark.spec


def until(s, done, fence=0, t=0.0, limit=200):
    """Plan, commit and complete frames until `done(plan, generated)` holds for a completed one."""
    while fence < limit:
        fence += 1
        plan, gen, t = step(s, fence, t)
        if done(plan, gen):
            return plan, gen, fence, t
    raise AssertionError("never reached")


def test_a_lane_dropped_after_cancellation_does_not_stop_the_frames_other_lanes():
    s = sched()
    handles = [s.admit([3 + i] * 64, max_output=50) for i in range(2)]
    _, _, fence, t = until(s, lambda p, g: all(s.requests[h.rid].phase is Phase.DECODE for h in handles))
    s.advance_to(int(t * NS_PER_MS))
    plan = s.plan()
    assert plan.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE) and len(plan.lanes) == 2
    first, second = (lane.handle for lane in plan.lanes)
    s.commit(plan, fence + 1)
    s.cancel(first)
    before = len(s.requests[second.rid].output)
    gen = s.complete(fence + 1, records(plan), timing(plan.expected_duration_ms))
    assert [g.handle for g in gen] == [second] and len(s.requests[second.rid].output) == before + 1
    assert first.rid not in s.requests  # released at its last fence


@spec("planning-queue/decode-terminal-capture", "prerequisites/terminal-snapshot")
def test_terminal_captures_of_one_frame_all_complete_and_release():
    """Two requests ending in the same round have their terminal captures batched into one
    snapshot frame; each completion becomes visible and each request releases what it held."""
    s = sched()
    handles = [s.admit([3 + i] * 64, max_output=40) for i in range(2)]
    plan, gen, fence, t = until(s, lambda p, g: p.lanes[0].role is LaneRole.TERMINAL)
    assert plan.kind is GraphKind.SNAPSHOT and [lane.role for lane in plan.lanes] == [LaneRole.TERMINAL] * 2
    assert sorted(g.handle.rid for g in gen if g.finished) == sorted(h.rid for h in handles)
    assert not s.requests and s.slots.available == s.slots.size


@spec("prerequisites/terminal-snapshot")
def test_tokens_published_before_the_terminal_capture_carry_no_finish_reason():
    s = sched()
    h = s.admit([3] * 64, max_output=40)
    events, fence, t = [], 0, 0.0
    while h.rid in s.requests:
        fence += 1
        plan, gen, t = step(s, fence, t)
        events += [(plan.kind, g.finished, g.finish_reason) for g in gen]
    assert events[-1] == (GraphKind.SNAPSHOT, True, "length")
    assert all(reason is None and not done for _, done, reason in events[:-1])


@spec("planning-queue/victim-ranking")
def test_a_prerequisite_snapshot_dates_its_checkpoint_at_completion():
    s = sched()
    s.admit(list(range(1, 201)), max_output=3, message_endpoints=[150])
    fence, t = 0, 0.0
    while fence < 40:
        fence += 1
        s.advance_to(int(t * NS_PER_MS))
        plan = s.plan()
        s.commit(plan, fence)
        t += plan.expected_duration_ms + 0.5
        s.advance_to(int(t * NS_PER_MS))
        s.complete(fence, records(plan), timing(plan.expected_duration_ms))
        if plan.kind is GraphKind.SNAPSHOT and plan.lanes[0].role is LaneRole.PREREQUISITE:
            break
    anchor = s.checkpoints.lookup(list(range(1, 151)) + [1])
    assert anchor is not None and anchor.last_demand_ns == int(t * NS_PER_MS)


@spec("speculative-coverage/width-one-draft-context")
def test_a_round_that_verified_no_proposal_teaches_no_acceptance():
    """Width-one rounds offer nothing to verify: the request's acceptance estimate (its weights,
    age and revision) and the draft counters stay as they were."""
    s = sched()
    h = s.admit([3] * 64, max_output=200)
    req = s.requests[h.rid]
    _, _, fence, t = until(s, lambda p, g: req.phase is Phase.DECODE)
    widths = []
    for _ in range(20):
        estimate = req.acceptance.get(req.proposal_source)
        before = (estimate.revision, estimate.tokens_at, np.array(estimate.weight))
        offered = s.counters.speculative["drafts_offered"]
        fence += 1
        plan, _, t = step(s, fence, t)
        width = plan.lanes[0].query_length or plan.lanes[0].ceiling
        widths.append(width)
        if width == 1:
            assert (estimate.revision, estimate.tokens_at) == before[:2]
            np.testing.assert_array_equal(estimate.weight, before[2])
            assert s.counters.speculative["drafts_offered"] == offered
    assert 1 in widths


def test_a_pool_names_itself_in_its_errors():
    s = sched()
    h = s.admit([3] * 64, max_output=4)
    req = s.requests[h.rid]
    with pytest.raises(ResourceError, match="^request slots: "):
        s.residents.slots.free([req.slot], h.rid + 1)
    with pytest.raises(ResourceError, match="^KV pages: "):
        s.residents.pages.free(req.pages[:1], h.rid + 1)
