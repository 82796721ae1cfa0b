"""Checkpoint retention: anchors, extras within the allowance, the prefix cache, terminal
captures, guards, victims and preemption."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.checkpoints import CheckpointStore, Role, capture_endpoints
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import PlanRejected
from helios_jax.scheduler.speculation import SOURCE_COPY, SOURCE_LEARNED
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import SPEC
from .test_core import records, timing

spec = pytest.mark.spec
MS = NS_PER_MS


def sched(**kw):
    s = Scheduler(SPEC, checkpoints=True, **kw)
    s.seed_costs(0)
    return s


def step(s, fence, t, accepted=0):
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, fence)
    t += plan.expected_duration_ms
    s.advance_to(int(t * MS))
    gen = s.complete(fence, records(plan, accepted), timing(plan.expected_duration_ms))
    for g in gen:
        if g.tokens or g.finished:
            if g.tokens:
                s.published_output(g.handle, fence)
    return plan, gen, t


@spec(
    "planning-queue/anchor-last-message",
    "planning-queue/anchor-prompt-end",
    "planning-queue/earlier-reverse",
    "planning-queue/exact-endpoints",
)
def test_anchor_and_extras_order():
    assert capture_endpoints([100, 300, 700], 1000, 0) == (700, [300, 100, 1000])
    assert capture_endpoints([], 1000, 0) == (1000, [])
    assert capture_endpoints([100, 1000], 1000, 0) == (1000, [100])  # the prompt end is not repeated
    assert capture_endpoints([100, 300], 1000, 200) == (300, [1000])  # endpoints inside the cache
    assert capture_endpoints([200, 300], 1000, 200) == (300, [1000])  # the cached end is not beyond it
    assert capture_endpoints([], 1000, 1000) == (None, [])  # a fully cached prompt has nothing to capture
    assert capture_endpoints([1000], 1000, 999) == (1000, [])


@spec(
    "planning-queue/victim-ranking",
    "planning-queue/guard-protects",
    "planning-queue/mandatory-revokes",
    "planning-queue/armed-retained",
)
def test_store_victims_guards_and_pins():
    store = CheckpointStore(3)
    a = store.arm(1, (1, 2), Role.ANCHOR, now_ns=10)
    e = store.arm(2, (1, 2, 3), Role.EXTRA, now_ns=20)
    t = store.arm(3, (9,), Role.TERMINAL, now_ns=5)
    assert not store.obtainable(4)  # all pinned while their captures are in flight
    for row in (a, e, t):
        store.captured(row, now_ns={a: 10, e: 20, t: 5}[row])
    assert store.victims(4) == [e, a, t]  # extras first, then anchors, then terminal captures
    store.pin(e, now_ns=30)  # an in-flight restore reads it
    assert store.victims(4) == [a, t]
    store.unpin(e)
    # A terminal capture keeps its own request's anchor (the next turn extends it) and evicts
    # another's; other roles rank as before.
    assert store.victims(1, role=Role.TERMINAL) == [e, t]
    assert store.victims(4, role=Role.TERMINAL) == [e, a, t]
    assert store.victims(1, role=Role.EXTRA) == [e, a, t]
    # Guards: a free row reserved for a later anchor is not taken by an optional capture.
    store2 = CheckpointStore(1)
    assert store2.guard(owner=7) is not None
    assert not store2.obtainable(8)
    assert store2.obtainable(8, mandatory=True)  # mandatory execution may revoke an unused guard
    assert store2.obtainable(7)  # its owner may use it


def test_lookup_is_longest_proper_prefix_and_alias_aware():
    store = CheckpointStore(4)
    r1 = store.arm(1, (1, 2), Role.ANCHOR, 0)
    r2 = store.arm(1, (1, 2, 3, 4), Role.EXTRA, 0)
    assert store.lookup((1, 2, 3, 4, 5)) is None  # not ready yet
    store.captured(r1, 1)
    store.captured(r2, 1)
    assert store.lookup((1, 2, 3, 4, 5)).row == r2
    assert store.lookup((1, 2, 3, 4)).row == r1  # proper prefix only
    assert store.holds((1, 2)) and not store.holds((1,))


@spec(
    "planning-queue/extra-allowance",
    "planning-queue/cut-needs-destination",
    "prerequisites/nonterminal-utility",
)
def test_a_chat_prompt_stops_at_its_anchor_and_snapshots_it():
    s = sched()
    prompt = list(range(1, 301))
    h = s.admit(prompt, max_output=20, message_endpoints=[120, 250])
    req = s.requests[h.rid]
    assert [e for e, r in req.capture.endpoints if r is Role.ANCHOR] == [250]
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.prompt_limit == min(e for e, _ in req.capture.endpoints)  # chunks stop at the next capture
    t, fence = 0.0, 0
    kinds, blocked = [], []
    while req.phase is not Phase.DECODE or req.capture.row is not None or req.prerequisites:
        fence += 1
        plan, _, t = step(s, fence, t)
        kinds.append(plan.kind)
        if plan.kind is GraphKind.SNAPSHOT:
            assert plan.lanes[0].snapshot_row is not None
        if req.phase is Phase.BLOCKED:
            blocked.append((req.consumed, req.enables))
    assert GraphKind.SNAPSHOT in kinds
    assert blocked == [(250, Phase.PREFILL)]  # the anchor inside the prompt: its rest follows
    # Extras would cost a 0.3 ms copy plus a 4.85 ms split each, beyond 0.05 x 300 x 0.0219 ms:
    # only the anchor (the last message, at 250) is captured.
    assert [cp.length for cp in s.checkpoints.entries.values()] == [250]
    assert s.checkpoints.lookup(prompt + [7]).length == 250


@spec(
    "planning-queue/exact-endpoints",
    "useful-service/prompt-progress",
    "useful-service/no-service-waste",
    "prerequisites/restore-fresh-generation",
)
def test_a_second_turn_restores_the_anchor_and_pays_only_uncached_tokens():
    s = sched()
    first = list(range(1, 201))
    h = s.admit(first, max_output=1, message_endpoints=[200])
    t, fence = 0.0, 0
    while h.rid in s.requests:
        fence += 1
        _, _, t = step(s, fence, t)
    assert s.checkpoints.lookup(first + [5]) is not None
    second = first + list(range(500, 540))
    h2 = s.admit(second, max_output=2)
    req = s.requests[h2.rid]
    assert req.cached == 200 and req.prerequisites == [GraphKind.RESTORE]
    assert req.prompt_remaining == 40
    fence += 1
    plan, _, t = step(s, fence, t)
    assert plan.kind is GraphKind.RESTORE and plan.lanes[0].snapshot_row is not None
    fence += 1
    plan, _, t = step(s, fence, t)
    prompt_lane = next(lane for lane in plan.lanes if lane.role is LaneRole.PROMPT)
    assert prompt_lane.prompt_start == 200 and prompt_lane.prompt_tokens == 40  # only the uncached part


@spec("planning-queue/unknown-no-extras", "planning-queue/no-fixed-captures")
def test_unknown_costs_allow_no_extras_but_keep_the_anchor():
    s = Scheduler(SPEC, checkpoints=True)  # nothing measured
    h = s.admit(list(range(1, 1001)), max_output=5, message_endpoints=[100, 300, 700])
    assert s.requests[h.rid].capture.endpoints == [(700, Role.ANCHOR)]


@spec("planning-queue/extra-allowance", "planning-queue/extra-fraction-default")
@settings(max_examples=60, deadline=None)
@given(st.integers(64, 6000), st.lists(st.integers(1, 6000), max_size=8))
def test_extra_captures_fit_the_allowance(prompt_len, endpoints):
    s = sched()
    h = s.admit([3] * prompt_len, max_output=4, message_endpoints=[e for e in endpoints if e <= prompt_len])
    req = s.requests[h.rid]
    extras = [e for e, r in req.capture.endpoints if r is Role.EXTRA]
    per_token = s.captures.prefill_ms_per_token()
    cost = s.captures.extra_capture_cost_ms(s.now_ns)
    assert len(extras) * cost <= 0.05 * per_token * prompt_len + 1e-9


@spec(
    "planning-queue/decode-terminal-capture",
    "prerequisites/terminal-snapshot",
    "prerequisites/terminal-age-start",
    "prerequisites/terminal-clock-no-reset",
    "prerequisites/snapshot-before-continuation",
)
def test_terminal_capture_is_funded_by_decode_and_completes_the_response():
    s = sched()
    h = s.admit([3] * 64, max_output=40)
    t, fence, finished_at = 0.0, 0, None
    events = []
    while h.rid in s.requests:
        fence += 1
        plan, gen, t = step(s, fence, t)
        events += [(plan.kind, g.finished, g.tokens) for g in gen]
        if (
            s.requests.get(h.rid) is not None
            and s.requests[h.rid].phase is Phase.TERMINAL
            and finished_at is None
        ):
            finished_at = s.requests[h.rid].terminal_since_ns
    # 40 tokens of decoding earn 0.05 * ~40 rounds * ~3.6 ms = ~7 ms >> one 0.3 ms snapshot
    assert events[-1] == (GraphKind.SNAPSHOT, True, ())  # the completion is visible only now
    assert not any(f for k, f, _ in events[:-1])
    assert finished_at is not None
    terminal = s.checkpoints.lookup([3] * 64 + [5] * 39 + [9])  # the next turn restores it
    assert terminal is not None and terminal.role is Role.TERMINAL
    assert terminal.last_demand_ns == int(t * MS)  # dated at the capture's completion


@spec("planning-queue/decode-terminal-capture")
def test_a_host_stop_completes_with_its_reason_after_the_terminal_capture():
    """A stop the host detects (a stop string) ends the request after its committed output; the
    terminal capture it funded completes the response, which carries the host's reason."""
    s = sched()
    h = s.admit([3] * 64, max_output=40)
    t, fence = 0.0, 0
    for _ in range(30):
        fence += 1
        _, _, t = step(s, fence, t)
    s.finish(h, "stop")
    assert s.requests[h.rid].finished
    events = []
    while h.rid in s.requests:
        fence += 1
        plan, gen, t = step(s, fence, t)
        events += [(plan.kind, g.finished, g.finish_reason) for g in gen]
    assert events == [(GraphKind.SNAPSHOT, True, "stop")]


