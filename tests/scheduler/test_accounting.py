"""Queue projection, service accounting, duration samples and exploration credit, rule by rule."""

import dataclasses
import math

import numpy as np
import pytest

from helios_jax.catalog import Allocation, CostKey, DecodeMode, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.core import NS_PER_MS, PlanRejected, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass, ExecutionTiming
from helios_jax.scheduler.speculation import SOURCE_LEARNED
from helios_jax.scheduler.view import Phase

from .helpers import ORDINARY, RAGGED, SPEC, decoder, inputs, prompt
from .test_core import records, run_once, scheduler, timing

spec = pytest.mark.spec
MS = NS_PER_MS


def decoding(catalog=ORDINARY, n=2, **kw):
    """A scheduler with n requests past their prefill, and the current time (ms)."""
    s = scheduler(catalog, **kw)
    handles = [s.admit([1] * 8, max_output=500) for _ in range(n)]
    t = 0.0
    for fence in range(1, n + 1):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    return s, handles, t, n + 1


@spec(
    "planning-queue/project-queue-end",
    "planning-queue/freeze-queued-service",
    "planning-queue/project-copies",
    "planning-queue/projected-age",
    "planning-queue/projection-pure",
    "planning-queue/history-validated-only",
    "planning-queue/appended-start",
)
def test_selection_projects_queued_service_to_the_queue_end():
    s, handles, t, fence = decoding()
    before = {h.rid: s.requests[h.rid].history.log_x for h in handles}
    plan = s.plan()
    s.commit(plan, fence)
    end = int(t * MS) + int(plan.expected_duration_ms * MS)
    first, again = s.views(), s.views()
    assert [(v.rid, v.log_output_price, v.age_ms) for v in first] == [
        (v.rid, v.log_output_price, v.age_ms) for v in again
    ]  # recomputed from copies, never stored
    views = {v.rid: v for v in first}
    a = math.exp(-plan.expected_duration_ms / 100)
    for lane in plan.lanes:
        req = s.requests[lane.handle.rid]
        assert req.history.log_x == before[lane.handle.rid]  # only validated completions change history
        # the frozen expected service (its expected tokens over the expected duration) is
        # projected into a copy of the price: x' = a*x + (1 - a)*E/T
        x = a * math.exp(req.history.log_x) + (1 - a) * lane.expected_tokens / plan.expected_duration_ms
        assert math.exp(views[lane.handle.rid].log_output_price) == pytest.approx(64 + 16 / x)
        assert views[lane.handle.rid].age_ms == pytest.approx(0.0)  # measured from the queued delivery
    assert s.plan().planning_start_ns == end


@spec(
    "service-accounting/commit-records",
    "service-accounting/late-admit-excluded",
    "service-accounting/restoring-excluded",
)
def test_participants_are_the_residents_at_commit():
    s, handles, t, fence = decoding()
    plan = s.plan()
    s.commit(plan, fence)
    late = s.admit([1] * 8, max_output=5)
    frame = s.frames[-1]
    assert set(frame.participants) == set(handles) and late not in frame.participants
    assert frame.normalizers.generation  # the measured generation programs, frozen
    s.advance_to(int((t + 4) * MS))
    s.complete(fence, records(plan), timing(3.6))
    assert s.requests[late.rid].history.log_x is None  # not charged for the interval
    blocked = Scheduler(ORDINARY, initialize_requests=True)
    blocked.seed_costs(0)
    for _ in range(2):
        blocked.admit([1] * 8, max_output=5)
    p = blocked.plan()
    blocked.commit(p, 1)
    assert p.kind is GraphKind.INITIALIZE
    assert all(r.phase is Phase.BLOCKED for r in blocked.requests.values())
    assert blocked.frames[-1].participants == ()  # requests waiting for their state are outside


