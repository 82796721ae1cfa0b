"""The Scheduler's lifecycle on a virtual clock: plan, commit, complete, publish, cancel."""

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import refresh
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import NS_PER_MS, PlanRejected, Scheduler
from helios_jax.scheduler.frames import reanchor
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass, ExecutionTiming
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.speculation import SOURCE_COPY, SOURCE_LEARNED
from helios_jax.scheduler.view import LaneRole, Phase
from helios_jax.serve.metrics import render_scheduler_stats

from .helpers import ORDINARY, RAGGED, SPEC

spec = pytest.mark.spec
MS = NS_PER_MS


def scheduler(catalog=ORDINARY, **kw):
    s = Scheduler(catalog, **kw)
    s.seed_costs(0)
    return s


def records(plan, accepted=0, token=5):
    """Well-formed records: prompt lanes as planned, decode rounds accepting `accepted`."""
    out = []
    for lane in plan.lanes:
        if lane.role is LaneRole.PROMPT:
            out.append(
                CompletionRecord(
                    lane.handle,
                    lane.epoch,
                    prompt_tokens=lane.prompt_tokens,
                    tokens=(token,) if lane.finishes_prompt else (),
                )
            )
        elif lane.role is LaneRole.DECODE:
            rows = lane.query_length or lane.ceiling
            a = min(accepted, rows - 1)
            out.append(
                CompletionRecord(
                    lane.handle, lane.epoch, tokens=(token,) * (a + 1), offered=rows - 1, accepted=a
                )
            )
        else:
            out.append(CompletionRecord(lane.handle, lane.epoch))
    return out


def timing(ms, queued=False, wall_ms=None):
    return ExecutionTiming((ms * MS,), (ms if wall_ms is None else wall_ms) * MS, queued=queued)


def run_once(s, fence, now_ms, accepted=0, publish=True):
    """plan, commit, complete after the plan's expected duration, publish every burst."""
    s.advance_to(int(now_ms * MS))
    plan = s.plan()
    s.commit(plan, fence)
    end = now_ms + (plan.expected_duration_ms or 1.0)
    s.advance_to(int(end * MS))
    gen = s.complete(fence, records(plan, accepted), timing(plan.expected_duration_ms or 1.0))
    if publish:
        for g in gen:
            s.published_output(g.handle, fence)
    return plan, gen, end


def decode_frame_in_flight(**kw):
    """One decoder past its prefill (frame 1) and its first decode frame committed as frame 2 at
    the prefill's end t: (scheduler, t, that decode plan)."""
    s = scheduler(**kw)
    s.admit([1] * 8, max_output=1000)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 2)
    return s, t, plan


def two_decoders():
    """Two streams admitted and prefilled one at a time (frames 1 and 2), each then decoding:
    (scheduler, the time the second prefill ended)."""
    s = scheduler()
    for _ in range(2):
        s.admit([1] * 8, max_output=1000)
    t = 0.0
    for fence in (1, 2):
        _, _, t = run_once(s, fence, t)
    return s, t


def snapshot(s):
    """Everything completion may change, for 'changes nothing' checks."""
    reqs = {
        rid: (
            r.phase,
            r.epoch,
            r.consumed,
            list(r.output),
            r.history.log_x,
            r.history.log_z,
            r.acceptance.get(r.proposal_source).mean.tolist(),
            list(r.inflight),
        )
        for rid, r in s.requests.items()
    }
    return (
        reqs,
        {k: s.costs.samples(k) for k in s.costs.keys()},
        s.timing_ledger.balance_ms,
        s.acceptance_ledger.balance_ms,
        tuple(s.in_flight),
        s.pages.owned(),
        dict(s.executions),
    )


@spec("planning-queue/api")
def test_api_round_trip():
    s = scheduler()
    h = s.admit([1] * 10, max_output=4)
    plan, gen, _ = run_once(s, 1, 0.0)
    assert plan.kind is GraphKind.PREFILL and gen[0].handle == h and gen[0].tokens == (5,)


@spec("policy/configure-before-admission")
def test_a_policy_configured_before_admission_governs_the_scheduler():
    """configure_policy before the first admission sets every preference, the freshness interval
    included: the plans equal those of a scheduler built with that policy. After admission it is
    refused and the configured policy stays."""
    configured = PolicyConfig(output_token_value=128.0, token_fairness=4.0, estimate_ttl_ns=10 * MS)
    s = scheduler()
    s.configure_policy(configured)
    reference = Scheduler(ORDINARY, policy_config=configured)
    reference.seed_costs(0)
    for sched in (s, reference):
        sched.admit([1] * 10, max_output=4)
        sched.advance_to(0)
    plan, default = s.plan(), scheduler()
    default.admit([1] * 10, max_output=4)
    assert plan == reference.plan() and plan.value_rate != default.plan().value_rate
    decode = next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE)
    assert not s.costs.is_stale(decode.key, 10 * MS) and s.costs.is_stale(decode.key, 10 * MS + 1)
    with pytest.raises(ValueError, match="precede admission"):
        s.configure_policy(PolicyConfig())
    assert s.policy == configured and s.costs.ttl_ns == 10 * MS


def test_admission_validation_and_resources():
    s = scheduler(kv_pages=8, page_size=16)
    with pytest.raises(ValueError, match="at least one token"):
        s.admit([], max_output=1)
    with pytest.raises(ValueError, match="max_output"):
        s.admit([1], max_output=0)
    with pytest.raises(ValueError, match="image spans"):
        s.admit([1, 2], max_output=1, image_spans=[(1, 5)])
    s.admit([1] * 40, max_output=60)  # 100 + draft storage 0 -> 7 pages
    assert not s.can_admit(20, 20)
    with pytest.raises(ResourceError, match="KV pages"):
        s.admit([1] * 20, max_output=20)


@spec("planning-queue/plan-readonly", "planning-queue/plan-freezes")
def test_plan_is_pure_and_frozen():
    s = scheduler(SPEC)
    for _ in range(3):
        s.admit([1] * 64, max_output=50)
    before = snapshot(s)
    a, b = s.plan(), s.plan()
    assert a == b and snapshot(s) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.lanes = ()  # frozen
    assert a.expected_duration_ms > 0 and a.lanes[0].epoch == 0 and a.selection_value_rate() == a.value_rate
    assert a.decode_mode is s.mode and a.planned_at_ns == s.now_ns
    assert math.isfinite(a.selection_log_scale())


@spec(
    "planning-queue/two-slots",
    "planning-queue/double-occupancy",
    "planning-queue/draining-kinds",
    "planning-queue/appended-start",
    "planning-queue/no-ms-cap",
    "planning-queue/feedback-visible",
)
def test_two_decode_frames_queue_and_drain_kinds_do_not():
    s = scheduler()
    for _ in range(2):
        s.admit([1] * 8, max_output=100)
    t = 0.0
    for fence in (1, 2):  # two prefills, one at a time (each drains)
        plan, _, t = run_once(s, fence, t)
        assert plan.kind is GraphKind.PREFILL or plan.kind is GraphKind.MIXED
        assert plan.needs_empty_window and plan.expected_duration_ms is not None  # known, still drains
    s.advance_to(int(t * MS))
    first = s.plan()
    assert first.kind is GraphKind.DECODE and not first.needs_empty_window
    assert all(lane.prompt_start == 0 for lane in first.lanes)  # decode lanes consume no prompt
    s.commit(first, 3)
    second = s.plan()
    assert second.kind is GraphKind.DECODE
    assert second.planning_start_ns == int(t * MS) + int(first.expected_duration_ms * MS)  # queue end
    s.commit(second, 4)
    # The appended frame is expected to end one estimate after the queued one, not after now.
    assert s.frames[1].expected_end_ns == s.frames[0].expected_end_ns + int(second.expected_duration_ms * MS)
    assert s.plan() is None  # two frame slots
    with pytest.raises(PlanRejected, match="window"):
        s.commit(second, 5)
    # A drain-only winner waits: a new prompt arrives while decode frames are in flight.
    s.complete(3, records(first), timing(first.expected_duration_ms, queued=False))
    s.admit([1] * 8, max_output=10, host_stops=False)
    waiting = s.plan()
    if waiting is not None and waiting.needs_empty_window:
        with pytest.raises(PlanRejected, match="empty window"):
            s.commit(waiting, 6)