@spec("prerequisites/preemption-no-complete", "prerequisites/terminal-age-start")
def test_preemption_trigger_and_resume():
    s = sched(kv_pages=14, page_size=16)
    a = s.admit([3] * 64, max_output=100)  # 64 + 100 + 7 -> 11 pages
    t, fence = 0.0, 0
    for _ in range(3):
        fence += 1
        _, _, t = step(s, fence, t)
    assert not s.can_admit(64, 100)
    victim = s.preemption_candidate(64, 100)
    assert victim == a
    s.preempt(victim)
    req = s.requests[a.rid]
    assert req.phase is Phase.TERMINAL and req.finish_reason == "preempted"
    fence += 1
    plan, gen, t = step(s, fence, t)
    assert plan.kind is GraphKind.SNAPSHOT and gen[0].finish_reason == "preempted"
    assert a.rid not in s.requests and s.can_admit(64, 100)
    assert s.preemption_candidate(64, 100) is None  # nothing to preempt once it fits


@spec("planning-queue/armed-retained", "prerequisites/preemption-no-complete")
def test_a_terminal_capture_row_is_owned_by_the_request_it_captures():
    """A preemption arms a terminal capture: the destination row is held for the preempted
    request and the store attributes it to that request (owned_rows, like owned_pages and
    owned_slots) while armed and after the snapshot completes, so row ownership can be
    accounted per request like its pages and slot."""
    s = sched()
    s.admit([4] * 64, max_output=40)  # another request
    h = s.admit([3] * 64, max_output=40)
    t, fence = 0.0, 0
    while any(r.phase is not Phase.DECODE or len(r.output) < 3 for r in s.requests.values()):
        fence += 1  # past the anchors (the prompt ends): a terminal state is a new prefix
        _, _, t = step(s, fence, t)
    s.preempt(h)
    row = s.requests[h.rid].capture.row
    assert row is not None and s.checkpoints.owned_rows()[row] == h.rid  # not the other decoder
    while h.rid in s.requests:
        fence += 1
        _, _, t = step(s, fence, t)
    assert s.checkpoints.entries[row].ready and s.checkpoints.owned_rows()[row] == h.rid