@spec(
    "service-accounting/plans-survive",
    "service-accounting/physical-units",
    "service-accounting/prices-preserved",
)
def test_rates_are_physical_and_only_service_changes_them():
    s, handles, t, fence = decoding(n=1)
    plan = s.plan()
    req = s.requests[handles[0].rid]
    x0 = req.history.log_x
    s.commit(plan, fence)
    s.advance_to(int((t + 3.531) * MS))
    s.complete(fence, records(plan), timing(3.531))
    # One token over 3.531 ms: x = a*x0 + (1 - a)/3.531 tokens per ms, a = exp(-3.531/100).
    a = math.exp(-3.531 / 100)
    assert math.exp(req.history.log_x) == pytest.approx(a * math.exp(x0) + (1 - a) / 3.531)
    stored = (req.history.log_x, req.history.log_z)
    s.costs.observe(next(g.key for g in ORDINARY.graphs if g.kind is GraphKind.PREFILL), [50e6], s.now_ns)
    req.acceptance.get(SOURCE_LEARNED).observe([1.0], 3)  # acceptance and normalisers move...
    assert (req.history.log_x, req.history.log_z) == stored  # ...the stored prices do not
    # A plan made before that accounting change still commits.
    saved = s.plan()
    s.costs.observe(saved.graph.key, [saved.expected_duration_ms * MS], s.now_ns)
    s.commit(saved, fence + 1)


@spec(
    "duration-estimates/isolated-and-queued",
    "duration-estimates/no-host-time",
    "duration-estimates/service-raw",
    "confidence-acceptance/no-host-delay",
    "timing-refresh/queued-credit",
    "timing-refresh/isolated-credit",
    "acceptance-learning/budgets-raw",
)
def test_samples_credit_and_service_use_the_right_intervals():
    s, handles, t, fence = decoding(SPEC)
    first = s.plan()
    s.commit(first, fence)
    second = s.plan()
    s.commit(second, fence + 1)
    key = first.graph.key
    s.advance_to(int((t + 10) * MS))
    credit = s.timing_ledger.balance_ms
    s.complete(
        fence,
        records(first, accepted=1),
        ExecutionTiming((4.0 * MS,), 9.0 * MS, queued=False, readiness_delay_ns=1.0 * MS),
    )
    # isolated: credit and service use max(device, wall) = 9 ms; the cost sample is 4 - 1 = 3 ms
    assert s.timing_ledger.balance_ms - credit == pytest.approx(9.0 * 0.002 / 0.998)
    assert s.costs.samples(key)[-1] == pytest.approx(3.0 * MS)
    credit = s.timing_ledger.balance_ms
    s.complete(fence + 1, records(second, accepted=1), ExecutionTiming((5.0 * MS,), 30.0 * MS, queued=True))
    # queued: the device interval alone (queue wait and host time stay out), for cost and credit
    assert s.timing_ledger.balance_ms - credit == pytest.approx(5.0 * 0.002 / 0.998)
    assert s.costs.samples(second.graph.key)[-1] == pytest.approx(5.0 * MS)
    assert second.graph.key.batch_capacity == second.graph.batch_capacity  # its actual B/D/W/P


@spec("duration-estimates/speculative-bdwp", "duration-estimates/rows-not-key")
def test_a_speculative_round_is_costed_under_its_actual_b_d_w_p():
    """ragged-small's device program (B=4, W=4, D=3, P=8) serves three decoders; its host sibling
    (B=4, W=4, D=3, P=6) differs only in P. The 4.2 ms sample joins the P=8 entry (seeded at
    4.7 ms: median of the two 4.45), three active rows or not, and nothing else moves."""
    catalog = dataclasses.replace(
        RAGGED,
        graphs=tuple(
            g
            for g in RAGGED.graphs
            if g.kind is GraphKind.PREFILL
            or g.target_capacity in (6, 8)
            and g.kind is GraphKind.SPECULATIVE
            and g.token_capacity == 4
            and g.batch_capacity == 4
        ),
    )
    s = scheduler(catalog)
    for _ in range(3):
        s.admit([1] * 8, max_output=100)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.allocation is Allocation.PREFIX_LIMIT and len(plan.lanes) == 3
    s.commit(plan, 4)
    recs = [
        CompletionRecord(lane.handle, lane.epoch, tokens=(5, 5), offered=1, accepted=1) for lane in plan.lanes
    ]
    sidecar = np.full((2, RAGGED.request_slots, 3), 0.5, np.float32)
    s.complete_packed_round(4, recs, timing(4.2), sidecar)
    device = CostKey(GraphKind.SPECULATIVE, 4, 4, 3, 0, 8)
    host = CostKey(GraphKind.SPECULATIVE, 4, 4, 3, 0, 6)
    assert s.costs.samples(device) == pytest.approx((4.7 * MS, 4.2 * MS))
    assert s.costs.estimate_ms(device) == pytest.approx(4.45)
    assert s.costs.samples(host) == pytest.approx((4.5 * MS,))
    assert set(s.costs.keys()) == {g.key for g in catalog.graphs}
    rec = s.trace[-1]
    assert (rec.batch_capacity, rec.proposal_depth, rec.token_capacity, rec.target_capacity) == (4, 3, 4, 8)