@spec("planning-queue/overrun-suspends")
def test_a_frame_overruns_only_past_its_expected_end():
    """A queued frame suspends further queueing once the clock passes its expected end, not at
    it: at the end itself the next frame may still be appended."""
    s = scheduler()
    s.admit([1] * 8, max_output=100)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    first = s.plan()
    s.commit(first, 2)
    end = s.frames[-1].expected_end_ns
    s.advance_to(end)
    assert s.plan() is not None
    s.advance_to(end + 1)
    assert s.plan() is None


@spec("planning-queue/commit-checks", "planning-queue/prefill-exposes-late")
def test_commit_rechecks_epochs_and_exposes_decoders_after_completion():
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    plan = s.plan()
    s.commit(plan, 1)
    assert s.plan() is None  # the finishing prefill drains; its decoder is not exposed yet
    s.advance_to(int(5 * MS))
    s.complete(1, records(plan), timing(5.0))
    with pytest.raises(PlanRejected, match="epoch|no longer resident|prompt position"):
        s.commit(plan, 2)  # the same plan again: its epoch moved on
    assert s.plan().kind is GraphKind.DECODE


@spec(
    "service-accounting/validate-first", "verification/mixed-malformed", "mixed-execution/complete-by-phase"
)
@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r, p: r[:-1], "records for"),
        (
            lambda r, p: (
                [r[0].__class__(r[0].handle, r[0].epoch + 1, r[0].prompt_tokens, r[0].tokens)] + r[1:]
            ),
            "epoch",
        ),
        (
            lambda r, p: (
                [r[0].__class__(r[0].handle, r[0].epoch, r[0].prompt_tokens + 1, r[0].tokens)] + r[1:]
            ),
            "prompt tokens",
        ),
        (
            lambda r, p: (
                r[:1]
                + [r[1].__class__(r[1].handle, r[1].epoch, tokens=(1, 2, 3), offered=0, accepted=0)]
                + r[2:]
            ),
            "accepted proposals plus one",
        ),
        (
            lambda r, p: (
                r[:1] + [r[1].__class__(r[1].handle, r[1].epoch, tokens=(-1,), offered=0, accepted=0)] + r[2:]
            ),
            "nonnegative",
        ),
    ],
)
def test_malformed_mixed_completion_changes_nothing(mutate, message):
    s = scheduler()
    s.admit([1] * 8, max_output=50)
    _, _, t = run_once(s, 1, 0.0)
    s.admit([1] * 40, max_output=50)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.kind is GraphKind.MIXED and plan.prefill_row == 0
    s.commit(plan, 2)
    before = snapshot(s)
    with pytest.raises(ValueError, match=message):
        s.complete(2, mutate(records(plan), plan), timing(plan.expected_duration_ms))
    assert snapshot(s) == before
    s.complete(2, records(plan), timing(plan.expected_duration_ms))  # the valid report still lands


@spec(
    "service-accounting/one-interval",
    "service-accounting/queued-interval",
    "service-accounting/isolated-interval",
    "useful-service/actual-updates-history",
)
def test_service_intervals():
    """An isolated frame charges max(device, wall); a queued one its device interval only."""
    s = scheduler()
    s.admit([1] * 8, max_output=100)
    s.admit([1] * 8, max_output=100)
    t = 0.0
    _, _, t = run_once(s, 1, t)
    _, _, t = run_once(s, 2, t)
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 3)
    x_before = {r.rid: r.history.log_x for r in s.requests.values()}
    s.complete(3, records(plan), ExecutionTiming((3.0 * MS,), 10.0 * MS, queued=False))
    # Both served one token over max(3, 10) = 10 ms: x <- a*x + (1-a)*1/10 with a = exp(-0.1)
    for rid, before in x_before.items():
        expect = math.log(math.exp(before) * math.exp(-0.1) + (1 - math.exp(-0.1)) * 0.1)
        assert s.requests[rid].history.log_x == pytest.approx(expect)


@spec(
    "service-accounting/zero-deliveries",
    "service-accounting/first-publication",
    "service-accounting/burst-count",
    "service-accounting/age-host-time",
    "service-accounting/publish-before-complete",
    "service-accounting/no-rewind",
    "planning-queue/age-reset-published",
    "service-accounting/postponed-output",
)
def test_publication_replaces_the_delivery_update():
    s = scheduler()
    h = s.admit([1] * 8, max_output=100)
    _, _, t = run_once(s, 1, 0.0)
    req = s.requests[h.rid]
    z0 = req.history.log_z
    assert z0 == pytest.approx(
        -math.log(
            s.costs.estimate_ms(
                next(g.key for g in ORDINARY.graphs if g.kind is GraphKind.PREFILL and g.token_capacity == 64)
            )
        )
    )
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 2)
    s.advance_to(int((t + 3.5) * MS))
    s.complete(2, records(plan), timing(3.5))
    zero = req.history.log_z
    assert zero == pytest.approx(z0 - 3.5 / 100)  # completion records zero deliveries
    s.advance_to(int((t + 9.0) * MS))  # publication postponed (stop buffering) to t + 9
    s.published_output(h, 2)
    one = req.history.log_z
    assert one == pytest.approx(math.log(math.exp(z0 - 0.035) + (1 - math.exp(-0.035)) / 3.5))
    s.published_output(h, 2)  # later tokens of the same burst change nothing
    assert req.history.log_z == one and req.last_publication_ns == int((t + 9.0) * MS)
    plan = s.plan()
    s.commit(plan, 3)
    s.complete(3, records(plan), timing(3.5))
    with pytest.raises(ValueError, match="precede the next completion"):
        s.published_output(h, 2)


@spec("planning-queue/age-reset-published")
def test_output_age_counts_from_admission_until_the_first_publication():
    """A decoding request whose first token has not been published yet (the engine buffers it)
    has waited for visible output since its admission: its view's age is the time since
    admission, not zero. Publishing the burst resets the age at the publication time."""
    s = scheduler()
    s.advance_to(2 * MS)
    h = s.admit([1] * 8, max_output=100)  # admitted at 2 ms
    _, gen, t = run_once(s, 1, 2.0, publish=False)
    assert gen[0].tokens and s.requests[h.rid].phase is Phase.DECODE
    s.advance_to(int((t + 3.0) * MS))
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.age_ms == pytest.approx(t + 3.0 - 2.0)
    s.published_output(h, 1)  # published now, at t + 3
    s.advance_to(int((t + 5.0) * MS))
    assert next(v for v in s.views() if v.rid == h.rid).age_ms == pytest.approx(2.0)


@spec("mixed-execution/fixed-width-shared")
def test_a_fixed_width_scheduler_runs_only_programs_of_its_width():
    """A scheduler loaded in fixed-width mode with fixed_width=4 selects among the width-4
    host-allocated speculative programs only (and mixed graphs of that width), never the catalog's
    widest (8) that fixed mode defaults to without a width."""
    s = Scheduler(SPEC, mode=DecodeMode.FIXED, fixed_width=4)
    s.seed_costs(0)
    assert {
        g.token_capacity for g in s.graphs.graphs if g.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED)
    } == {4}
    s.admit([1] * 8, max_output=50)
    s.admit([2] * 40, max_output=50)
    t = 0.0
    for fence in range(1, 5):
        plan, _, t = run_once(s, fence, t, accepted=3)
        if plan.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED):
            assert plan.graph.token_capacity == 4
            assert all(lane.query_length == 4 for lane in plan.lanes if lane.role is LaneRole.DECODE)
    assert s.selections[GraphKind.SPECULATIVE.value] >= 2


