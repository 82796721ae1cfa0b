"""Lifecycle sequences the state machine (test_state_machine.py) found breaking an invariant,
minimised to plain regression tests."""

import numpy as np
import pytest

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.scheduler.core import NS_PER_MS, PlanRejected, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass, ExecutionTiming
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, SPEC

TOKEN = 3


def _checkpointing(**kw):
    s = Scheduler(ORDINARY, kv_pages=96, page_size=16, checkpoints=True, snapshot_rows=1, **kw)
    s.seed_costs(0)
    return s


def _run_one(s, fence, now_ms):
    """Plan, commit and complete one frame with plain records (a decode lane commits one token);
    returns (plan, generated, now)."""
    s.advance_to(int(now_ms * NS_PER_MS))
    plan = s.plan()
    s.commit(plan, fence)
    now_ms += 1.0
    s.advance_to(int(now_ms * NS_PER_MS))
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(TOKEN,))
        if lane.role is LaneRole.DECODE
        else CompletionRecord(
            lane.handle,
            lane.epoch,
            prompt_tokens=lane.prompt_tokens,
            tokens=(TOKEN,) if lane.finishes_prompt else (),
        )
        if lane.role is LaneRole.PROMPT
        else CompletionRecord(lane.handle, lane.epoch)
        for lane in plan.lanes
    ]
    return plan, s.complete(fence, recs, ExecutionTiming((NS_PER_MS,), NS_PER_MS)), now_ms


def _assert_no_armed_rows(s):
    for cp in s.checkpoints.entries.values():
        assert cp.ready and cp.pins == 0, cp


@pytest.mark.spec("planning-queue/armed-retained", "prerequisites/fenced-ownership")
@pytest.mark.parametrize("in_flight", [False, True])
def test_cancelling_a_pending_terminal_capture_returns_its_row(in_flight):
    """admit(1 token, max_output=1); the prefill finishes the response at its anchor, so a terminal
    capture is armed; cancel (before or while the snapshot runs): the armed row must come back once
    the request's last fence completes, not stay pinned and unready forever."""
    s = _checkpointing()
    h = s.admit([TOKEN], max_output=1)
    _, gen, t = _run_one(s, 1, 0.0)
    assert [(g.tokens, g.finished) for g in gen] == [((TOKEN,), False)]
    assert s.requests[h.rid].phase is Phase.TERMINAL and s.requests[h.rid].capture.row is not None
    if in_flight:
        s.advance_to(int(t * NS_PER_MS))
        plan = s.plan()
        assert plan.lanes[0].role is LaneRole.TERMINAL
        s.commit(plan, 2)
    s.cancel(h)
    if in_flight:
        assert h.rid in s.requests  # fenced: the copy keeps its row through completion
        s.complete(2, [CompletionRecord(h, plan.lanes[0].epoch)], ExecutionTiming((NS_PER_MS,), NS_PER_MS))
    assert not s.requests
    _assert_no_armed_rows(s)


@pytest.mark.spec("planning-queue/armed-retained", "prerequisites/fenced-ownership")
def test_cancelling_a_request_waiting_for_its_restore_unpins_the_checkpoint():
    """A second turn that hits the cache pins the checkpoint for its RESTORE; cancelling it before
    the restore runs must drop that pin (a pinned row can never be evicted)."""
    s = _checkpointing()
    first = s.admit([TOKEN] * 8, max_output=4)
    t, fence = 0.0, 0
    while s.requests[first.rid].phase is not Phase.DECODE:
        fence += 1
        _, _, t = _run_one(s, fence, t)
    s.cancel(first)
    second = s.admit([TOKEN] * 20, max_output=4)
    req = s.requests[second.rid]
    assert req.capture.restore_row is not None and s.checkpoints.entries[req.capture.restore_row].pins == 1
    s.cancel(second)
    assert not s.requests
    _assert_no_armed_rows(s)


@pytest.mark.spec("prerequisites/preemption-no-complete")
@pytest.mark.parametrize("chunks", [0, 1])
def test_preempting_before_the_prompt_is_prefilled_publishes_no_uncomputed_state(chunks):
    """preempt() before (or part way through) the prompt's prefill: a terminal capture of the whole
    prompt would publish state the request never computed, and a later prompt extending it
    would restore it."""
    s = _checkpointing()
    h = s.admit([TOKEN] * 100, max_output=4, message_endpoints=[64])  # anchor at 64: a cut, then a snapshot
    t = 0.0
    for fence in range(1, chunks + 1):
        _, _, t = _run_one(s, fence, t)
    consumed = s.requests[h.rid].consumed
    s.preempt(h)
    fence = chunks
    while s.requests:
        fence += 1
        _, _, t = _run_one(s, fence, t)
    hit = s.checkpoints.lookup([TOKEN] * 200)
    assert hit is None or hit.length <= consumed