def decoding_with_output(s, outputs=3):
    """A 64-token request admitted and stepped until it decodes with `outputs` tokens out; returns
    (its handle, the virtual time in ms)."""
    h = s.admit([3] * 64, max_output=40)
    t, fence = 0.0, 0
    while s.requests[h.rid].phase is not Phase.DECODE or len(s.requests[h.rid].output) < outputs:
        fence += 1
        _, _, t = step(s, fence, t)
    return h, t


@spec("prerequisites/terminal-age-start", "prerequisites/terminal-clock-no-reset")
def test_a_terminal_view_ages_from_the_preemption():
    """A preempted request awaiting its terminal capture is seen by selection as a terminal
    view whose terminal age runs from the preemption (its start), whatever the output age was:
    5 ms after preempting it, the view's terminal age is 5 ms."""
    s = sched()
    h, t = decoding_with_output(s)
    s.advance_to(int((t + 1.0) * MS))
    s.preempt(h)  # at t + 1
    s.advance_to(int((t + 6.0) * MS))
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.phase is Phase.TERMINAL and view.terminal_age_ms == pytest.approx(5.0)


@spec("planning-queue/age-reset-published", "useful-service/conditional-acceptance")
def test_a_request_blocked_on_its_anchor_is_priced_with_the_decode_limits_and_age():
    """A prompt that ends at its anchor finishes its prefill, publishes its first token and then
    waits for the anchor's snapshot, blocked before decoding. Selection sees it with the limits
    and output age of the decoding it enables: the age since that publication (not since
    admission), the output left and the context left after its cursor."""
    s = sched(max_model_len=200)
    s.advance_to(4 * MS)  # admitted at 4 ms, the prefill runs later
    h = s.admit([3] * 64, max_output=100)
    _, gen, t = step(s, 1, 10.0)
    req = s.requests[h.rid]
    assert gen[0].tokens and req.phase is Phase.BLOCKED and req.enables is Phase.DECODE
    published = t  # step() publishes at the completion
    s.advance_to(int((published + 2.0) * MS))
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.phase is Phase.BLOCKED and view.prerequisites == (GraphKind.SNAPSHOT,)
    assert view.age_ms == pytest.approx(2.0)
    assert view.output_remaining == 99 and view.context_remaining == 200 - 64