@spec("prerequisites/atomic-span-chunk")
def test_a_prefill_chunk_stops_before_an_image_span_it_cannot_hold_whole():
    """An image span is atomic: a 5000-token prompt whose image occupies [4000, 4200) cannot
    take the largest chunk (4096 tokens, which would end inside the image); the first chunk
    stops at the image's start, and the request's view carries the span relative to its cursor."""
    s = scheduler(SPEC)
    h = s.admit(list(range(1, 5001)), max_output=2, image_spans=[(4000, 4200)])
    t, fence, ends = 0.0, 0, []
    while s.requests[h.rid].phase is not Phase.DECODE:
        fence += 1
        s.advance_to(int(t * MS))
        view = next(v for v in s.views() if v.rid == h.rid)
        consumed = s.requests[h.rid].consumed
        assert view.atomic_spans == ((4000 - consumed, 4200 - consumed),)
        plan, _, t = run_once(s, fence, t)
        ends += [
            lane.prompt_start + lane.prompt_tokens for lane in plan.lanes if lane.role is LaneRole.PROMPT
        ]
    assert ends == [4000, 5000]


@spec("useful-service/conditional-acceptance")
def test_a_width_limit_of_one_is_valid_and_restricts_rounds_to_the_pending_token():
    """A width limit counts target rows, the pending token included, so one is the tightest valid
    restriction (a grammar state with one continuation): admission and restrict_width accept it,
    and the request's rounds then verify no proposals."""
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=50, width_limit=1)
    t = 0.0
    for fence in range(1, 4):
        plan, _, t = run_once(s, fence, t, accepted=3)
        assert all(
            max(lane.query_length, lane.ceiling) <= 1 for lane in plan.lanes if lane.role is LaneRole.DECODE
        )
    s.restrict_width(h, None)
    s.restrict_width(h, 1)
    s.advance_to(int(t * MS))
    assert next(v for v in s.views() if v.rid == h.rid).width_limit == 1


@spec(
    "service-accounting/cancelled-slot-reuse",
    "planning-queue/cancel-stops",
    "planning-queue/cancel-keeps-pages",
    "prerequisites/fenced-ownership",
    "planning-queue/pages-pinned",
)
def test_cancellation_keeps_fenced_resources_and_never_charges_the_next_owner():
    s = scheduler(catalog=ORDINARY)
    h = s.admit([1] * 8, max_output=100)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 2)
    slot, pages = s.requests[h.rid].slot, list(s.requests[h.rid].pages)
    s.cancel(h)
    assert s.plan() is None  # selection stops at once
    assert all(s.pages.owned()[p] == h.rid for p in pages)  # still owned through fence 2
    s.complete(2, records(plan), timing(3.5))
    assert h.rid not in s.requests and not s.pages.owned()
    h2 = s.admit([1] * 8, max_output=100)
    assert s.requests[h2.rid].slot == slot and h2.generation == h.generation + 1
    assert s.requests[h2.rid].history.log_x is None  # nothing charged from the cancelled lane
    with pytest.raises(KeyError):
        s.cancel(h)


@spec(
    "planning-queue/queued-lane-bound",
    "planning-queue/limits-use-bound",
    "confidence-acceptance/expected-output-bounds",
)
def test_output_limits_account_for_queued_rounds():
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=10)
    _, _, t = run_once(s, 1, 0.0)  # 1 token out, 9 left
    s.advance_to(int(t * MS))
    p1 = s.plan()
    s.commit(p1, 2)
    bound = p1.max_advance(p1.lanes[0])
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.output_remaining == 9 - bound
    p2 = s.plan()
    if p2 is not None and p2.kind is not GraphKind.MIXED:
        assert all(p2.max_advance(lane) <= 9 - bound for lane in p2.lanes)


@spec(
    "planning-queue/packed-round",
    "confidence-acceptance/completed-only",
    "confidence-acceptance/rank-zero",
    "confidence-acceptance/peer-valid-probs",
)
def test_device_allocation_completes_through_the_packed_round():
    s, handles, plan, _ = _packed_round_in_flight()
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5, 5), offered=1, accepted=1) for lane in plan.lanes
    ]
    with pytest.raises(ValueError, match="complete_packed_round"):
        s.complete(5, recs, timing(4.7))
    sidecar = np.zeros((2, RAGGED.request_slots, 3), np.float32)
    sidecar[1, :, :] = [0.9, 0.5, 0.2]
    bad_peer = sidecar.copy()
    bad_peer[1, plan.lanes[0].slot, 0] = 1.5
    with pytest.raises(ValueError, match="rank 1"):
        s.complete_packed_round(5, recs, timing(4.7), [sidecar, bad_peer])
    before = s.requests[handles[0].rid].forecast.mean.copy()
    peer = sidecar.copy()
    peer[1] *= 0.99  # peers need not agree bitwise; rank zero's drives the forecasts
    s.complete_packed_round(5, recs, timing(4.7), [sidecar, peer])
    after = s.requests[handles[0].rid].forecast.mean
    # ceiling 4 -> depths 1..3 observed; weight 2 aged by the three tokens generated so far
    # (the first token from the prefill, then this round's two)
    w = 2 * 0.5 ** (3 / 128)
    np.testing.assert_allclose(
        after, [(w * p + x) / (w + 1) for p, x in zip([0.5, 0.25, 0.125], [0.9, 0.5, 0.2])], rtol=1e-6
    )  # the sidecar is float32
    assert not np.allclose(before, after)


def _device_only():
    """ragged-small with its prefill and device-allocated (prefix_limit) programs only."""
    return dataclasses.replace(
        RAGGED,
        graphs=tuple(
            g
            for g in RAGGED.graphs
            if g.kind is GraphKind.PREFILL
            or (g.allocation is not None and g.allocation.value == "prefix_limit")
        ),
    )


def _packed_round_in_flight():
    """Four decoders on device-allocated speculative programs (ceiling 4, depth 3) and their
    first packed round committed as fence 5: (scheduler, handles, plan, now_ms)."""
    s = scheduler(_device_only())
    handles = [s.admit([1] * 8, max_output=100) for _ in range(4)]
    t = 0.0
    for fence in range(1, 5):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.allocation.value == "prefix_limit" and all(lane.ceiling == 4 for lane in plan.lanes)
    s.commit(plan, 5)
    return s, handles, plan, t


def _sidecar(shape=(2, RAGGED.request_slots, 3)):
    sidecar = np.zeros(shape, np.float32)
    sidecar[1:2, ...] = [0.9, 0.5, 0.2][: shape[-1]]
    return sidecar


@spec("planning-queue/survival-variants", "planning-queue/packed-round")
def test_the_packed_round_with_survival_takes_both_the_sidecar_and_the_survival_rows():
    """A device-allocated speculative program that also wrote completion_speculative_survival rows
    completes through complete_packed_round_with_survival: one call commits the round's tokens,
    the sidecar's row 1 drives the forecasts, and the survival rows (not the binary accept
    counts) are the acceptance observations. Pins that this variant forwards the records, the
    sidecar and the survival rows to the same completion as the other three."""
    s, handles, plan, t = _packed_round_in_flight()
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5, 5), offered=1, accepted=1) for lane in plan.lanes
    ]
    sidecar = _sidecar()
    survival = np.zeros((RAGGED.request_slots, 3))
    survival[:, 0] = 0.8  # the one accepted proposal survived with probability 0.8, not 1
    req = s.requests[handles[0].rid]
    assert req.acceptance.get(req.proposal_source).mean[0] == 0.5  # the fresh prior, weight 2
    s.advance_to(int((t + 4.7) * MS))
    gen = s.complete_packed_round_with_survival(5, recs, timing(4.7), sidecar, survival)
    assert sorted((g.handle.rid, g.tokens) for g in gen) == [(h.rid, (5, 5)) for h in handles]
    assert s.in_flight == () and len(req.output) == 3
    w = 2 * 0.5 ** (3 / 128)  # the prior's weight aged by the three tokens generated so far
    np.testing.assert_allclose(
        req.forecast.mean,
        [(w * p + x) / (w + 1) for p, x in zip([0.5, 0.25, 0.125], [0.9, 0.5, 0.2])],
        rtol=1e-6,
    )
    assert req.acceptance.get(req.proposal_source).mean[0] == pytest.approx((w * 0.5 + 0.8) / (w + 1))


