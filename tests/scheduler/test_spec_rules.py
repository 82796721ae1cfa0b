"""Rules checked at the line that implements them, on the Scheduler and the selector.

Each test states the rule's behaviour with figures derived by hand from the spec and fails when
the implementing line is changed (docs/mutation.md lists the mutations).
"""

import math

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import service
from helios_jax.scheduler.core import NS_PER_MS
from helios_jax.scheduler.plan import CompletionRecord
from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate
from helios_jax.scheduler.view import LaneRole

from .helpers import SPEC
from .test_core import records, run_once, scheduler, timing

spec = pytest.mark.spec
MS = NS_PER_MS
nan = np.nan


def _decoding(catalog=SPEC, n=1, max_output=500, stop=(), **kw):
    """A scheduler with n requests past their prefill, the time (ms) and the next fence."""
    s = scheduler(catalog, **kw)
    handles = [s.admit([1] * 8, max_output=max_output, stop_token_ids=stop) for _ in range(n)]
    t, fence = 0.0, 1
    while any(s.requests[h.rid].phase.value != "decode" for h in handles):
        _, _, t = run_once(s, fence, t)
        fence += 1
    s.advance_to(int(t * MS))
    return s, handles, t, fence


@spec("confidence-acceptance/termination-censors", "confidence-acceptance/accepted-positive")
def test_a_stop_inside_the_accepted_prefix_censors_only_what_follows_it():
    """Four proposals offered, three accepted, the second accepted proposal is the stop token:
    depths 1 and 2 were accepted (two positive observations), depths 3.. are censored. With the
    estimate at 0.5 and weight 2 (aged over the two committed tokens: w = 2 * 0.5**(2/128)), a
    positive observation moves a depth to 0.5 + 0.5/(w + 1)."""
    s, (h,), t, fence = _decoding(stop=(9,))
    req = s.requests[h.rid]
    est = req.acceptance.get(SOURCE_LEARNED)
    est.mean[:] = 0.5
    est.weight[:] = 2.0
    est.tokens_at = len(req.output)
    est._cache.clear()
    plan = s.plan()
    lane = plan.lanes[0]
    assert plan.kind is GraphKind.SPECULATIVE and max(lane.query_length, lane.ceiling) >= 5
    s.commit(plan, fence)
    s.advance_to(int((t + 6) * MS))
    rows = lane.query_length or lane.ceiling
    rec = CompletionRecord(h, lane.epoch, tokens=(5, 9, 5, 5), offered=rows - 1, accepted=3)
    gen = s.complete(fence, [rec], timing(6.0))
    assert gen[0].tokens == (5, 9) and gen[0].finish_reason == "stop"
    moved = 0.5 + 0.5 / (2 * 0.5 ** (2 / 128) + 1)
    np.testing.assert_allclose(est.mean[:4], [moved, moved, 0.5, 0.5])


@spec("mixed-execution/variant-matches-mode")
def test_speculative_modes_never_load_a_mixed_graph_without_draft_state():
    """A hand-built speculative catalog whose width-one mixed graphs lack draft-state
    maintenance: adaptive and fixed-width-one loading leave them out, the maintaining wider
    ones stay."""
    import dataclasses

    graphs = tuple(
        dataclasses.replace(g, speculative=False)
        if g.kind is GraphKind.MIXED and g.token_capacity == 1
        else g
        for g in SPEC.graphs
    )
    plain = dataclasses.replace(SPEC, graphs=graphs)
    adaptive = [g for g in plain.eligible(DecodeMode.ADAPTIVE) if g.kind is GraphKind.MIXED]
    assert adaptive and all(g.speculative and g.token_capacity > 1 for g in adaptive)
    assert not [g for g in plain.eligible(DecodeMode.FIXED, fixed_width=1) if g.kind is GraphKind.MIXED]