def test_a_blocked_view_carries_the_restrictions_and_estimates_of_the_decoding_it_enables():
    """Blocked on its anchor before decoding, a request is priced with what its decoding will
    have: its width restriction, its copy prefix while copy is its source (none once its source
    is learned again), its own survival estimate pooled with the population's, its forecast, and
    its output age since its first token, however short."""
    s = sched()
    h = s.admit([3] * 64, max_output=100)
    _, _, t = step(s, 1, 0.0)
    req = s.requests[h.rid]
    assert req.phase is Phase.BLOCKED and req.enables is Phase.DECODE and not req.inflight
    s.restrict_width(h, 2)
    assert s.offer_copy(h, 2) == SOURCE_COPY
    pool = s.population.acceptance_pools[SOURCE_COPY]
    pool.observe(np.full(pool.depth, 0.9), tokens=10)  # the pool moves away from its origin
    s.advance_to(int((t + 0.25) * MS))
    view = next(v for v in s.views() if v.rid == h.rid)
    est = req.acceptance.get(SOURCE_COPY)
    assert view.phase is Phase.BLOCKED and view.age_ms == pytest.approx(0.25)
    assert view.width_limit == 2 and view.copy_limit == 2
    np.testing.assert_array_equal(view.survival, est.means(pool))
    assert not np.array_equal(view.survival, est.means(None))
    np.testing.assert_array_equal(view.forecast, req.forecast.means())
    req.proposal_source = SOURCE_LEARNED  # what offer_copy(..., learned=True) sets when it prefers it
    assert next(v for v in s.views() if v.rid == h.rid).copy_limit is None