def _survival(value, at=0):
    """Survival rows as the host may pass them (nested lists), `value` at depth `at` + 1."""
    rows = [[0.5, 0.5, 0.5] for _ in range(RAGGED.request_slots)]
    for row in rows:
        row[at] = value
    return rows


@spec("service-accounting/validate-first", "planning-queue/packed-round", "planning-queue/survival-variants")
@pytest.mark.parametrize(
    "sidecar, survival, message",
    [
        (_sidecar((3, RAGGED.request_slots, 3)), None, "sidecar shape"),  # a third leading row
        (_sidecar((2, RAGGED.request_slots, 3))[:, :, 0], None, "sidecar shape"),  # no draft dimension
        (_sidecar(), _survival(None), "survival values must be probabilities"),  # a missing value
        (_sidecar(), _survival(1.5), "survival values must be probabilities"),
    ],
    ids=["three-leading-rows", "no-draft-dimension", "missing-survival-value", "survival-above-one"],
)
def test_a_malformed_sidecar_or_survival_row_is_refused_before_anything_changes(sidecar, survival, message):
    """The confidence sidecar is [2, request_slots, >= depth] (row 1 the joint prefix
    probabilities) and survival values are probabilities; a completion carrying anything else
    (another leading row count, a missing dimension, a missing or out-of-range survival value
    at an offered depth) is refused with a ValueError before any state changes, and the valid
    report still lands afterwards."""
    s, handles, plan, t = _packed_round_in_flight()
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5, 5), offered=1, accepted=1) for lane in plan.lanes
    ]
    s.advance_to(int((t + 4.7) * MS))
    before = snapshot(s)
    with pytest.raises(ValueError, match=message):
        if survival is None:
            s.complete_packed_round(5, recs, timing(4.7), sidecar)
        else:
            s.complete_packed_round_with_survival(5, recs, timing(4.7), sidecar, survival)
    assert snapshot(s) == before
    assert len(s.complete_packed_round(5, recs, timing(4.7), _sidecar())) == len(handles)


@spec("planning-queue/survival-variants")
def test_a_survival_value_of_zero_is_a_valid_observation():
    """Survival values are probabilities, zero included: a proposal that certainly did not
    survive (its survival value 0.0) is a valid observation, and the acceptance estimate at that
    depth moves towards zero by the aged prior's share."""
    s, handles, plan, t = _packed_round_in_flight()
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5,), offered=1, accepted=0) for lane in plan.lanes
    ]
    s.advance_to(int((t + 4.7) * MS))
    gen = s.complete_packed_round_with_survival(5, recs, timing(4.7), _sidecar(), _survival(0.0))
    assert sorted(g.handle.rid for g in gen) == [h.rid for h in handles]
    req = s.requests[handles[0].rid]
    w = 2 * 0.5 ** (2 / 128)  # the prior (0.5 at weight 2) aged by the two tokens generated so far
    assert req.acceptance.get(req.proposal_source).mean[0] == pytest.approx(w * 0.5 / (w + 1))


@spec("acceptance-learning/idle-clears", "timing-refresh/idle-discards")
def test_idle_clears_positive_credit():
    s = scheduler()
    s.timing_ledger.earn(100.0)
    s.acceptance_ledger.earn(100.0)
    s.advance_to(10)  # nothing resident: idle
    assert s.timing_ledger.balance_ms == 0 and s.acceptance_ledger.balance_ms == 0


@spec(
    "timing-refresh/earn-rate",
    "timing-refresh/credit-cap",
    "acceptance-learning/earn-rate",
    "acceptance-learning/credit-cap",
    "timing-refresh/next-needs-full",
    "acceptance-learning/started-debt",
    "acceptance-learning/next-needs-full",
    "timing-refresh/idle-discards",
    "timing-refresh/first-2495ms",
    "acceptance-learning/one-episode",
)
def test_ledgers():
    t = refresh.timing_ledger()
    t.earn(2494.0)
    assert not t.full and t.balance_ms == pytest.approx(2494 * 0.002 / 0.998)
    t.earn(1.0)
    assert t.full and t.balance_ms == pytest.approx(5.0)
    t.earn(10_000.0)
    assert t.balance_ms == pytest.approx(5.0)  # capped
    t.start()
    with pytest.raises(ValueError):
        t.start()  # one episode
    t.close(40.0)  # a long nonpreemptible episode runs into debt
    assert t.balance_ms == pytest.approx(-35.0) and not t.can_start()
    t.idle()
    assert t.balance_ms == pytest.approx(-35.0)  # idle keeps debt
    a = refresh.acceptance_ledger()
    a.earn(495.0)
    assert a.full  # 5 / (0.01/0.99)
    a.idle()
    assert a.balance_ms == 0


@spec(
    "confidence-acceptance/trace-fields",
    "confidence-acceptance/spec-counters",
    "acceptance-learning/execution-metrics",
)
def test_trace_and_counters():
    s = scheduler(SPEC)
    s.admit([1] * 8, max_output=20)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t, accepted=2)
    rec = s.trace[-1]
    assert (rec.kind, rec.reason) == (GraphKind.SPECULATIVE, ExecutionClass.ORDINARY)
    assert rec.selected_cost_ms > 0 and rec.observation_age_ns >= 0 and rec.exploration_credit_ms == 0
    assert s.speculative["programs"] == 2 and s.executions["ordinary"] == 3
    assert s.execution_ns["ordinary"] > 0


@spec(
    "intro/stages-not-scheduled",
    "speculative-coverage/no-proposal-completion",
    "speculative-coverage/no-retained-proposals",
)
def test_speculative_rounds_are_one_program():
    """A round is one plan and one completion; no proposal step is ever planned on its own."""
    s = scheduler(SPEC)
    s.admit([1] * 8, max_output=50)
    t = 0.0
    kinds = []
    for fence in range(1, 6):
        plan, _, t = run_once(s, fence, t, accepted=3)
        kinds.append(plan.kind)
    assert set(kinds) <= {GraphKind.PREFILL, GraphKind.SPECULATIVE}
    assert len(s.in_flight) == 0


def test_stop_tokens_and_length_finish_requests():
    s = scheduler()
    h = s.admit([1] * 8, max_output=3, stop_token_ids=[9])
    _, gen, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 2)
    gen = s.complete(
        2, [CompletionRecord(plan.lanes[0].handle, plan.lanes[0].epoch, tokens=(9,))], timing(3.5)
    )
    assert gen[0].finished and gen[0].finish_reason == "stop"
    assert h.rid not in s.requests  # retired, resources returned