@spec(
    "timing-refresh/invalid-not-fresh",
    "timing-refresh/invalid-wall-pays",
    "timing-refresh/speculative-one-program",
    "timing-refresh/cancel-no-timing",
)
def test_refresh_with_invalid_timing_or_a_cancelled_lane():
    s, handles, t, fence = decoding(SPEC)
    later = t + 31_000
    s.advance_to(int(later * MS))
    ordinary = s.plan()
    s.costs.observe(ordinary.graph.key, [ordinary.expected_duration_ms * MS], s.now_ns)
    s.timing_ledger.earn(2495.0)
    plan = s.plan()
    assert plan.reason is ExecutionClass.TIMING_REFRESH
    s.commit(plan, fence)  # one complete program, one commit
    for h in handles:
        if h in plan.handles:
            s.cancel(h)
    s.advance_to(int((later + 7) * MS))
    gen = s.complete(fence, records(plan), ExecutionTiming((0.0,), 7.0 * MS))
    assert gen == []  # cancellation suppresses publication
    assert s.costs.is_stale(plan.graph.key, s.now_ns)  # no timing was invented
    assert s.timing_ledger.balance_ms == pytest.approx(5.0 - 7.0)  # its wall time paid


@spec("planning-queue/survival-variants", "confidence-acceptance/survival-future-only")
def test_survival_rows_replace_binary_observations_for_the_future_only():
    s, handles, t, fence = decoding(SPEC, n=1)
    plan = s.plan()
    s.commit(plan, fence)
    rows = plan.lanes[0].query_length
    survival = np.zeros((SPEC.request_slots, 7))
    survival[plan.lanes[0].slot, : rows - 1] = 0.5
    req = s.requests[handles[0].rid]
    before = req.acceptance.get(SOURCE_LEARNED).mean.copy()
    s.complete_with_survival(fence, records(plan, accepted=rows - 1), timing(5.0), survival)
    after = req.acceptance.get(SOURCE_LEARNED).mean
    # all proposals were accepted (binary 1.0), but the survival rows (0.5) are what is observed
    assert after[0] < before[0] + (1 - before[0]) / 3 and after[0] == pytest.approx(
        before[0] + (0.5 - before[0]) / (1 + 2 * 0.5 ** (len(req.output) / 128)), rel=1e-6
    )
    assert plan.lanes[0].query_length == rows  # the completed plan itself is untouched


@spec(
    "planning-queue/feedback-triggers",
    "planning-queue/deps-actual-program",
    "planning-queue/no-displace-winner",
    "planning-queue/empty-window-wait",
)
def test_feedback_dependencies_apply_to_the_selected_program():
    s = scheduler(ORDINARY)
    stops = s.admit([1] * 8, max_output=500, host_stops=True)  # stop strings on the host
    plain = s.admit([1] * 8, max_output=500)
    t = 0.0
    for fence in (1, 2):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    first = s.plan()
    s.commit(first, 3)
    nxt = s.plan()
    # The best next frame serves both streams; one of them needs completion feedback first, so
    # the winner waits for an empty window instead of a lower-value frame without it.
    assert set(nxt.handles) == {stops, plain} and nxt.needs_empty_window
    with pytest.raises(PlanRejected):
        s.commit(nxt, 4)
    s.advance_to(int((t + 4) * MS))
    s.complete(3, records(first), timing(3.6))
    s.published_output(stops, 3)
    s.published_output(plain, 3)
    s.commit(s.plan(), 4)  # after feedback the same selection goes through


@spec("planning-queue/page-reservation", "speculative-coverage/reservation-ceilings")
def test_page_reservation_covers_the_execution_ceiling_and_draft_storage():
    s = Scheduler(SPEC, page_size=16)
    h = s.admit([1] * 100, max_output=50)
    # prompt 100 + output 50 + draft storage D = 7 -> 157 tokens -> 10 pages of 16
    assert len(s.page_table(h)) == 10 and s.draft_storage == 7