@spec("service-accounting/one-interval", "service-accounting/first-burst-history")
@pytest.mark.parametrize("queued", [False, True])
def test_a_frame_without_a_device_interval_adds_no_service_interval(queued):
    """Only a successful frame with a positive device interval adds a measured interval. Without
    one (an isolated frame reporting only wall time, or a queued frame), completion leaves token
    and delivery histories as they were, its publication neither raises nor applies a delivery
    update, and output age still resets at the publication."""
    from helios_jax.scheduler.plan import ExecutionTiming

    from .helpers import ORDINARY

    s, (h, other), t, fence = _decoding(ORDINARY, n=2)
    req = s.requests[h.rid]
    if queued:  # a frame in flight ahead of the one without a device interval
        first = s.plan()
        s.commit(first, fence)
        fence += 1
    plan = s.plan()
    assert plan is not None and not plan.needs_empty_window
    s.commit(plan, fence)
    if queued:
        s.advance_to(int((t + 4) * MS))
        for g in s.complete(fence - 1, records(first), timing(4.0)):
            s.published_output(g.handle, fence - 1)
        t += 4
    before = (req.history.log_x, req.history.log_z)
    s.advance_to(int((t + 5) * MS))
    gen = s.complete(fence, records(plan), ExecutionTiming((0.0,), 5.0 * MS, queued=queued))
    assert (req.history.log_x, req.history.log_z) == before
    for g in gen:
        s.published_output(g.handle, fence)
    assert (req.history.log_x, req.history.log_z) == before
    assert req.last_publication_ns == int((t + 5) * MS)


def _narrow_device_catalog():
    """SPEC's prefill programs plus one width-one program and one device-allocated program whose
    P = 4 is below its width W = 8 (B = 1)."""
    import dataclasses

    from helios_jax.catalog import Allocation, GraphDescriptor

    keep = tuple(g for g in SPEC.graphs if g.kind.is_prefill)
    narrow = (
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            1,
            token_capacity=1,
            target_capacity=1,
            allocation=Allocation.QUERY_LENGTH,
            duration_ms=3.6,
        ),
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            1,
            token_capacity=8,
            proposal_depth=7,
            target_capacity=4,
            allocation=Allocation.PREFIX_LIMIT,
            duration_ms=4.0,
        ),
    )
    return dataclasses.replace(SPEC, name="narrow-device", graphs=keep + narrow)


@spec("planning-queue/queued-lane-bound", "planning-queue/limits-use-bound")
def test_a_queued_device_lane_advances_by_at_most_p():
    """Ceiling 8 (D + 1 = W = 8) but P = 4 rows: the queued lane can commit at most 4 tokens, so
    the projected output and context limits drop by 4, not 8."""
    s, (h,), t, fence = _decoding(_narrow_device_catalog(), max_output=100)
    req = s.requests[h.rid]
    req.acceptance.estimates[SOURCE_LEARNED] = PrefixEstimate(
        np.full(7, 0.95), np.full(7, 64.0), len(req.output)
    )
    plan = s.plan()
    lane = plan.lanes[0]
    assert plan.graph.target_capacity == 4 and lane.ceiling == 8
    s.commit(plan, fence)
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.output_remaining == 100 - len(req.output) - 4
    assert view.context_remaining == s.max_model_len - (req.cursor + 4)
    assert plan.max_advance(lane) == 4


def _two_lane_device_catalog():
    """SPEC's prefill programs, a B=2 width-one program and a B=2, W=4, D=3 device-allocated
    program with P = 5 rows (fewer than B x W = 8)."""
    import dataclasses

    from helios_jax.catalog import Allocation, GraphDescriptor

    graphs = tuple(g for g in SPEC.graphs if g.kind.is_prefill) + (
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            2,
            token_capacity=1,
            target_capacity=2,
            allocation=Allocation.QUERY_LENGTH,
            duration_ms=3.6,
        ),
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            2,
            token_capacity=4,
            proposal_depth=3,
            target_capacity=5,
            allocation=Allocation.PREFIX_LIMIT,
            duration_ms=4.0,
        ),
    )
    return dataclasses.replace(SPEC, name="two-lane-device", graphs=graphs)