def test_the_output_limit_finishes_a_request_with_reason_length():
    """A round that reaches max_output finishes the response with finish_reason "length" (the
    engine reports it to the client as is); a stop token that is itself the last allowed token
    reports "stop" instead. Two requests of three output tokens decode side by side; the second
    samples its stop token as its third token."""
    s = scheduler()
    long = s.admit([1] * 8, max_output=3)
    stop = s.admit([2] * 8, max_output=3, stop_token_ids=[9])
    t, fence, ends = 0.0, 0, {}
    while s.requests and fence < 10:
        fence += 1
        s.advance_to(int(t * MS))
        plan = s.plan()
        s.commit(plan, fence)
        recs = records(plan)
        for i, lane in enumerate(plan.lanes):
            if lane.handle == stop and lane.role is LaneRole.DECODE and len(s.output(stop)) == 2:
                recs[i] = CompletionRecord(lane.handle, lane.epoch, tokens=(9,), offered=recs[i].offered)
        t += plan.expected_duration_ms
        s.advance_to(int(t * MS))
        for g in s.complete(fence, recs, timing(plan.expected_duration_ms)):
            assert g.finished == (g.finish_reason is not None)
            if g.finished:
                ends[g.handle] = (len(g.tokens), g.finish_reason)
    assert not s.requests
    assert ends == {long: (1, "length"), stop: (1, "stop")}


@spec("confidence-acceptance/rejection-zero", "confidence-acceptance/accepted-positive")
def test_a_rejection_observes_zero_at_every_longer_offered_prefix():
    """A round that offers three proposals and accepts the first: depth 1 is a positive
    observation, and the rejection at depth 2 is a zero observation for depths 2 and 3 alike
    (a longer prefix cannot survive a rejected one). The request goes on decoding, so nothing
    is censored; depths beyond the three offered are not observed."""
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=100)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    plan = s.plan()
    lane = plan.lanes[0]
    assert plan.kind is GraphKind.SPECULATIVE and lane.query_length == 4
    s.commit(plan, 2)
    req = s.requests[h.rid]
    before = req.acceptance.get(req.proposal_source).mean.copy()
    s.advance_to(int((t + plan.expected_duration_ms) * MS))
    gen = s.complete(
        2,
        [CompletionRecord(h, lane.epoch, tokens=(5, 5), offered=3, accepted=1)],
        timing(plan.expected_duration_ms),
    )
    assert gen[0].tokens == (5, 5) and not gen[0].finished
    after = req.acceptance.get(req.proposal_source).mean
    assert after[0] > before[0] and after[1] < before[1] and after[2] < before[2]
    np.testing.assert_array_equal(after[3:], before[3:])


def test_completing_with_nothing_in_flight_is_refused():
    """complete() for a fence when no frame is in flight is a ValueError that names the oldest
    frame in flight (None), like a completion out of fence order, not an IndexError."""
    s = scheduler()
    s.admit([1] * 8, max_output=4)
    with pytest.raises(ValueError, match="oldest frame in flight is None"):
        s.complete(1, [], timing(1.0))
    plan, _, t = run_once(s, 1, 0.0)
    with pytest.raises(ValueError, match="oldest frame in flight is None"):
        s.complete(1, records(plan), timing(1.0))  # the same fence again


@spec(
    "timing-refresh/full-credit-displace",
    "timing-refresh/attempt-on-commit",
    "useful-service/refresh-separate",
    "planning-queue/gate-discovery-probe",
    "duration-estimates/stale-needs-empty",
)
def test_full_refresh_credit_displaces_the_winner_with_the_oldest_stale_alternative():
    s, t = two_decoders()
    later = 31_000.0  # every estimate is stale now
    s.advance_to(int(later * MS))
    winner = s.plan()
    assert winner.reason is ExecutionClass.ORDINARY and winner.needs_empty_window  # stale: empty window
    s.costs.observe(
        winner.graph.key, [winner.expected_duration_ms * MS], int(later * MS)
    )  # refreshed for free
    older = next(
        g
        for g in ORDINARY.graphs
        if g.kind is GraphKind.MIXED and g.batch_capacity == 2 and g.prefill_capacity == 64
    )
    s.costs.note_attempt(older.key, 5)  # attempted once, long ago
    s.timing_ledger.earn(2495.0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.TIMING_REFRESH and plan.needs_empty_window
    assert plan.graph != winner.graph and s.costs.is_stale(plan.graph.key, s.now_ns)
    assert plan.exploration_credit_ms == pytest.approx(5.0)
    s.commit(plan, 3)
    assert s.costs.last_attempt_ns(plan.graph.key) == int(later * MS)  # attempts advance on commit
    s.advance_to(int((later + 4) * MS))
    s.complete(3, records(plan), timing(4.0))
    assert s.timing_ledger.balance_ms == pytest.approx(1.0) and not s.timing_ledger.can_start()
    assert s.executions["timing_refresh"] == 1


@spec(
    "acceptance-learning/probe-deeper",
    "acceptance-learning/probe-can-beat",
    "acceptance-learning/rank-gain-rate",
    "acceptance-learning/pays-interval",
    "acceptance-learning/ledgers-disjoint",
    "acceptance-learning/fixed-no-probe",
)
@pytest.mark.parametrize("mode", [DecodeMode.ADAPTIVE, DecodeMode.FIXED])
def test_acceptance_probe_offers_a_deeper_prefix(mode):
    s = Scheduler(SPEC, mode=mode, fixed_width=8 if mode is DecodeMode.FIXED else None)
    s.seed_costs(0)
    from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate

    low = {SOURCE_LEARNED: PrefixEstimate(np.full(7, 0.05), np.full(7, 2.0), 0)}  # pessimistic, uninformed
    s.admit([1] * 8, max_output=500, acceptance_history=low)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    ordinary = s.plan()
    s.acceptance_ledger.earn(495.0)
    plan = s.plan()
    if mode is DecodeMode.FIXED:
        assert plan.reason is ExecutionClass.ORDINARY
        return
    assert ordinary.reason is ExecutionClass.ORDINARY and ordinary.lanes[0].query_length == 1
    assert plan.reason is ExecutionClass.ACCEPTANCE_LEARNING and plan.needs_empty_window
    assert plan.lanes[0].query_length > 1  # at least one depth beyond the ordinary choice
    s.commit(plan, 2)
    s.advance_to(int((t + 6) * MS))
    timing_before = s.timing_ledger.balance_ms
    s.complete(2, records(plan, accepted=0), timing(6.0))
    assert s.acceptance_ledger.balance_ms == pytest.approx(-1.0)  # pays its whole interval once
    assert s.timing_ledger.balance_ms == timing_before  # the other ledger is neither charged nor credited


@spec("planning-queue/overrun-suspends", "planning-queue/overrun-eligible")
def test_an_overrun_suspends_queueing_without_ineligibility():
    s, t, plan = decode_frame_in_flight()
    s.advance_to(int((t + plan.expected_duration_ms * 3) * MS))  # it runs long
    assert s.plan() is None  # no appending behind an overrun frame
    # The device interval was ordinary (the host observed completion late): nothing to learn.
    s.complete(2, records(plan), timing(plan.expected_duration_ms, wall_ms=plan.expected_duration_ms * 3))
    assert s.plan().graph == plan.graph  # the same program stays eligible


@spec("planning-queue/overrun-suspends", "planning-queue/appended-start")
def test_a_completion_lifts_its_overrun_and_dates_the_queued_frame():
    """Frame 2 overruns with frame 3 queued behind it. Frame 3 started when frame 2 ended, at the
    latest when that completion was observed, so from then on it expects to end one estimate
    later: queueing resumes, and frame 3's own overrun past that suspends it again (RESOLUTIONS
    38). Dated from frame 2's expected end instead, frame 3 would inherit frame 2's overrun."""
    s, t, first = decode_frame_in_flight()
    second = s.plan()
    assert second.kind is GraphKind.DECODE and not second.needs_empty_window
    s.commit(second, 3)
    late = t + 3 * (first.expected_duration_ms + second.expected_duration_ms)  # past both expected ends
    s.advance_to(int(late * MS))
    s.complete(2, records(first), timing(first.expected_duration_ms, wall_ms=late - t))
    assert s.frames[0].expected_end_ns == int(late * MS) + int(second.expected_duration_ms * MS)
    queued = s.plan()
    assert queued is not None and not queued.needs_empty_window
    assert queued.planning_start_ns == s.frames[0].expected_end_ns  # behind frame 3, re-dated
    s.advance_to(s.frames[0].expected_end_ns + 1)  # frame 3 now overruns its own estimate
    assert s.plan() is None


@spec("planning-queue/appended-start")
def test_reanchor_dates_each_queued_frame_one_estimate_after_the_one_before():
    """The queue re-dated from an observed completion at 10 ms: 2 ms and 3 ms frames end at 12
    and 15 ms; an indeterminate frame and what follows it keep their dates (none can be given)."""
    frames = [
        SimpleNamespace(plan=SimpleNamespace(expected_duration_ms=ms), expected_end_ns=-1)
        for ms in (2.0, 3.0, None, 1.0)
    ]
    reanchor(frames, 10 * MS)
    assert [f.expected_end_ns for f in frames] == [12 * MS, 15 * MS, -1, -1]


@spec("duration-estimates/commit-freshness")
@pytest.mark.parametrize("commit_ms, fresh", [(5.9, True), (6.5, False)])
def test_a_saved_plan_rechecks_freshness_at_commit(commit_ms, fresh):
    """Estimates stay fresh for 6 ms here. Decode B=1 was measured at t = 0; the prefill ends at
    4.854 ms, when a first decode frame is committed (expected end 8.385 ms) and a second one
    planned behind it, fresh then, so it may be queued. Committing that saved plan at 5.9 ms
    queues it; at 6.5 ms (before the first frame's expected end, so no overrun) its estimate has
    gone stale and commit refuses it: a stale program needs an empty window."""
    s, t, _ = decode_frame_in_flight(policy_config=PolicyConfig(estimate_ttl_ns=6 * MS))
    assert t == pytest.approx(4.854)
    saved = s.plan()
    assert saved.kind is GraphKind.DECODE and not saved.needs_empty_window
    s.advance_to(int(commit_ms * MS))
    if fresh:
        s.commit(saved, 3)
        assert s.in_flight == (2, 3)
    else:
        with pytest.raises(PlanRejected, match="needs an empty window"):
            s.commit(saved, 3)
        assert s.in_flight == (2,)


@spec("acceptance-learning/execution-metrics", "confidence-acceptance/spec-counters")
def test_metrics_exposition():
    s = scheduler(SPEC)
    s.admit([1] * 8, max_output=20)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t, accepted=2)
    text = render_scheduler_stats(s.stats())
    for c in ("ordinary", "discovery", "timing_refresh", "acceptance_learning"):
        assert f'helios_scheduler_executions_total{{class="{c}"}}' in text
        assert f'helios_scheduler_execution_nanoseconds_total{{class="{c}"}}' in text
    assert 'helios_scheduler_executions_total{class="ordinary"} 3' in text
    assert "helios_speculative_programs_total 2" in text
    assert 'helios_speculative_accepted_by_position_total{position="1"} 2' in text