@spec("useful-service/burst-one-delivery")
def test_a_speculative_burst_is_one_delivery():
    s, handles, t, fence = decoding(SPEC, n=1)
    h = handles[0]
    plan = s.plan()
    s.commit(plan, fence)
    s.advance_to(int((t + 5) * MS))
    s.complete(fence, records(plan, accepted=plan.lanes[0].query_length - 1), timing(5.0))
    before = s._last_completed.delivery_before[h.rid]
    s.published_output(h, fence)
    a = math.exp(-5.0 / 100)
    assert math.exp(s.requests[h.rid].history.log_z) == pytest.approx(
        a * math.exp(before) + (1 - a) * 1 / 5.0
    )


@spec(
    "useful-service/conditional-acceptance",
    "confidence-acceptance/expected-output-bounds",
    "speculative-coverage/value-source-allocator",
    "speculative-coverage/host-inputs",
    "speculative-coverage/host-before-draws",
    "speculative-coverage/copy-d",
)
def test_lane_work_respects_request_limits_and_the_binding():
    limited = decoder(1, survival=np.full(7, 0.95), output_remaining=2)
    copy = decoder(2, survival=np.full(7, 0.95), copy_limit=1)
    cands = policy.candidates(inputs([limited, copy]))
    for c in cands:
        for lane in c.lanes:
            rows = max(lane.query_length, lane.ceiling)
            assert rows <= (2 if lane.rid == 1 else 2)  # output limit 2; copy prefix 1 + pending
            if c.graph.allocation is Allocation.PREFIX_LIMIT:
                assert lane.query_length == 0 and lane.ceiling >= 1  # the device allocates
            elif c.kind is GraphKind.SPECULATIVE:
                assert lane.query_length >= 1 and lane.ceiling == 0  # host lengths, fixed in the plan


@spec(
    "useful-service/no-duration-ceiling",
    "useful-service/no-oldest-filter",
    "useful-service/no-chunk-lateness",
)
def test_no_ceilings_no_oldest_filter_no_lateness():
    old = prompt(1, 100, x=2.0, last_selected_ns=-10)
    new = prompt(2, 5000, x=2.0, last_selected_ns=10)
    c = policy.select(inputs([old, new]))
    assert c.rids == (2,) and c.duration_ms > 80  # a 90 ms chunk for the newer request wins
    # Waiting longer changes a prompt's value only through its price, never a lateness term.
    a = policy.candidates(inputs([prompt(1, 5000, x=2.0)]))
    b = policy.candidates(inputs([prompt(1, 5000, x=2.0, last_selected_ns=-(10**9))]))
    assert [c.score for c in a] == [c.score for c in b]


@spec("prerequisites/compare-first-stage", "prerequisites/setup-no-tokens")
def test_first_stage_alone_competes_and_setup_commits_no_tokens():
    from .test_prerequisites import blocked, terminal

    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), terminal(2, age_ms=50.0)]
    cands = [
        c
        for c in policy.candidates(inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY))
        if c.kind is GraphKind.SNAPSHOT
    ]
    assert any(c.following is None for c in cands) and any(c.following is not None for c in cands)
    s = Scheduler(ORDINARY, initialize_requests=True)
    s.seed_costs(0)
    h = s.admit([1] * 8, max_output=5)
    plan = s.plan()
    assert plan.kind is GraphKind.INITIALIZE
    s.commit(plan, 1)
    s.advance_to(int(0.2 * MS))
    gen = s.complete(1, records(plan), timing(0.2))
    assert gen == [] and s.requests[h.rid].output == [] and s.requests[h.rid].history.log_x is None