@spec("speculative-coverage/frontier-ties", "speculative-coverage/prefix-limit-ceilings")
def test_device_plans_order_lanes_by_slot_so_ties_go_where_the_host_priced_them():
    """After slot reuse request ids and slots disagree (rid 1 in slot 1, rid 2 in slot 0). Equal
    confidence forecasts tie at every frontier; the device gives ties to the lower lane
    position, the spec to the lower original slot. Plan lanes come in slot order, and the rows
    the host priced each lane with (its expected tokens) are the rows the device allocates."""
    from helios_jax.catalog import Allocation
    from helios_jax.scheduler.rounds import allocate_prefix_rows

    s = scheduler(_two_lane_device_catalog())
    first = s.admit([1] * 8, max_output=500)
    s.admit([1] * 8, max_output=500)
    s.cancel(first)
    s.admit([1] * 8, max_output=500)
    t, fence = 0.0, 1
    while any(r.phase.value != "decode" for r in s.requests.values()):
        _, _, t = run_once(s, fence, t)
        fence += 1
    survival = np.array([0.9, 0.8, 0.7])
    for r in s.requests.values():
        r.acceptance.estimates[SOURCE_LEARNED] = PrefixEstimate(
            survival.copy(), np.full(3, 64.0), len(r.output)
        )
        r.forecast = PrefixEstimate(np.array([0.5, 0.25, 0.125]), np.full(3, 64.0), len(r.output))
    assert sorted((r.rid, r.slot) for r in s.requests.values()) == [(1, 1), (2, 0)]
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.allocation is Allocation.PREFIX_LIMIT
    assert [lane.slot for lane in plan.lanes] == sorted(lane.slot for lane in plan.lanes)
    joint = np.tile([0.5, 0.25, 0.125], (len(plan.lanes), 1))
    rows = allocate_prefix_rows(
        joint, [lane.ceiling for lane in plan.lanes], [True] * len(plan.lanes), plan.graph.target_capacity
    )
    for lane, r in zip(plan.lanes, rows):
        assert lane.expected_tokens == pytest.approx(1 + survival[: r - 1].sum())


@spec("prerequisites/sequence-score", "prerequisites/continuation-value", "useful-service/delivery-price")
def test_a_stream_blocked_before_decoding_keeps_its_delivery_price():
    """With retention on, a prompt ending at its anchor snapshots before decoding: the stream
    is blocked behind SNAPSHOT and enables DECODE. It counts in K and in the waiting cost, so it
    keeps its delivery coordinate: price g/z from its first published burst (one delivery over
    that frame: z = 1/T)."""
    s = scheduler(SPEC, checkpoints=True)
    h = s.admit([1] * 64, max_output=50, message_endpoints=[64])
    plan, gen, t = run_once(s, 1, 0.0)
    req = s.requests[h.rid]
    assert req.phase.value == "blocked" and req.enables.value == "decode"
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.delivery_bearing
    assert math.exp(view.log_delivery_price) == pytest.approx(
        s.policy.delivery_fairness * plan.expected_duration_ms
    )


@spec("prerequisites/sequence-score")
def test_a_blocked_stream_without_delivery_history_is_priced_at_the_feasible_share():
    """A stream blocked before decoding with no published burst yet gets the decoders' missing
    delivery price g * sigma(K) with K counting it (one stream: the width-one B=1 program)."""
    s = scheduler(SPEC, checkpoints=True)
    h = s.admit([1] * 64, max_output=50, message_endpoints=[64])
    run_once(s, 1, 0.0, publish=False)
    req = s.requests[h.rid]
    assert req.phase.value == "blocked" and req.history.log_z is None
    view = next(v for v in s.views() if v.rid == h.rid)
    sigma = min(
        g.duration_ms / min(g.batch_capacity, 1)
        for g in SPEC.eligible(DecodeMode.ADAPTIVE)
        if g.kind.is_generation
    )
    assert math.exp(view.log_delivery_price) == pytest.approx(s.policy.delivery_fairness * sigma)


@spec("useful-service/prefill-logical-limits")
def test_lookahead_prices_only_the_chunk_the_real_prefill_may_take():
    """A request blocked behind INITIALIZE whose anchor (its last message end, 100 of 300
    tokens) is a capture stop: its view carries the stop, and the INITIALIZE -> PREFILL sequence
    prices a chunk of at most 100 tokens, the work that prefill can really do."""
    s = scheduler(SPEC, checkpoints=True, initialize_requests=True)
    h = s.admit([1] * 300, max_output=50, message_endpoints=[100])
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.phase.value == "blocked" and view.prompt_limit == 100 and view.endpoint == 100
    plan = s.plan()
    assert plan.kind is GraphKind.INITIALIZE and plan.following is not None
    prompt_lanes = [lane for lane in plan.following.lanes if lane.role is LaneRole.PROMPT]
    assert prompt_lanes and all(lane.prompt_tokens <= 100 for lane in prompt_lanes)