@spec("confidence-acceptance/optimistic-estimate")
def test_the_optimistic_estimate_is_on_the_same_pooled_mean_as_the_survival():
    """A decoding view's optimistic estimate, min(1, mean + sqrt(ln 20 / (2 * aged weight))), is
    taken on the same hierarchical mean as its survival: where a request's own evidence is thin,
    both read the pooled observations of every request. After a first request's rounds rejected
    every proposal (the pool's deeper means fall), a fresh request's survival follows the pool,
    and its optimistic estimate is that survival plus the bonus of its aged weight."""
    s = scheduler(SPEC)
    first = s.admit([1] * 8, max_output=200)
    t = 0.0
    for fence in range(1, 8):
        _, _, t = run_once(s, fence, t, accepted=0)
    s.cancel(first)
    h = s.admit([2] * 8, max_output=200)
    _, _, t = run_once(s, 8, t)
    s.advance_to(int(t * MS))
    view = next(v for v in s.views() if v.rid == h.rid)
    req = s.requests[h.rid]
    est = req.acceptance.get(req.proposal_source)
    own = est.means()  # the request's own estimate, without the pool
    assert view.survival[1] < own[1] - 0.01  # the pool's rejections pull the fresh request down
    bonus = np.sqrt(math.log(20) / (2 * est.aged_weight(len(req.output))))
    np.testing.assert_allclose(view.optimistic, np.minimum(1.0, view.survival + bonus))


@spec("confidence-acceptance/spec-counters", "speculative-coverage/copy-no-draws")
def test_learned_proposals_count_their_drafts_as_learned_draws():
    """Every draft a learned proposal offers is a learned-proposal draw (the sampling metric
    helios_speculative_learned_draws_total); copy proposals offer drafts but draw nothing."""
    counts = {}
    for source in (SOURCE_LEARNED, SOURCE_COPY):
        s = scheduler(SPEC)
        s.admit([1] * 8, max_output=20, proposal_source=source)
        t = 0.0
        for fence in range(1, 4):
            _, _, t = run_once(s, fence, t, accepted=2)
        text = render_scheduler_stats(s.stats())
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        counts[source] = (
            int(lines["helios_speculative_drafts_offered_total"]),
            int(lines["helios_speculative_learned_draws_total"]),
        )
    offered = counts[SOURCE_LEARNED][0]
    assert offered > 0 and counts == {SOURCE_LEARNED: (offered, offered), SOURCE_COPY: (offered, 0)}


def test_metrics_text_is_well_formed_exposition():
    """Every series is announced by one `# TYPE name counter|gauge` line before its samples, in
    Prometheus's lower-case spelling; counters end in _total, the credit balances are gauges."""
    import re

    s = scheduler(SPEC)
    s.admit([1] * 8, max_output=20)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t, accepted=2)
    typed, sampled = {}, []
    for line in render_scheduler_stats(s.stats()).splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("#"):
            m = re.fullmatch(r"# TYPE ([a-z_][a-z0-9_]*) (counter|gauge)", line)
            assert m, line
            assert m.group(1) not in typed
            typed[m.group(1)] = m.group(2)
            continue
        m = re.fullmatch(r'([a-z_][a-z0-9_]*)(\{[a-z_]+="[^"]*"\})? (-?[0-9.e+]+)', line)
        assert m, line
        assert m.group(1) in typed, f"{m.group(1)} sampled before its TYPE line"
        sampled.append(m.group(1))
    assert set(sampled) <= set(typed)
    for name, kind in typed.items():
        assert kind == ("counter" if name.endswith("_total") else "gauge"), name
    assert {n for n, k in typed.items() if k == "gauge"} == {
        "helios_scheduler_refresh_credit_ms",
        "helios_scheduler_learning_credit_ms",
    }