@spec("planning-queue/decode-terminal-capture")
def test_a_terminal_capture_needs_an_allowance_of_at_least_its_cost_and_spends_it():
    """Without a preemption, a decoding request enters its terminal capture only when the
    allowance its decode earned covers the snapshot's cost (exactly covering it is enough); the
    capture spends that cost and arms a terminal row of its own, dated now."""
    s = sched()
    h, t = decoding_with_output(s)
    req = s.requests[h.rid]
    now = int(t * MS)
    cost = s.captures.cost_ms(GraphKind.SNAPSHOT, now)
    req.capture.terminal_allowance_ms = math.nextafter(cost, 0.0)
    assert not s.captures.begin_terminal_capture(req, now) and req.phase is Phase.DECODE
    req.capture.terminal_allowance_ms = cost
    assert s.captures.begin_terminal_capture(req, now)
    row = s.checkpoints.entries[req.capture.row]
    assert req.phase is Phase.TERMINAL and req.capture.terminal_allowance_ms == 0.0
    assert (row.role, row.owner, row.last_demand_ns, row.ready) == (Role.TERMINAL, h.rid, now, False)


def test_a_completed_snapshot_dates_its_checkpoint_and_only_the_next_prerequisite_completes():
    """An anchor snapshot's completion readies its checkpoint dated at the completion (the time
    victim selection ranks rows by) and moves the request on; a completion of another kind than
    its next prerequisite changes nothing."""
    s = sched()
    h = s.admit([3] * 64, max_output=100)
    _, _, t = step(s, 1, 0.0)
    req = s.requests[h.rid]
    assert req.prerequisites == [GraphKind.SNAPSHOT]
    before = (req.epoch, list(req.prerequisites), req.phase, req.capture.row)
    s.captures.prerequisite_done(req, GraphKind.RESTORE, int(t * MS))
    assert (req.epoch, list(req.prerequisites), req.phase, req.capture.row) == before
    row = req.capture.row
    plan, _, end = step(s, 2, t)
    assert plan.kind is GraphKind.SNAPSHOT and req.phase is Phase.DECODE and req.capture.row is None
    cp = s.checkpoints.entries[row]
    assert cp.ready and cp.pins == 0 and cp.last_demand_ns == int(end * MS)


@spec("planning-queue/decode-terminal-capture")
def test_a_decode_lane_earns_the_fraction_of_its_share_of_the_measured_time():
    """A one-lane decode frame measured at T ms earns its request checkpoint_extra_work_fraction
    x T toward its terminal capture (a frame of n lanes would give each a share T / n)."""
    s = sched()
    h, t = decoding_with_output(s)
    req = s.requests[h.rid]
    before = req.capture.terminal_allowance_ms
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert [lane.handle for lane in plan.lanes] == [h] and plan.kind is not GraphKind.SNAPSHOT
    s.commit(plan, 100)
    s.advance_to(int((t + 4.0) * MS))
    s.complete(100, records(plan), timing(4.0))
    fraction = s.policy.checkpoint_extra_work_fraction
    assert req.capture.terminal_allowance_ms - before == pytest.approx(fraction * 4.0)


@spec("planning-queue/commit-checks")
def test_a_preemption_moves_its_request_to_a_later_epoch():
    """Preempting a decoding request starts a new epoch of it (its terminal capture's), so a plan
    frozen before the preemption is rejected at commit."""
    s = sched()
    h, t = decoding_with_output(s)
    s.advance_to(int(t * MS))
    stale = s.plan()
    epoch = s.requests[h.rid].epoch
    s.preempt(h)
    assert s.requests[h.rid].epoch > epoch
    with pytest.raises(PlanRejected):
        s.commit(stale, 100)