@spec("useful-service/conditional-acceptance")
def test_grammar_and_stop_restrictions_bound_each_lane():
    """A request restricted to two target rows a round (say a stop string matched up to its last
    token) gets at most two rows in every candidate, priced at E(2); lifting the restriction
    lets it use the program's width again."""
    from helios_jax.scheduler import policy

    s, (h, other), t, fence = _decoding(n=2)
    for r in s.requests.values():
        r.acceptance.estimates[SOURCE_LEARNED] = PrefixEstimate(
            np.full(7, 0.95), np.full(7, 64.0), len(r.output)
        )
    s.restrict_width(h, 2)
    inp = policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
    widest = 1
    for c in policy.candidates(inp):
        for lane in c.lanes:
            rows = max(lane.query_length, lane.ceiling)
            if lane.rid == h.rid and lane.role is LaneRole.DECODE:
                assert rows <= 2 and lane.expected_tokens <= 1.95 + 1e-9
            elif lane.role is LaneRole.DECODE:
                widest = max(widest, rows)
    assert widest == 8
    s.restrict_width(h, None)
    inp = policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
    assert any(
        lane.rid == h.rid and max(lane.query_length, lane.ceiling) == 8
        for c in policy.candidates(inp)
        for lane in c.lanes
    )
    with pytest.raises(ValueError):
        s.restrict_width(h, 0)
    with pytest.raises(ValueError):
        scheduler(SPEC).admit([1] * 8, max_output=5, width_limit=0)


@spec("acceptance-learning/probe-can-beat", "acceptance-learning/rank-gain-rate")
def test_probes_are_scored_on_the_ordinary_decisions_scale():
    """A probe must beat the ordinary choice on the same scale: its score is the score the full
    selector gives that program and cohort under the optimistic estimates (sigma from every
    loaded program, width one included), and its gain per ms is measured against it. Here the
    width-one programs set sigma; the drafted programs alone would give a larger one."""
    import dataclasses

    from helios_jax.scheduler import learning, policy, utility

    from .helpers import decoder, inputs

    views = [decoder(i, survival=np.full(7, 0.05), age_ms=40.0 + 10 * i) for i in range(3)]
    inp = inputs(views)
    ordinary = policy.select(inp)
    assert max(max(lane.query_length, lane.ceiling) for lane in ordinary.lanes) == 1
    optimistic = [dataclasses.replace(v, survival=np.full(7, 0.9)) for v in views]
    probe = learning.probe(inp, ordinary, optimistic, lambda rid, a, b: 2.0)
    assert probe is not None
    full = {
        (r.graph, r.build().lanes): r.score for r in policy.scored(dataclasses.replace(inp, views=optimistic))
    }
    assert probe.score == pytest.approx(full[(probe.graph, probe.lanes)], rel=1e-12)
    prepared = policy.PreparedGraphs(inp.graphs)
    k = len(views)
    assert utility.reference_interval(k, prepared.drafted().delivery, inp.costs) > utility.reference_interval(
        k, prepared.delivery, inp.costs
    )


@spec("prerequisites/all-shape-pairs", "prerequisites/pair-exact", "prerequisites/one-newly-ready")
def test_best_ragged_pair_equals_enumeration():
    """The exact two-stage cohort for a host-allocated ragged follower (B and P bind), against
    every subset: at least one newly ready row, at most the prerequisite's batch of them, the
    prerequisite's other rows to the best terminal rows."""
    import itertools

    from helios_jax.scheduler import utility

    rng = np.random.default_rng(5)
    for _ in range(150):
        n_new, n_ready, n_term = rng.integers(1, 4), rng.integers(0, 4), rng.integers(0, 3)
        new_v, ready_v = rng.uniform(0, 10, n_new), rng.uniform(0, 10, n_ready)
        new_w, ready_w = rng.integers(1, 5, n_new), rng.integers(1, 5, n_ready)
        term = rng.uniform(0, 10, n_term)
        b1, b2, rows = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 10))
        best = None
        items = [("n", i) for i in range(n_new)] + [("r", i) for i in range(n_ready)]
        for size in range(1, b2 + 1):
            for cohort in itertools.combinations(items, size):
                k = sum(1 for g, _ in cohort if g == "n")
                weight = sum((new_w if g == "n" else ready_w)[i] for g, i in cohort)
                if not 1 <= k <= b1 or weight > rows:
                    continue
                value = sum((new_v if g == "n" else ready_v)[i] for g, i in cohort)
                value += np.sort(term)[::-1][: b1 - k].sum()
                best = value if best is None else max(best, value)
        got = utility.best_ragged_pair(new_v, new_w, ready_v, ready_w, term, b1, b2, rows)
        if best is None:
            assert got is None
            continue
        total, ni, ri, jt = got
        assert total == pytest.approx(best)
        assert 1 <= len(ni) <= b1 and len(ni) + len(ri) <= b2 and jt == min(b1 - len(ni), n_term)
        assert new_w[ni].sum() + ready_w[ri].sum() <= rows
        assert new_v[ni].sum() + ready_v[ri].sum() + np.sort(term)[::-1][:jt].sum() == pytest.approx(total)