@spec(
    "confidence-acceptance/prior-update",
    "confidence-acceptance/half-life",
    "confidence-acceptance/initial-weight",
)
def test_completed_rounds_move_the_population_priors_a_sixty_fourth():
    """ragged-small's device program (B=4, W=4, D=3, P=8): four decoders, ceilings 4, each lane
    offered 2 proposals and accepted 1, sidecar joint probabilities [0.9, 0.5, 0.2].

    Each lane moves the learned-acceptance prior 1/64 toward its observation [1, 0, -] and the
    forecast prior 1/64 toward [0.9, 0.5, 0.2]; four lanes: m = x - (x - 0.5**d) * (63/64)**4.
    A request admitted afterwards starts from those priors with weight 2. The observing lanes
    had generated 3 tokens (1 from the prefill, 2 now): their own weight 2 aged to
    w = 2 * 0.5**(3/128) before the observation, so depth 1 holds (w*0.5 + 1)/(w + 1).
    """
    s = scheduler(_device_only())
    first = [s.admit([1] * 8, max_output=100) for _ in range(4)]
    t = 0.0
    for fence in range(1, 5):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.allocation.value == "prefix_limit" and len(plan.lanes) == 4
    s.commit(plan, 5)
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5, 5), offered=2, accepted=1) for lane in plan.lanes
    ]
    sidecar = np.zeros((2, RAGGED.request_slots, 3), np.float32)
    sidecar[1, :, :] = [0.9, 0.5, 0.2]
    s.complete_packed_round(5, recs, timing(4.7), sidecar)
    keep = (63 / 64) ** 4
    late = s.requests[s.admit([1] * 8, max_output=100).rid]
    learned = late.acceptance.get(late.proposal_source)
    np.testing.assert_allclose(learned.mean, [1 - 0.5 * keep, 0.25 * keep, 0.125])
    np.testing.assert_allclose(learned.weight, [2, 2, 2])
    x = np.array([0.9, 0.5, 0.2], np.float32).astype(float)
    np.testing.assert_allclose(late.forecast.mean, x - (x - [0.5, 0.25, 0.125]) * keep)
    w = 2 * 0.5 ** (3 / 128)
    observed = s.requests[first[0].rid].acceptance.get(late.proposal_source)
    np.testing.assert_allclose(observed.mean, [(w * 0.5 + 1) / (w + 1), w * 0.25 / (w + 1), 0.125])
    np.testing.assert_allclose(observed.weight, [w + 1, w + 1, w])


def _stale_pair(catalog=ORDINARY, history=None, requests=2):
    """Decoding requests 31 s after every estimate was last observed, the ordinary winner
    re-measured (fresh) so only the alternatives are stale; returns (scheduler, winner, now_ms)."""
    s = scheduler(catalog)
    for _ in range(requests):
        s.admit([1] * 8, max_output=1000, acceptance_history=history)
    t = 0.0
    for fence in range(1, requests + 1):
        _, _, t = run_once(s, fence, t)
    later = 31_000.0
    s.advance_to(int(later * MS))
    winner = s.plan()
    s.costs.observe(winner.graph.key, [winner.expected_duration_ms * MS], int(later * MS))
    return s, winner, later