@spec("mixed-execution/needs-feedback", "mixed-execution/no-synthesis", "mixed-execution/measured-choose")
def test_mixed_programs_in_the_window_and_the_references():
    assert not GraphKind.MIXED.may_share_window
    no_mixed = ORDINARY.__class__(
        **{**ORDINARY.__dict__, "graphs": tuple(g for g in ORDINARY.graphs if g.kind is not GraphKind.MIXED)}
    )
    cands = policy.candidates(inputs([prompt(1, 64), decoder(2)], catalog=no_mixed, mode=DecodeMode.ORDINARY))
    assert not any(c.kind is GraphKind.MIXED for c in cands)  # never synthesised from serial programs
    # Measured durations decide between mixed alternatives: make the 64-token mixed shape slow.
    from .helpers import measured

    costs = measured(ORDINARY)
    views = [prompt(1, 40, x=0.2), decoder(2), decoder(3)]
    fast = policy.select(inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY, costs=costs))
    assert fast.kind is GraphKind.MIXED and fast.graph.prefill_capacity == 64
    slow = measured(ORDINARY)
    slow.observe(fast.graph.key, [200e6], 0)
    slow.observe(fast.graph.key, [200e6], 0)
    other = policy.select(inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY, costs=slow))
    assert other.graph != fast.graph
    # Mixed shapes join the service-rate reference: with only mixed generation programs loaded
    # the reference interval still exists.
    only_mixed = ORDINARY.__class__(
        **{**ORDINARY.__dict__, "graphs": tuple(g for g in ORDINARY.graphs if g.kind is not GraphKind.DECODE)}
    )
    c = policy.select(inputs([decoder(1)], catalog=only_mixed, mode=DecodeMode.ORDINARY))
    assert c.kind is GraphKind.MIXED and c.score > 0


@spec("service-accounting/unselected-zero")
def test_unselected_participants_are_charged_zero_service():
    """Only decode B=1 is loaded: of two decoding requests one is served per frame. Over an
    isolated 5 ms interval the served one gets one token (x <- a*x + (1 - a)*1/5, a = e^-0.05)
    and the other zero: its token and delivery rates decay by e^-0.05 (log -0.05)."""
    catalog = dataclasses.replace(
        ORDINARY,
        graphs=tuple(
            g
            for g in ORDINARY.graphs
            if g.kind is GraphKind.PREFILL or g.name == "decode[B=1,W=1,D=0,C=0,P=1]"
        ),
    )
    s, handles, t, fence = decoding(catalog)
    before = {h.rid: (s.requests[h.rid].history.log_x, s.requests[h.rid].history.log_z) for h in handles}
    assert all(x is not None and z is not None for x, z in before.values())
    plan = s.plan()
    assert len(plan.lanes) == 1
    served = plan.lanes[0].handle.rid
    other = next(h.rid for h in handles if h.rid != served)
    s.commit(plan, fence)
    s.advance_to(int((t + 5) * MS))
    s.complete(fence, records(plan), timing(5.0))
    a = math.exp(-0.05)
    x0, z0 = before[served]
    assert math.exp(s.requests[served].history.log_x) == pytest.approx(a * math.exp(x0) + (1 - a) / 5.0)
    assert s.requests[other].history.log_x == pytest.approx(before[other][0] - 0.05)
    assert s.requests[other].history.log_z == pytest.approx(before[other][1] - 0.05)
    assert s.requests[served].history.log_z == pytest.approx(z0 - 0.05)  # no delivery until published


@spec("service-accounting/committed-diffs")
def test_queued_frames_are_charged_their_own_committed_tokens():
    """One decoder on the speculative catalog, preseeded to expect long bursts (W = 8), with two
    frames queued. The first (isolated, 6 ms) commits 4 tokens, the queued second (device 5 ms)
    6 tokens: each interval is charged its own committed tokens, not the output counter as it
    stood before the queued work, nor the frozen expectation."""
    from helios_jax.scheduler.speculation import PrefixEstimate

    history = {SOURCE_LEARNED: PrefixEstimate(np.full(7, 0.9), np.full(7, 64.0), 0)}
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=500, acceptance_history=history)
    _, _, t = run_once(s, 1, 0.0)
    req = s.requests[h.rid]
    s.advance_to(int(t * MS))
    first = s.plan()
    s.commit(first, 2)
    second = s.plan()
    s.commit(second, 3)
    assert first.lanes[0].query_length == second.lanes[0].query_length == 8
    assert s.in_flight == (2, 3) and first.lanes[0].expected_tokens != 4
    x0 = math.exp(req.history.log_x)
    s.advance_to(int((t + 6) * MS))
    s.complete(2, records(first, accepted=3), ExecutionTiming((6.0 * MS,), 6.0 * MS))
    a1 = math.exp(-6 / 100)
    x1 = a1 * x0 + (1 - a1) * 4 / 6.0
    assert math.exp(req.history.log_x) == pytest.approx(x1)
    s.advance_to(int((t + 11) * MS))
    s.complete(3, records(second, accepted=5), ExecutionTiming((5.0 * MS,), 11.0 * MS, queued=True))
    a2 = math.exp(-5 / 100)
    assert math.exp(req.history.log_x) == pytest.approx(a2 * x1 + (1 - a2) * 6 / 5.0)
    assert len(req.output) == 1 + 4 + 6