@spec("prerequisites/all-shape-pairs")
def test_ragged_speculative_programs_follow_a_prerequisite():
    """Streams blocked behind RESTORE (enabling decode): the pair search offers every
    generation program as the following program, device-allocated ragged ones included."""
    import dataclasses

    from helios_jax.catalog import Allocation
    from helios_jax.scheduler import policy
    from helios_jax.scheduler.view import Phase

    from .helpers import decoder, inputs

    blocked = [
        dataclasses.replace(
            decoder(i, survival=np.full(7, 0.9)),
            phase=Phase.BLOCKED,
            prerequisites=(GraphKind.RESTORE,),
            enables=Phase.DECODE,
        )
        for i in range(2)
    ]
    ready = [decoder(10 + i, survival=np.full(7, 0.9)) for i in range(14)]
    cands = policy.candidates(inputs(blocked + ready))
    followers = {c.following.graph for c in cands if c.following is not None}
    ragged = [
        g
        for g in followers
        if g.kind is GraphKind.SPECULATIVE and not g.is_rectangular and g.token_capacity > 1
    ]
    assert any(g.allocation is Allocation.PREFIX_LIMIT for g in ragged)
    for c in cands:
        if c.following is not None and c.following.graph in ragged:
            lanes = c.following.lanes
            assert len(lanes) <= c.following.graph.batch_capacity
            assert any(lane.rid < 10 for lane in lanes)  # at least one newly ready row
            assert all(1 <= lane.ceiling <= 8 and lane.query_length == 0 for lane in lanes)


@spec("prerequisites/all-shape-pairs", "intro/native-catalog-kinds")
def test_a_scored_prompt_behind_initialize_gets_a_plan():
    """A request that needs prompt scores (echo + logprobs) behind INITIALIZE: the pair search
    pairs INITIALIZE with scored prefill, so an idle scheduler plans it (and runs it through)."""
    s = scheduler(SPEC, initialize_requests=True)
    h = s.admit([1] * 40, max_output=3, needs_scores=True)
    plan = s.plan()
    assert plan is not None and plan.kind is GraphKind.INITIALIZE
    assert plan.following.graph.kind is GraphKind.SCORED_PREFILL
    t, fence = 0.0, 1
    kinds = []
    while h.rid in s.requests:
        p, _, t = run_once(s, fence, t)
        kinds.append(p.kind)
        fence += 1
    assert kinds[:2] == [GraphKind.INITIALIZE, GraphKind.SCORED_PREFILL]


@spec(
    "speculative-coverage/prices-rank-cohorts",
    "speculative-coverage/ceiling-bound",
    "speculative-coverage/ceilings-over-p",
    "speculative-coverage/price-full-program",
)
def test_lane_ceilings_carry_prices_to_the_device_allocation():
    """Equal survival (0.9, 0.8, 0.7) and equal forecasts (0.9, 0.81, 0.729), P = 5 rows for
    two lanes. Rid 0 is behind (x = 0.5: output price 64 + 16/0.5 = 96), rid 1 ahead (x = 4:
    68). The device splits tied forecasts by slot: rows 0.9 (rid 0), 0.9 (rid 1), 0.81 (rid 0)
    -> [3, 2]. A price-aware frontier ranks 96 * (0.9, 0.81, 0.729) = 86.4, 77.8, 70.0 all
    above rid 1's 68 * 0.9 = 61.2 -> [4, 1]: rid 1 gets fewer rows there than from the device,
    so its ceiling drops to 1 and the device gives rid 0 its full width: [4, 1]. With equal
    prices both rankings agree and the ceilings stay maximal, min(D + 1, W, request limit) = 4
    each, summing above P."""
    from helios_jax.scheduler import policy

    from .helpers import decoder, inputs

    survival, forecast = np.array([0.9, 0.8, 0.7]), np.array([0.9, 0.81, 0.729])
    cat = _two_lane_device_catalog()
    behind = [
        decoder(0, x=0.5, survival=survival, forecast=forecast),
        decoder(1, x=4.0, survival=survival, forecast=forecast),
    ]
    best = max(
        (c for c in policy.candidates(inputs(behind, catalog=cat)) if c.graph.target_capacity == 5),
        key=lambda c: c.score,
    )
    assert {lane.rid: lane.ceiling for lane in best.lanes} == {0: 4, 1: 1}
    assert {lane.rid: lane.expected_tokens for lane in best.lanes} == pytest.approx({0: 1 + 2.4, 1: 1.0})
    equal = [
        decoder(0, x=2.0, survival=survival, forecast=forecast),
        decoder(1, x=2.0, survival=survival, forecast=forecast),
    ]
    best = max(
        (c for c in policy.candidates(inputs(equal, catalog=cat)) if c.graph.target_capacity == 5),
        key=lambda c: c.score,
    )
    assert [lane.ceiling for lane in best.lanes] == [4, 4]
    assert [lane.expected_tokens for lane in best.lanes] == pytest.approx([2.7, 1.9])