@spec("timing-refresh/alternative-order")
@pytest.mark.parametrize(
    "attempts, chosen",
    [
        # decode B=1 (value rate 43.5) was last observed at 0, mixed B=2 C=64 (62.9) at 9.739 ms: oldest first
        ({}, "decode[B=1,W=1,D=0,C=0,P=1]"),
        # an attempt at 20 ms makes decode B=1 the younger one: the later of observation and attempt counts
        ({"decode[B=1,W=1,D=0,C=0,P=1]": 20.0}, "mixed[B=2,W=1,D=0,C=64,P=65]"),
        # equally old (both attempted at 20 ms): the higher ordinary value rate goes first
        (
            {"decode[B=1,W=1,D=0,C=0,P=1]": 20.0, "mixed[B=2,W=1,D=0,C=64,P=65]": 20.0},
            "mixed[B=2,W=1,D=0,C=64,P=65]",
        ),
        ({"mixed[B=2,W=1,D=0,C=64,P=65]": 20.0}, "decode[B=1,W=1,D=0,C=0,P=1]"),
    ],
)
def test_refresh_takes_the_oldest_stale_alternative_then_the_most_valuable(attempts, chosen):
    """Two decoders 31 s on: the winner decode B=2 is re-measured, the stale alternatives are
    decode B=1 and the decode-only mixed B=2 C=64 (the second prefill ran on it at 9.739 ms)."""
    s, winner, _ = _stale_pair()
    assert winner.graph.name == "decode[B=2,W=1,D=0,C=0,P=2]"
    by_name = {g.name: g for g in ORDINARY.graphs}
    assert s.costs.last_valid_ns(by_name["mixed[B=2,W=1,D=0,C=64,P=65]"].key) == int(9.739 * MS)
    for name, at_ms in attempts.items():
        s.costs.note_attempt(by_name[name].key, int(at_ms * MS))
    s.timing_ledger.earn(2495.0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.TIMING_REFRESH and plan.graph.name == chosen


@spec("timing-refresh/winners-free")
def test_a_stale_ordinary_winner_refreshes_its_cost_without_spending_credit():
    """Everything but the winner re-measured: with full refresh credit the stale winner still runs
    as ordinary work (after the queue drains), its first valid sample replaces the estimate, and
    the ledger keeps its 5 ms."""
    s, t = two_decoders()
    later = 31_000.0
    s.advance_to(int(later * MS))
    winner = s.plan()
    for g in ORDINARY.graphs:
        if g != winner.graph:
            s.costs.observe(g.key, [g.duration_ms * MS], int(later * MS))
    s.timing_ledger.earn(2495.0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.ORDINARY and plan.graph == winner.graph and plan.needs_empty_window
    assert s.costs.is_stale(plan.graph.key, s.now_ns) and plan.exploration_credit_ms == 0
    s.commit(plan, 3)
    s.advance_to(int((later + 4) * MS))
    s.complete(3, records(plan), timing(4.0))
    assert s.costs.estimate_ms(plan.graph.key) == pytest.approx(4.0) and s.costs.is_fresh(
        plan.graph.key, s.now_ns
    )
    assert s.timing_ledger.balance_ms == pytest.approx(5.0) and not s.timing_ledger.episode_active
    assert s.executions["timing_refresh"] == 0 and s.executions["ordinary"] == 3


@spec("timing-refresh/speculative-pays-once", "timing-refresh/speculative-one-program")
def test_a_speculative_refresh_pays_its_whole_interval_once():
    """A refresh of a two-lane speculative program, isolated, device intervals 6 and 5 ms on two
    ranks and 7 ms of wall time: the episode pays max(6, 7) = 7 ms once (5 - 7 = -2 ms of credit),
    the acceptance ledger is untouched, and the cost sample is the device's 6 ms."""
    s, winner, later = _stale_pair(SPEC)
    s.timing_ledger.earn(2495.0)
    learning = s.acceptance_ledger.balance_ms
    plan = s.plan()
    assert plan.reason is ExecutionClass.TIMING_REFRESH and plan.kind is GraphKind.SPECULATIVE
    assert plan.graph.proposal_depth > 0 and len(plan.lanes) == 2
    s.commit(plan, 3)
    s.advance_to(int((later + 7) * MS))
    s.complete(3, records(plan, accepted=1), ExecutionTiming((6.0 * MS, 5.0 * MS), 7.0 * MS))
    assert s.timing_ledger.balance_ms == pytest.approx(-2.0)
    assert s.execution_ns["timing_refresh"] == 7 * MS and s.executions["timing_refresh"] == 1
    assert s.acceptance_ledger.balance_ms == learning
    assert s.costs.estimate_ms(plan.graph.key) == pytest.approx(6.0)


@spec("acceptance-learning/timing-precedence")
def test_timing_refresh_takes_precedence_over_an_acceptance_probe():
    """Both ledgers full, stale alternatives (every program but the single-row speculative ones)
    and a probe available (a pessimistic, uninformed acceptance history): the refresh is chosen.
    With the timing credit gone, the same state (plan() is pure) offers the probe."""
    from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate

    low = {SOURCE_LEARNED: PrefixEstimate(np.full(7, 0.05), np.full(7, 2.0), 0)}
    s, winner, later = _stale_pair(SPEC, history=low, requests=1)
    assert winner.reason is ExecutionClass.ORDINARY and winner.lanes[0].query_length == 1
    _, _, later = run_once(s, 2, later)  # an ordinary round: the stream's output is recent again
    for g in SPEC.graphs:  # the single-row programs a probe would use are fresh; the rest stay stale
        if g.kind is GraphKind.SPECULATIVE and g.batch_capacity == 1:
            s.costs.observe(g.key, [g.duration_ms * MS], int(later * MS))
    s.timing_ledger.earn(2495.0)
    s.acceptance_ledger.earn(495.0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.TIMING_REFRESH and plan.exploration_credit_ms == pytest.approx(5.0)
    s.timing_ledger.idle()  # no refresh credit: the probe is next in line
    probe = s.plan()
    assert probe.reason is ExecutionClass.ACCEPTANCE_LEARNING and any(
        lane.query_length > 1 for lane in probe.lanes
    )
    s.commit(probe, 3)
    assert s.acceptance_ledger.episode_active and not s.timing_ledger.episode_active


@spec("timing-refresh/discovery-no-credit", "acceptance-learning/discovery-separate")
def test_discovery_earns_no_credit_and_is_accounted_on_its_own():
    """A cold catalog: the first prefill is discovery. Its 5 ms earn neither ledger anything and
    are counted as discovery; with a full acceptance ledger it neither pays from it nor gives
    way to a probe. The first ordinary round then earns its share."""
    s = Scheduler(SPEC)
    s.admit([1] * 8, max_output=100)
    s.advance_to(0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.DISCOVERY
    s.commit(plan, 1)
    s.advance_to(5 * MS)
    s.complete(1, records(plan), timing(5.0))
    assert (s.timing_ledger.balance_ms, s.acceptance_ledger.balance_ms) == (0.0, 0.0)
    assert (s.timing_ledger.earned_from_ms, s.acceptance_ledger.earned_from_ms) == (0.0, 0.0)
    assert s.executions["discovery"] == 1 and s.execution_ns["discovery"] == 5 * MS
    assert s.executions["ordinary"] == 0 and s.executions["acceptance_learning"] == 0
    s.acceptance_ledger.earn(495.0)
    second = s.plan()  # the decode programs are unknown too: discovery again
    assert second.reason is ExecutionClass.DISCOVERY
    s.commit(second, 2)
    s.advance_to(9 * MS)
    s.complete(2, records(second), timing(4.0))
    assert s.acceptance_ledger.balance_ms == pytest.approx(5.0) and not s.acceptance_ledger.episode_active
    assert s.executions["acceptance_learning"] == 0 and s.execution_ns["discovery"] == 9 * MS
    s.acceptance_ledger.idle()
    s.seed_costs(9 * MS)
    ordinary = s.plan()
    assert ordinary.reason is ExecutionClass.ORDINARY
    s.commit(ordinary, 3)
    s.advance_to(13 * MS)
    s.complete(3, records(ordinary), timing(4.0))
    assert s.timing_ledger.balance_ms == pytest.approx(4.0 * 0.002 / 0.998)
    assert s.acceptance_ledger.balance_ms == pytest.approx(4.0 * 0.01 / 0.99)


@spec(
    "mixed-execution/same-contracts", "mixed-execution/prompt-row-commit", "mixed-execution/spec-row-commit"
)
def test_mixed_rows_follow_the_contracts_of_separate_graphs():
    """Speculative mixed B=2 W=4 C=512 with checkpoints: a decoder (preseeded acceptance 0.9,
    weight 64) and a 300-token prompt whose anchor is its end.

    One mixed frame: the prompt row commits all 300 tokens and one output token, then snapshots
    its anchor first (a prompt checkpoint, as after a separate prefill); the decode row offers 3
    proposals and accepts 2, observed at its 4 generated tokens like any round: weight
    w = 64 * 0.5**(4/128), depths 1-2 move (1 - 0.9)/(w + 1), depth 3 (0 - 0.9)/(w + 1).
    Publication: the decoder's delivery rate takes one delivery over the 16 ms interval, the
    new decoder's starts at one delivery per frame. A prompt row cancelled in flight keeps its
    pages until its fence completes, publishes nothing, and its slot's next owner is a new
    generation charged nothing.
    """
    from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate

    names = {
        "prefill[B=1,W=64,D=0,C=0,P=0]",
        "speculative[B=1,W=1,D=0,C=0,P=1]",
        "speculative[B=2,W=1,D=0,C=0,P=2]",
        "mixed[B=2,W=4,D=3,C=512,P=516]",
        "snapshot[B=1,W=0,D=0,C=0,P=0]",
        "restore[B=1,W=0,D=0,C=0,P=0]",
    }
    s = scheduler(
        dataclasses.replace(SPEC, graphs=tuple(g for g in SPEC.graphs if g.name in names)), checkpoints=True
    )
    a = s.admit(
        [1] * 8,
        max_output=500,
        acceptance_history={SOURCE_LEARNED: PrefixEstimate(np.full(7, 0.9), np.full(7, 64.0), 0)},
    )
    t, fence = 0.0, 0
    while s.requests[a.rid].phase is not Phase.DECODE:  # its prefill, then its anchor snapshot
        fence += 1
        _, _, t = run_once(s, fence, t)
    b = s.admit(list(range(2, 302)), max_output=50, message_endpoints=[300])
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.name == "mixed[B=2,W=4,D=3,C=512,P=516]" and plan.prefill_row == 0
    assert [(lane.handle, lane.prompt_tokens, lane.query_length) for lane in plan.lanes] == [
        (b, 300, 0),
        (a, 0, 4),
    ]
    fence += 1
    s.commit(plan, fence)
    ra, rb = s.requests[a.rid], s.requests[b.rid]
    z_before = ra.history.log_z
    s.advance_to(int((t + 16) * MS))
    recs = [
        CompletionRecord(b, plan.lanes[0].epoch, prompt_tokens=300, tokens=(7,)),
        CompletionRecord(a, plan.lanes[1].epoch, tokens=(5, 5, 5), offered=3, accepted=2),
    ]
    gen = s.complete(fence, recs, timing(16.0))
    assert rb.consumed == 300 and rb.output == [7]
    assert rb.phase is Phase.BLOCKED and rb.prerequisites == [GraphKind.SNAPSHOT]
    assert rb.capture.row is not None
    w = 64 * 0.5 ** (4 / 128)
    est = ra.acceptance.get(SOURCE_LEARNED)
    np.testing.assert_allclose(
        est.mean[:4], [0.9 + 0.1 / (w + 1), 0.9 + 0.1 / (w + 1), 0.9 - 0.9 / (w + 1), 0.9]
    )
    assert {g.handle: g.tokens for g in gen} == {b: (7,), a: (5, 5, 5)}
    for g in gen:
        s.published_output(g.handle, fence)
    assert math.exp(ra.history.log_z) == pytest.approx(
        math.exp(-0.16) * math.exp(z_before) + (1 - math.exp(-0.16)) / 16.0
    )
    assert rb.history.log_z == pytest.approx(-math.log(16.0))
    t += 16
    # A prompt row cancelled in flight.
    while rb.phase is not Phase.DECODE:  # b's anchor snapshot
        fence += 1
        _, _, t = run_once(s, fence, t)
    c = s.admit(list(range(2, 202)), max_output=50)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.kind is GraphKind.MIXED and plan.lanes[plan.prefill_row].handle == c
    fence += 1
    s.commit(plan, fence)
    slot, pages = s.requests[c.rid].slot, list(s.requests[c.rid].pages)
    s.cancel(c)
    assert all(s.pages.owned()[p] == c.rid for p in pages)  # owned through the fence
    gen = s.complete(fence, records(plan, accepted=1), timing(plan.expected_duration_ms))
    assert c not in {g.handle for g in gen} and c.rid not in s.requests
    assert not set(pages) & set(s.pages.owned())
    d = s.admit([1] * 8, max_output=5)
    assert s.requests[d.rid].slot == slot and d.generation == c.generation + 1
    assert s.requests[d.rid].history.log_x is None
