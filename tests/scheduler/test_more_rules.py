"""Remaining scheduler rules: deadlines, idle staleness, probe ties, skipped copies, mixed
followers, copy proposals, per-shape expiry, concurrent mixed workloads, throughput bursts."""

import dataclasses

import numpy as np
import pytest

from helios_jax import simulation as sim
from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import learning, policy
from helios_jax.scheduler.checkpoints import Role
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.speculation import SOURCE_COPY
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, SPEC, choose, decoder, geometric, inputs, measured, prompt
from .test_core import records, run_once, scheduler, timing
from .test_prerequisites import blocked

spec = pytest.mark.spec
MS = NS_PER_MS
ORD = dict(catalog=ORDINARY, mode=DecodeMode.ORDINARY)


@spec("useful-service/no-fixed-deadline")
def test_age_never_makes_an_operation_mandatory():
    """A decoder ten seconds old still loses to a prompt whose value rate is higher."""
    views = [decoder(1, age_ms=10_000.0, x=50.0, z=5.0), prompt(2, 2048, log_x=-8.0)]
    assert choose(views, **ORD).kind is not GraphKind.DECODE


@spec("timing-refresh/idle-stale-forever")
def test_short_busy_periods_separated_by_idle_never_fund_a_refresh():
    s = scheduler()
    t = 0.0
    fence = 0
    for _burst in range(8):  # each burst earns far less than 5 ms of refresh credit, then idles
        h = s.admit([1] * 8, max_output=3)
        while h.rid in s.requests:
            fence += 1
            _, _, t = run_once(s, fence, t)
        t += 5_000.0
        s.advance_to(int(t * MS))  # idle: positive credit is discarded
        assert s.timing_ledger.balance_ms <= 0
    assert t > 31_000 and s.executions["timing_refresh"] == 0
    assert any(s.costs.is_stale(g.key, int(t * MS)) for g in ORDINARY.graphs)


@spec("acceptance-learning/tie-order")
def test_equal_probe_gains_prefer_the_least_informed_prefix():
    """Two probes with equal optimistic gain: W=4 and W=8 measured alike (5 ms) and survival zero
    beyond depth 3, so both add the same expected output. The least-informed added prefix wins."""
    from helios_jax.scheduler.cost import CostModel

    w1 = next(
        g
        for g in SPEC.graphs
        if g.kind is GraphKind.SPECULATIVE and g.batch_capacity == 1 and g.token_capacity == 1
    )
    w4, w8 = (
        next(
            g
            for g in SPEC.graphs
            if g.kind is GraphKind.SPECULATIVE and g.batch_capacity == 1 and g.token_capacity == w
        )
        for w in (4, 8)
    )
    costs = CostModel()
    costs.observe(w1.key, [3.0e6], 0)
    for g in (w4, w8):
        costs.observe(g.key, [5.0e6], 0)
    view = decoder(1, survival=np.full(7, 0.02))
    view = dataclasses.replace(view, optimistic=np.array([0.95, 0.95, 0.95, 0, 0, 0, 0]))
    inp = policy.SelectionInput([view], [w1, w4, w8], costs, 0, PolicyConfig(), DecodeMode.ADAPTIVE)
    ordinary = policy.select(inp)
    assert ordinary.graph == w1
    opt = [dataclasses.replace(view, survival=view.optimistic)]

    def deeper_unknown(rid, a, b):
        return 2.0 if b > 4 else 40.0

    assert learning.probe(inp, ordinary, opt, deeper_unknown).graph == w8

    def deeper_known(rid, a, b):
        return 40.0 if b > 4 else 2.0

    assert learning.probe(inp, ordinary, opt, deeper_known).graph == w4


@spec("planning-queue/expired-copy-skip")
def test_an_expired_extra_copy_is_skipped_after_its_split():
    s = Scheduler(SPEC, checkpoints=True)
    s.seed_costs(0)
    endpoints = [600, 1800, 4000]
    h = s.admit(list(range(1, 6001)), max_output=4, message_endpoints=endpoints)
    req = s.requests[h.rid]
    extras = [e for e, r in req.capture.endpoints if r is Role.EXTRA]
    assert extras, req.capture.endpoints
    t = 31_000.0  # every snapshot estimate is stale now (the prefill ones refresh as they run)
    fence = 0
    while req.consumed < extras[0] or req.phase is Phase.BLOCKED:
        fence += 1
        s.advance_to(int(t * MS))
        plan = s.plan()
        s.commit(plan, fence)
        t += plan.expected_duration_ms
        s.advance_to(int(t * MS))
        s.complete(fence, records(plan), timing(plan.expected_duration_ms))
        if req.consumed == extras[0]:
            break
    assert req.consumed == extras[0] and req.phase is Phase.PREFILL and req.capture.row is None