@spec("confidence-acceptance/prior-init", "confidence-acceptance/ordinary-means")
def test_thin_evidence_is_read_from_the_pooled_population_estimate():
    """Two requests start from the prior 0.5**d (weight 2). Only rid 0 is served, a width-four
    round accepting all three proposals. The pool of completed observations moves each depth to
    (2 * 0.5**d + 1) / 3. Rid 0's own mean moves to the same value, all its starting share
    (2/3) now read at the pool: (2/3) * pool + 1/3. Rid 1 has no evidence of its own, so
    selection prices it at the pool, not at the prior it was admitted with; the stored estimate
    keeps the spec's arithmetic."""
    from helios_jax.scheduler.speculation import initial_prior

    s = scheduler(SPEC)
    served = s.admit([1] * 8, max_output=500)
    idle = s.admit([1] * 8, max_output=500)
    t, fence = 0.0, 1
    while any(r.phase.value != "decode" for r in s.requests.values()):
        _, _, t = run_once(s, fence, t)
        fence += 1
    tokens = len(s.requests[served.rid].output)
    for r in s.requests.values():  # restart both at the prior, aged to now
        r.acceptance.estimates[SOURCE_LEARNED] = PrefixEstimate.from_prior(initial_prior(7), len(r.output))
    s.population.acceptance_pools[SOURCE_LEARNED] = PrefixEstimate.from_prior(initial_prior(7))
    req = s.requests[served.rid]
    from helios_jax.scheduler.speculation import acceptance_observations

    obs = acceptance_observations(7, offered=3, accepted=3)
    req.acceptance.get(SOURCE_LEARNED).observe(obs, tokens)
    s.population.acceptance_pools[SOURCE_LEARNED].observe(obs, 0)
    prior = initial_prior(7)
    pool = prior.copy()
    pool[:3] = (2 * prior[:3] + 1) / 3
    views = {v.rid: v for v in s.views()}
    np.testing.assert_allclose(views[idle.rid].survival, pool)
    own = prior.copy()
    own[:3] = 2 / 3 * pool[:3] + 1 / 3
    np.testing.assert_allclose(views[served.rid].survival, own)
    np.testing.assert_allclose(s.requests[idle.rid].acceptance.get(SOURCE_LEARNED).mean, prior)


@spec("useful-service/prefill-price", "useful-service/output-price", "service-accounting/committed-diffs")
def test_the_token_rate_counts_output_tokens():
    """x is the request's output-token rate (docs/scheduling-utility.md): a 5000-token prompt's
    first 4096-token chunk leaves its token history missing (priced at the decaying feasible
    share); the chunk that finishes it starts the history with its one output token."""
    from .helpers import ORDINARY

    s = scheduler(ORDINARY)
    h = s.admit([1] * 5000, max_output=8)
    req = s.requests[h.rid]
    plan, _, t = run_once(s, 1, 0.0)
    assert plan.lanes[0].prompt_tokens == 4096 and not plan.lanes[0].finishes_prompt
    assert req.history.log_x is None
    # the missing rate when the finishing chunk is committed, at t: its history starts there
    known = service.resident_rates(s.requests, {req.rid: req.history})
    start = service.missing_rate(req, int(t * MS), s._normalizers(), known, s.policy)
    plan, gen, t2 = run_once(s, 2, t)
    assert plan.lanes[0].finishes_prompt and gen[0].tokens
    dt = t2 - t
    a = math.exp(-dt / s.policy.adaptation_ms)
    assert math.exp(req.history.log_x) == pytest.approx(a * math.exp(start) + (1 - a) * 1 / dt)