@spec("mixed-execution/references-lookahead")
def test_mixed_shapes_set_the_reference_and_follow_prerequisites():
    """The ordinary catalog without its decode graphs: mixed graphs are the only generation
    programs, and the fastest, mixed B=2 C=64 (4.885 ms), sets the reference interval.

    - one decoder (x = 2, z = 0.25, A = 10): K = 1, sigma = 4.885; decode-only mixed B=2 C=64
      scores (88 + 0.1*4.885*(10 + 4.885))/4.885 - 4.885/2*0.1 = 19.258580;
    - a stream behind a restore (0.35 ms) and that decoder: K = 2, sigma = 2*4.885/2; the restore
      followed by mixed B=2 C=64, U = 5.235: (88 + 0.1*U*(10 + U) + 88 + 0.1*4.885*(10 + U))/U
      - U/2*0.2 = 36.041509;
    - a prompt of 40 tokens (x = 0.3) behind initialization (0.2 ms) beside the decoder: its prompt
      row rides mixed B=2 C=64 after it, U = 5.085: (54.333*40 + 117.333 + 88 + 0.1*4.885*(10 + U))/U
      - U/2*0.1 = 468.975974.
    """
    only_mixed = dataclasses.replace(
        ORDINARY, graphs=tuple(g for g in ORDINARY.graphs if g.kind is not GraphKind.DECODE)
    )
    ordinary = dict(catalog=only_mixed, mode=DecodeMode.ORDINARY)
    m2 = "mixed[B=2,W=1,D=0,C=64,P=65]"

    def unscaled(c):
        return c.score * math.exp(c.log_scale)

    c = policy.select(inputs([decoder(1)], **ordinary))
    assert c.graph.name == m2 and c.prefill_row is None
    assert unscaled(c) == pytest.approx((88 + 0.1 * 4.885 * (10 + 4.885)) / 4.885 - 4.885 / 2 * 0.1)
    from .test_prerequisites import blocked

    c = policy.select(inputs([blocked(1, [GraphKind.RESTORE], Phase.DECODE), decoder(2)], **ordinary))
    u = 0.35 + 4.885
    assert c.kind is GraphKind.RESTORE and c.following.graph.name == m2 and sorted(c.following.rids) == [1, 2]
    assert unscaled(c) == pytest.approx(
        (88 + 0.1 * u * (10 + u) + 88 + 0.1 * 4.885 * (10 + u)) / u - u / 2 * 0.2
    )
    c = policy.select(
        inputs([blocked(1, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=40, x=0.3), decoder(2)], **ordinary)
    )
    u = 0.2 + 4.885
    prompt_value = (1 + 16 / 0.3) * 40 + (64 + 16 / 0.3)
    assert c.kind is GraphKind.INITIALIZE and c.following.graph.name == m2 and c.following.prefill_row == 0
    assert unscaled(c) == pytest.approx((prompt_value + 88 + 0.1 * 4.885 * (10 + u)) / u - u / 2 * 0.1)


def test_a_preseeded_acceptance_estimate_shallower_than_the_catalog_is_refused_and_changes_nothing():
    """A depth-3 estimate on a depth-7 catalog left depths 4..7 uncovered: a funded probe then
    took the minimum of an empty slice (ValueError deep inside plan()). Admission refuses it."""
    from helios_jax.scheduler.speculation import PrefixEstimate

    s = scheduler(SPEC)
    free = (s.slots.available, s.pages.available)
    shallow = {SOURCE_LEARNED: PrefixEstimate(np.full(3, 0.9), np.full(3, 64.0), 0)}
    with pytest.raises(ValueError, match="depth 3; the catalog's proposal depth is 7"):
        s.admit([1] * 8, max_output=500, acceptance_history=shallow)
    with pytest.raises(ValueError, match="unknown proposal source"):
        s.admit([1] * 8, max_output=500, acceptance_history={"oracle": shallow[SOURCE_LEARNED]})
    assert not s.requests and (s.slots.available, s.pages.available) == free
    s.admit(
        [1] * 8,
        max_output=500,
        acceptance_history={SOURCE_LEARNED: PrefixEstimate(np.full(7, 0.9), np.full(7, 64.0), 0)},
    )