def test_cancellation_drops_pending_captures_guards_and_an_armed_row_not_in_flight():
    """Cancelled before its anchor, a request gives up its pending endpoints and the row guarded
    for it; cancelled while blocked on its anchor's armed row with nothing in flight, that row
    goes back to the free rows at once (an armed row in flight stays until its fence)."""
    s = sched()
    early = s.admit([3] * 64, max_output=100)
    assert early.rid in s.checkpoints.guards.values() and s.requests[early.rid].capture.endpoints
    req = s.requests[early.rid]
    s.cancel(early)
    assert early.rid not in s.checkpoints.guards.values() and req.capture.endpoints == []
    s = sched()
    h = s.admit([3] * 64, max_output=100)
    step(s, 1, 0.0)
    req = s.requests[h.rid]
    row = req.capture.row
    assert (
        req.phase is Phase.BLOCKED and row is not None and not req.inflight and row in s.checkpoints.entries
    )
    s.cancel(h)
    assert req.capture.row is None and row not in s.checkpoints.entries


@spec("planning-queue/mandatory-revokes", "prerequisites/multiwindow-snapshot-row")
def test_a_multi_window_image_request_revokes_an_unused_anchor_guard():
    """One snapshot row, guarded at admission for a text request's later anchor. A multi-window
    image request needs a private row for its window state (mandatory execution, not an
    optional capture): its admission revokes the unused guard and takes the row, instead of
    being refused; both requests then run to completion, the text one without its anchor."""
    s = sched(snapshot_rows=1, vision_window_tokens=100)
    text = s.admit(list(range(1, 201)), max_output=2)
    assert list(s.checkpoints.guards.values()) == [text.rid]
    image = s.admit(list(range(1, 201)), max_output=2, image_spans=[(10, 60), (70, 150)])
    row = s.requests[image.rid].image_windows.row
    assert row is not None and s.checkpoints.guards == {} and s.checkpoints.owned_rows() == {row: image.rid}
    t, fence = 0.0, 0
    while s.requests and fence < 40:
        fence += 1
        _, _, t = step(s, fence, t)
    assert not s.requests and s.checkpoints.entries == {}


def test_the_preemption_candidate_is_the_best_served_decoder_not_the_oldest():
    """Among decoding requests whose pages would make a waiting request fit, preemption_candidate
    picks the best served: the highest token rate (the lowest fairness price), as
    docs/checkpoints.md says. Two requests admitted at the same time, the first (lower id) served
    faster because the second is restricted to one row per round: the first is the candidate,
    although the tie-breaks among equal rates (earliest admission, then the larger handle) would
    name the second."""
    s = sched(kv_pages=24, page_size=16)
    a = s.admit([3] * 64, max_output=100)  # 64 + 100 + 7 -> 11 pages each; 2 left free
    b = s.admit([4] * 64, max_output=100)
    s.restrict_width(b, 1)
    t, fence = 0.0, 0
    while (
        not all(r.phase is Phase.DECODE and not r.prerequisites for r in s.requests.values())
        or len(s.requests[a.rid].output) < 6
    ):
        fence += 1
        _, _, t = step(s, fence, t, accepted=3)
    rate = {h: s.requests[h.rid].history.log_x for h in (a, b)}
    assert rate[a] > rate[b]
    assert not s.can_admit(64, 100)
    assert s.preemption_candidate(64, 100) == a