@pytest.mark.spec("planning-queue/commit-checks", "acceptance-learning/next-needs-full")
def test_a_saved_probe_plan_whose_credit_is_spent_is_rejected_without_side_effects():
    """A plan outlives later calls; commit rechecks it. A saved acceptance probe committed again
    after its episode was paid (credit no longer full) must be refused with PlanRejected, like any
    other stale plan, not crash the engine with the ledger's ValueError."""
    s = Scheduler(SPEC)
    s.seed_costs(0)
    s.admit([TOKEN] * 8, max_output=1000)
    fence, now = 0, 0.0
    while True:
        s.advance_to(int(now * NS_PER_MS))
        plan = s.plan()
        if plan.reason is ExecutionClass.ACCEPTANCE_LEARNING:
            break
        fence += 1
        now = _complete_plainly(s, plan, fence, now, 100.0)  # ordinary time earns the probe's credit
    fence += 1
    now = _complete_plainly(s, plan, fence, now, 5.0)  # the probe runs and pays
    assert not s.acceptance_ledger.can_start()

    def state():
        return (
            tuple(s.requests[0].inflight),
            s.in_flight,
            s.acceptance_ledger.copy(),
            s.timing_ledger.copy(),
            dict(s.selections),
        )

    before = state()
    with pytest.raises(PlanRejected):
        s.commit(plan, fence + 1)
    assert state() == before


def _complete_plainly(s, plan, fence, now_ms, ms):
    """Commit `plan` as `fence` and complete it after `ms` (no proposals accepted)."""
    s.commit(plan, fence)
    now_ms += ms
    s.advance_to(int(now_ms * NS_PER_MS))
    recs = []
    for lane in plan.lanes:
        if lane.role is LaneRole.PROMPT:
            recs.append(
                CompletionRecord(
                    lane.handle,
                    lane.epoch,
                    prompt_tokens=lane.prompt_tokens,
                    tokens=(TOKEN,) if lane.finishes_prompt else (),
                )
            )
        elif lane.role is LaneRole.DECODE:
            recs.append(
                CompletionRecord(
                    lane.handle, lane.epoch, tokens=(TOKEN,), offered=max(0, lane.query_length - 1)
                )
            )
        else:
            recs.append(CompletionRecord(lane.handle, lane.epoch))
    timing = ExecutionTiming((ms * NS_PER_MS,), ms * NS_PER_MS)
    if plan.graph.allocation is Allocation.PREFIX_LIMIT and plan.graph.proposal_depth:
        sidecar = np.zeros((2, s.catalog.request_slots, plan.graph.proposal_depth), np.float32)
        s.complete_packed_round(fence, recs, timing, sidecar)
    else:
        s.complete(fence, recs, timing)
    return now_ms


@pytest.mark.spec("prerequisites/private-no-prefix-cache")
def test_a_prompt_with_images_publishes_no_checkpoint():
    """Checkpoints are keyed by token ids; a prompt with an image holds its features, which the
    same placeholder ids in a text prompt do not. With retention on, an image request (one
    window) neither captures anchors nor a terminal state, so a text prompt with the same ids
    finds nothing to restore."""
    from helios_jax.scheduler.core import NS_PER_MS, Scheduler
    from helios_jax.scheduler.view import Phase

    from .helpers import SPEC
    from .test_core import records, timing

    s = Scheduler(SPEC, checkpoints=True, vision_window_tokens=300)
    s.seed_costs(0)
    prompt = list(range(1, 201))
    h = s.admit(prompt, max_output=3, image_spans=[(10, 60)], message_endpoints=[200])
    t, fence = 0.0, 0
    while h.rid in s.requests and fence < 40:
        fence += 1
        s.advance_to(int(t * NS_PER_MS))
        plan = s.plan()
        s.commit(plan, fence)
        t += plan.expected_duration_ms
        s.advance_to(int(t * NS_PER_MS))
        for g in s.complete(fence, records(plan), timing(plan.expected_duration_ms)):
            if g.tokens:
                s.published_output(g.handle, fence)
        assert plan.kind is not GraphKind.SNAPSHOT
    assert h.rid not in s.requests
    text = s.admit(prompt + [7], max_output=3)
    assert s.requests[text.rid].phase is Phase.PREFILL and s.requests[text.rid].cached == 0


@pytest.mark.spec("planning-queue/victim-ranking")
def test_a_terminal_capture_keeps_its_own_requests_anchor():
    """One snapshot row, held by the request's own prompt-end anchor: its terminal capture must
    not evict it (the next turn of a chat extends the anchor; RESOLUTIONS.md, 34), and must not
    be armed without a row either: the request simply ends uncaptured. (A preemption funds the
    terminal capture whatever the request's allowance.)"""
    s = _checkpointing()
    h = s.admit([TOKEN] * 8, max_output=20)
    t, fence = 0.0, 0
    while s.requests:
        if fence == 4:
            assert s.requests[h.rid].phase is Phase.DECODE
            s.preempt(h)
            fence += 1
            continue
        fence += 1
        _, _, t = _run_one(s, fence, t)
        assert fence < 50
    (cp,) = s.checkpoints.entries.values()
    assert cp.tokens == (TOKEN,) * 8 and cp.owner == h.rid
    _assert_no_armed_rows(s)