@spec("mixed-execution/prereq-cases")
def test_mixed_followers_take_the_prompt_absent_ready_or_enabled():
    def mixed_followers(views):
        return [
            c
            for c in policy.candidates(inputs(views, **ORD))
            if c.following is not None and c.following.kind is GraphKind.MIXED
        ]

    def prompt_row(c):
        return next((lane.rid for lane in c.following.lanes if lane.role is LaneRole.PROMPT), None)

    # the prompt row is the request the prerequisite enables
    enabled = mixed_followers(
        [blocked(1, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=40, x=0.3), decoder(2)]
    )
    assert {prompt_row(c) for c in enabled} == {1}
    # an already ready prompt row beside a decoder the prerequisite enables
    ready = mixed_followers([blocked(5, [GraphKind.RESTORE], Phase.DECODE), prompt(4, 40, x=0.5), decoder(2)])
    assert 4 in {prompt_row(c) for c in ready}
    assert all(5 in c.following.rids for c in ready)  # at least one newly ready row
    # no prompt row at all
    absent = mixed_followers([blocked(5, [GraphKind.RESTORE], Phase.DECODE), decoder(2)])
    assert absent and all(c.following.prefill_row is None for c in absent)


@spec("speculative-coverage/copy-no-draws", "confidence-acceptance/per-source")
def test_copy_proposals_learn_separately_and_draw_nothing():
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=50, proposal_source=SOURCE_COPY)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t, accepted=2)
    req = s.requests[h.rid]
    assert s.speculative["drafts_offered"] > 0 and s.speculative["learned_drafts"] == 0
    assert req.acceptance.get(SOURCE_COPY).weight.max() > 2  # observed under its own source


@spec("verification/mixed-shape-expiry")
def test_mixed_shapes_expire_independently():
    costs = measured(ORDINARY)
    later = PolicyConfig().estimate_ttl_ns + 1
    mixed = ORDINARY.of_kind(GraphKind.MIXED)
    costs.observe(mixed[3].key, [mixed[3].duration_ms * 1e6], later)
    assert not costs.is_stale(mixed[3].key, later)
    assert all(costs.is_stale(g.key, later) for g in mixed if g is not mixed[3])
    c = policy.select(inputs([prompt(1, 40, x=0.3), decoder(2)], costs=costs, now_ns=later, **ORD))
    assert c.kind is GraphKind.MIXED  # stale shapes keep ranking by their measured costs


@spec("verification/mixed-concurrent")
def test_concurrent_prompt_and_decode_workload_on_mixed_graphs():
    result = sim.run(
        sim.SimConfig(
            ORDINARY,
            scenario="poisson",
            requests=40,
            prompt_tokens=[40, 200, 900],
            output_tokens=[20, 60],
            accepted_drafts=0,
            arrival_rate_per_s=60.0,
            seed=5,
        )
    )
    assert all(r.finished_ms is not None for r in result.requests)
    assert result.selections.get("mixed", 0) > 0 and result.selections.get("decode", 0) > 0


@spec("policy/throughput-bursts", "policy/throughput-preset")
@pytest.mark.parametrize("acceptance", [0.32, 0.35])
def test_throughput_policy_takes_longer_bursts(acceptance):
    """Sixteen decoders near the width-one/width-four break-even (token rates 3.95 vs about 4.0 per
    ms): throughput, valuing tokens alone, takes the four-row bursts; balanced, also pricing
    deliveries and output age, keeps the faster width-one cadence."""

    def width(name):
        pc = PolicyConfig.preset(name)
        views = [decoder(i, survival=geometric(acceptance), policy_config=pc) for i in range(16)]
        return choose(views, policy_config=pc).graph.token_capacity

    assert (width("throughput"), width("balanced")) == (4, 1)


@spec("acceptance-learning/probe-future-output")
@pytest.mark.parametrize("remaining, probe_width", [(100, 8), (8, 4), (5, 4), (4, None)])
def test_a_probe_leaves_output_in_which_to_use_its_observation(remaining, probe_width):
    """W=1 (3 ms), W=4 and W=8 (5 ms each), survival 0.02 (the ordinary choice is W=1) and an
    optimistic 0.95 at every depth: W=8 has the larger optimistic gain. A probe may only offer
    rows that leave output after them: with 8 tokens left W=8 (8 rows) would use them all, so W=4
    probes; with 4 left neither does."""
    from helios_jax.scheduler.cost import CostModel

    w1, w4, w8 = (
        next(
            g
            for g in SPEC.graphs
            if g.kind is GraphKind.SPECULATIVE and g.batch_capacity == 1 and g.token_capacity == w
        )
        for w in (1, 4, 8)
    )
    costs = CostModel()
    costs.observe(w1.key, [3.0e6], 0)
    for g in (w4, w8):
        costs.observe(g.key, [5.0e6], 0)
    view = decoder(1, survival=np.full(7, 0.02), output_remaining=remaining)
    view = dataclasses.replace(view, optimistic=np.full(7, 0.95))
    inp = policy.SelectionInput([view], [w1, w4, w8], costs, 0, PolicyConfig(), DecodeMode.ADAPTIVE)
    ordinary = policy.select(inp)
    assert ordinary.graph == w1
    opt = [dataclasses.replace(view, survival=view.optimistic)]
    probe = learning.probe(inp, ordinary, opt, lambda rid, a, b: 2.0)
    if probe_width is None:
        assert probe is None
    else:
        assert probe.graph.token_capacity == probe_width and probe.lanes[0].query_length == probe_width