@spec("planning-queue/extra-allowance")
def test_each_extra_capture_spends_its_cost_from_the_allowance():
    """The extra-work allowance is a budget: every extra capture admitted spends its cost (one
    snapshot copy plus one prefill split) from it, so an allowance of one and a half captures
    admits exactly one extra, the latest earlier message, and the next chunk stops there (not at
    the earlier messages left out)."""
    s = sched()
    per_token, cost = s.captures.prefill_ms_per_token(), s.captures.extra_capture_cost_ms(s.now_ns)
    fraction = s.policy.checkpoint_extra_work_fraction
    n = math.ceil(1.5 * cost / (fraction * per_token))  # allowance: 1.5 extra captures
    assert cost <= fraction * per_token * n < 2 * cost
    h = s.admit([3] * n, max_output=4, message_endpoints=[100, 200, 300])
    req = s.requests[h.rid]
    assert req.capture.endpoints == [(200, Role.EXTRA), (300, Role.ANCHOR)]
    assert next(v for v in s.views() if v.rid == h.rid).prompt_limit == 200


def _ready(store, owner, tokens, role, now_ns):
    row = store.arm(owner, tokens, role, now_ns)
    store.captured(row, now_ns)
    return row


@spec("planning-queue/victim-ranking")
def test_victims_rank_by_demand_recency_then_endpoint_length():
    store = CheckpointStore(3)
    old = _ready(store, 1, (1, 2, 3), Role.ANCHOR, now_ns=10)
    new = _ready(store, 2, (4,), Role.ANCHOR, now_ns=20)
    short = _ready(store, 3, (5,), Role.ANCHOR, now_ns=10)
    assert store.victims(9) == [short, old, new]  # same role: least recent demand, then shorter
    store.pin(old, now_ns=30)  # a restore reading it is fresh demand
    store.unpin(old)
    assert store.victims(9) == [short, new, old]
    # A capture's completion time is its demand time, whatever the arming time was.
    store2 = CheckpointStore(2)
    a = store2.arm(1, (1,), Role.ANCHOR, now_ns=0)
    b = store2.arm(2, (2,), Role.ANCHOR, now_ns=0)
    store2.captured(b, now_ns=5)
    store2.captured(a, now_ns=9)
    assert store2.victims(3) == [b, a]


@spec("planning-queue/armed-retained")
def test_every_reader_keeps_its_pin_until_it_unpins():
    store = CheckpointStore(1)
    row = _ready(store, 1, (1, 2), Role.ANCHOR, now_ns=0)
    store.pin(row, now_ns=1)
    store.pin(row, now_ns=2)  # two in-flight restores read the same row
    store.unpin(row)
    assert store.victims(5) == [] and not store.obtainable(5)
    store.unpin(row)
    assert store.victims(5) == [row] and store.obtainable(5)
    store.unpin(99)  # a row that is gone (evicted or released) is no error


@spec("planning-queue/victim-ranking")
def test_arming_without_a_free_row_evicts_the_first_victim():
    store = CheckpointStore(2)
    extra = _ready(store, 1, (1, 2), Role.EXTRA, now_ns=0)
    anchor = _ready(store, 1, (1, 2, 3), Role.ANCHOR, now_ns=0)
    row = store.arm(2, (7, 8), Role.ANCHOR, now_ns=5)
    assert row == extra and store.entries[row].tokens == (7, 8) and store.entries[row].owner == 2
    assert not store.holds((1, 2)) and store.holds((1, 2, 3))
    assert store.lookup((1, 2, 9)) is None and store.lookup((1, 2, 3, 9)).row == anchor
    assert store.victims(3) == [anchor]  # the new destination is armed (pinned)
    store.captured(row, now_ns=6)
    assert store.victims(3) == [anchor, row]


@spec("planning-queue/guard-protects", "planning-queue/mandatory-revokes")
def test_only_mandatory_execution_revokes_a_guard():
    store = CheckpointStore(2)
    guarded = store.guard(owner=7)
    other = store.arm(8, (1,), Role.EXTRA, now_ns=0)  # the unguarded free row
    assert other != guarded
    with pytest.raises(LookupError):
        store.arm(9, (2,), Role.EXTRA, now_ns=0)  # optional: the guarded row is not for it
    assert store.guards == {guarded: 7}
    window = store.arm(9, (), Role.WINDOW, now_ns=0, mandatory=True)
    assert window == guarded and store.guards == {}  # mandatory execution revoked the unused guard
    assert store.free_rows == 0


def test_a_guard_needs_a_free_unguarded_row_and_goes_with_its_owner():
    store = CheckpointStore(2)
    a, b = store.guard(owner=1), store.guard(owner=2)
    assert {a, b} == {0, 1} and store.guard(owner=3) is None
    store.release_guards(1)
    assert store.guards == {b: 2} and store.guard(owner=3) == a


@spec("planning-queue/armed-retained")
def test_abandoned_captures_and_released_private_rows_return_their_rows():
    store = CheckpointStore(2)
    row = store.arm(1, (1, 2), Role.ANCHOR, now_ns=0)
    store.abandon(row)  # the copy will not happen
    assert row not in store.entries and store.free_rows == 2 and not store.holds((1, 2))
    private = store.arm(2, (), Role.WINDOW, now_ns=0, mandatory=True)
    store.captured(private, now_ns=1)
    assert store.victims(3) == [] and store.lookup((5,)) is None  # never a victim, never published
    store.pin(private, now_ns=2)
    store.drop(private)  # still read by an in-flight restore: kept
    assert private in store.entries and store.free_rows == 1
    store.unpin(private)
    store.drop(private)
    assert private not in store.entries and store.free_rows == 2
    store.drop(private)  # already gone: nothing happens
    again = store.arm(2, (), Role.WINDOW, now_ns=3, mandatory=True)
    store.release_private(again)
    assert again not in store.entries and store.free_rows == 2
    store.release_private(again)  # idempotent
    assert store.free_rows == 2 and sorted(store.owned_rows()) == []
    assert store.arm(4, (9,), Role.ANCHOR, now_ns=4) in (0, 1)


@pytest.mark.spec("planning-queue/victim-ranking")
def test_identical_prompts_share_one_anchor():
    """The store's allocation is alias-aware: a prefix already stored (or being captured) is never
    captured twice, so a second identical conversation restores or skips, never copies it again."""
    s = sched()
    prompt = list(range(1, 301))
    for _ in range(2):
        s.admit(prompt, max_output=2, message_endpoints=[250])
    t, fence = 0.0, 0
    while s.requests and fence < 60:
        fence += 1
        _, _, t = step(s, fence, t)
    assert sorted(cp.length for cp in s.checkpoints.entries.values()) == [250]


@spec("planning-queue/guard-protects")
def test_a_requests_own_earlier_extra_never_takes_its_anchor_guard():
    """One snapshot row, guarded at admission for the anchor (the last message). The extra at an
    earlier message is optional: the guard protects the row from it. An 8000-token prompt with
    messages ending at 4000 and 6000: anchor 6000, and the extra at 4000 within the allowance
    (0.05 x the measured prefill cost per token x 8000 tokens, against a snapshot plus a split).
    No capture is armed at 4000; the anchor at 6000 is captured into the guarded row."""
    store = CheckpointStore(1)
    row = store.guard(7)
    assert not store.obtainable(7, role=Role.EXTRA) and store.obtainable(7, role=Role.ANCHOR)
    with pytest.raises(LookupError):
        store.arm(7, (1,) * 100, Role.EXTRA, now_ns=0)
    assert store.arm(7, (1,) * 200, Role.ANCHOR, now_ns=0) == row
    s = sched(snapshot_rows=1)
    h = s.admit(list(range(1, 8001)), max_output=2, message_endpoints=[4000, 6000])
    req = s.requests[h.rid]
    assert {(4000, Role.EXTRA), (6000, Role.ANCHOR)} <= set(req.capture.endpoints)
    t, fence, captured = 0.0, 0, []
    while h.rid in s.requests and fence < 40:
        fence += 1
        plan, _, t = step(s, fence, t)
        if plan.kind is GraphKind.SNAPSHOT and plan.lanes[0].role is LaneRole.PREREQUISITE:
            captured.append(req.consumed)
    assert 4000 not in captured and 6000 in captured
