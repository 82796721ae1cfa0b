"""Prerequisites, two-stage sequences, continuations and terminal snapshots in selection."""

import dataclasses
import itertools
import math

import numpy as np
import pytest

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference import cohorts
from helios_jax.reference.prefix_allocation import prefix_allocation_naive
from helios_jax.scheduler import policy
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole, Phase, RequestView

from .helpers import ORDINARY, POLICY, RAGGED, SPEC, choose, decoder, geometric, inputs, measured, prompt

spec = pytest.mark.spec
ORD = dict(catalog=ORDINARY, mode=DecodeMode.ORDINARY)


def blocked(rid, prerequisites, enables, **kw):
    base = decoder(rid, **kw) if enables is Phase.DECODE else prompt(rid, kw.pop("tokens", 64), **kw)
    return dataclasses.replace(base, phase=Phase.BLOCKED, prerequisites=tuple(prerequisites), enables=enables)


def terminal(rid, age_ms=0.0, **kw):
    return RequestView(rid=rid, slot=kw.pop("slot", rid), phase=Phase.TERMINAL, terminal_age_ms=age_ms, **kw)


def with_graphs(extra, catalog=ORDINARY, mode=DecodeMode.ORDINARY, views=(), costs=None, **kw):
    graphs = tuple(catalog.eligible(mode)) + tuple(extra)
    costs = costs or measured(catalog)
    for g in extra:
        if g.duration_ms:
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    return policy.SelectionInput(list(views), graphs, costs, 0, kw.pop("policy_config", POLICY), mode)


@spec(
    "prerequisites/all-shape-pairs",
    "prerequisites/joint-cohorts",
    "prerequisites/following-ready",
    "prerequisites/sequence-score",
    "prerequisites/age-reset-following",
    "prerequisites/plan-duration-t",
    "prerequisites/lookahead-not-timing",
    "prerequisites/first-only-executes",
    "useful-service/multistage-reference",
    "prerequisites/enabling-kinds",
)
def test_restore_then_shared_decode_by_hand():
    """A restoring stream (blocked) and a ready decoder, x = 2, z = 0.25, A = 10 ms each.

    K = 2, sigma = 2 * 3.562/2 = 3.562 ms. Restore (0.35 ms) then decode B=2 (3.562 ms): U = 3.912.
    New row 88 + 0.1*U*(10 + U) = 93.4424 (its own future-delivery reference U); ready row
    88 + 0.1*3.562*(10 + U) = 92.9555. Score (186.398)/3.912 - 3.912/2*0.2 = 47.2565.
    """
    c = choose([blocked(1, [GraphKind.RESTORE], Phase.DECODE), decoder(2)], **ORD)
    assert c.kind is GraphKind.RESTORE and c.duration_ms == pytest.approx(0.35)  # the plan keeps T
    assert c.sequence_ms == pytest.approx(3.912)
    assert c.score * math.exp(c.log_scale) == pytest.approx(47.25651, rel=1e-5)
    assert [lane.role for lane in c.lanes] == [LaneRole.PREREQUISITE]
    assert c.following.graph.batch_capacity == 2 and sorted(c.following.rids) == [1, 2]


@spec("prerequisites/free-unused-capacity", "prerequisites/tie-more-requests")
def test_unused_prerequisite_capacity_advances_more_rows():
    """Six streams blocked behind initialization, an extra INITIALIZE B=4 as fast as B=1 (0.2 ms).

    The pair (initialize, prefill 64) feeds one request to the prefill; B=4 advances three more
    rows in its unused capacity at no extra cost, so its value rate equals B=1's exactly and the
    tie goes to advancing more requests. It never takes more rows than its capacity.
    """
    init4 = GraphDescriptor(GraphKind.INITIALIZE, 4, duration_ms=0.2)
    views = [
        blocked(i, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=64, last_selected_ns=i) for i in range(6)
    ]
    inp = with_graphs([init4], views=views)
    pairs = {
        c.graph.batch_capacity: c
        for c in policy.candidates(inp)
        if c.following is not None and c.following.graph.name == "prefill[B=1,W=64,D=0,C=0,P=0]"
    }
    one, four = pairs[1], pairs[4]
    assert four.score == one.score and len(one.lanes) == 1
    assert [lane.rid for lane in four.lanes] == [0, 1, 2, 3] and four.following.rids == (0,)
    assert all(lane.role is LaneRole.PREREQUISITE for lane in four.lanes)
    c = policy.select(inp)
    assert c.graph.batch_capacity == 4 and len(c.lanes) == 4  # one feeds the prefill, three ride free
    assert c.following.kind is GraphKind.PREFILL


@spec("prerequisites/free-unused-capacity")
def test_a_terminal_snapshot_advances_blocked_rows_in_its_unused_rows():
    """Snapshot B=4 retiring one terminal row also snapshots three of the five streams blocked
    behind a window snapshot, for the same score as retiring the terminal row alone."""
    views = [terminal(0, age_ms=5.0)] + [
        blocked(i, [GraphKind.SNAPSHOT], Phase.PREFILL, tokens=64) for i in range(1, 6)
    ]
    snap = next(
        c
        for c in policy.candidates(inputs(views, **ORD))
        if c.graph.batch_capacity == 4 and c.following is None and c.lanes[0].role is LaneRole.TERMINAL
    )
    assert [(lane.rid, lane.role) for lane in snap.lanes] == [(0, LaneRole.TERMINAL)] + [
        (i, LaneRole.PREREQUISITE) for i in (1, 2, 3)
    ]
    # (256 + 1*0.3*(5 + 0.5)) / 0.5 - 0.5/2*1: the free rows add neither value nor cost
    assert snap.score * math.exp(snap.log_scale) == pytest.approx((256 + 0.3 * 5.5) / 0.5 - 0.25)


@spec("prerequisites/first-finishes-terminal")
def test_window_snapshot_also_retires_terminal_rows():
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), terminal(2, age_ms=5.0), decoder(3)]
    cands = [c for c in policy.candidates(inputs(views, **ORD)) if c.following is not None]
    shared = [c for c in cands if c.graph.batch_capacity == 4]
    assert shared and {lane.role for lane in shared[0].lanes} == {LaneRole.PREREQUISITE, LaneRole.TERMINAL}


@spec(
    "prerequisites/terminal-age-stops",
    "prerequisites/terminal-two-stage",
    "useful-service/multistage-reference",
)
def test_terminal_row_of_a_two_stage_sequence_by_hand():
    """A stream behind a window snapshot (x = 2, z = 0.25, A = 10), a terminal row aged 5 ms and a
    ready decoder like the first; ordinary catalog.

    Snapshot B=4 (T = 0.5) takes the blocked row and the terminal row; decode B=2 (F = 3.562)
    follows with the newly ready and the ready decoder: U = T + F = 4.062 ms. K = 2, so the
    decoders' sigma = 2 * 3.562/2 = 3.562; the terminal family's sigma = 0.3 (snapshot B=1).
    - newly ready decoder, its own future-delivery reference U: 88 + 0.1*U*(10 + U)
    - ready decoder: 88 + 0.1*3.562*(10 + U)
    - terminal row, retired at T: 256 + 1*0.3*(5 + T), plus the waiting cost it no longer accrues
      over the rest of the sequence, 1*(5*F + (U**2 - T**2)/2)
    Score: their sum / U - U/2 * (0.1 + 0.1 + 1) = 113.344627.
    """
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), terminal(2, age_ms=5.0), decoder(3)]
    c = next(
        c
        for c in policy.candidates(inputs(views, **ORD))
        if c.graph.batch_capacity == 4
        and c.following is not None
        and c.following.graph.name == "decode[B=2,W=1,D=0,C=0,P=2]"
    )
    t, f = 0.5, 3.562
    u = t + f
    new = 88 + 0.1 * u * (10 + u)
    ready = 88 + 0.1 * 3.562 * (10 + u)
    retired = 256 + 0.3 * (5 + t) + (5 * f + (u * u - t * t) / 2)
    scale = math.exp(c.log_scale)
    assert c.sequence_ms == pytest.approx(u) and c.duration_ms == pytest.approx(t)
    assert [(lane.rid, lane.role) for lane in c.lanes] == [(1, LaneRole.PREREQUISITE), (2, LaneRole.TERMINAL)]
    assert c.lanes[1].value * scale == pytest.approx(retired)
    assert {lane.rid: lane.value * scale for lane in c.following.lanes} == pytest.approx({1: new, 3: ready})
    assert c.score * scale == pytest.approx((new + ready + retired) / u - u / 2 * 1.2)
    assert c.score * scale == pytest.approx(113.344627, rel=1e-7)


def _sequence_score(snapshot_ms):
    """Snapshot, then decode B=4 (3.624 ms) of all three streams, by hand. K = 3, so sigma =
    3 * 3.624/3 (decode B=4 is the fastest per stream); U = snapshot + 3.624 ms. The newly ready
    stream is priced with its own reference U: 88 + 0.1*U*(10 + U); each ready decoder
    88 + 0.1*3.624*(10 + U). Score: sum / U - U/2 * 0.3."""
    u = snapshot_ms + 3.624
    return (88 + 0.1 * u * (10 + u) + 2 * (88 + 0.1 * 3.624 * (10 + u))) / u - u / 2 * 0.3


# Decode B=2 of the two ready decoders, 3.562 ms: 2*(88 + 0.1*3.624*(10 + 3.562))/3.562 - 3.562/2*0.3.
SHARED_DECODE_ALTERNATIVE = 2 * (88 + 0.1 * 3.624 * 13.562) / 3.562 - 3.562 / 2 * 0.3  # 51.635755


@spec("verification/snapshot-cost-sweep")
@pytest.mark.parametrize(
    "snapshot_ms, shared_wins", [(0.3, True), (1.73, True), (1.83, False), (400.0, False)]
)
def test_snapshot_cost_decides_whether_enabling_a_shared_batch_wins(snapshot_ms, shared_wins):
    """A stream blocked behind a window snapshot and two ready decoders (x = 2, z = 0.25,
    A = 10 each): the sequence (snapshot, then decode of all three) wins only while its whole
    value per time beats decoding the two ready streams, which by the formulas above holds up to
    a snapshot cost of 1.7814 ms; the sweep brackets that break-even point by 3%."""
    costs = CostModel()
    for g in ORDINARY.graphs:
        ms = snapshot_ms if g.kind is GraphKind.SNAPSHOT else g.duration_ms
        costs.observe(g.key, [ms * 1e6], 0)
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), decoder(2), decoder(3)]
    c = choose(views, costs=costs, **ORD)
    assert (c.kind is GraphKind.SNAPSHOT) == shared_wins
    assert (_sequence_score(snapshot_ms) > SHARED_DECODE_ALTERNATIVE) == shared_wins
    score = c.score * math.exp(c.log_scale)
    if shared_wins:
        assert c.following.graph.name == "decode[B=4,W=1,D=0,C=0,P=4]" and sorted(c.following.rids) == [
            1,
            2,
            3,
        ]
        assert score == pytest.approx(_sequence_score(snapshot_ms))
    else:
        assert c.kind is GraphKind.DECODE and sorted(c.rids) == [2, 3]
        assert score == pytest.approx(SHARED_DECODE_ALTERNATIVE)


@spec("prerequisites/continuation-value", "prerequisites/continuation-images")
def test_longer_chains_use_the_continuation_index():
    """Restore, then vision, then prefill of 64 tokens (x = 2): V = 9*64 + 72 = 648 earned after
    F = vision 6.0 + prefill 4.854 ms; restore T = 0.35: contribution 648*0.35/(0.35 + 10.854)."""
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64)
    c = choose([view], catalog=SPEC)
    assert c.kind is GraphKind.RESTORE and c.following is None
    t, f = 0.35, 6.0 + 4.854
    contribution = 648.0 * t / (t + f)
    assert c.score * math.exp(c.log_scale) == pytest.approx(contribution / t, rel=1e-6)


@spec("prerequisites/continuation-aggregate", "useful-service/multistage-reference")
def test_continuations_are_summed_over_the_cohort_and_pay_the_waiting_cost():
    """An extra RESTORE B=2 (T = 0.4 ms) and two multistage streams, beside a ready decoder.

    - stream 1: restore, vision, then a 64-token prompt (x = 2): V = 9*64 + 72 = 648 after
      F = vision 6.0 + prefill 4.854 ms: 648*0.4/(0.4 + 10.854) = 23.031811;
    - stream 2: restore, snapshot, then decode (x = 2, z = 0.25, A = 10): F = snapshot 0.3 + the
      fastest generation graph 3.531 = 3.831 ms, which is also its individual future-delivery
      reference: V = 72 + 16 + 0.1*3.831*(10 + 3.831), contributing V*0.4/(0.4 + 3.831) = 8.820483.
    Score: (23.031811 + 8.820483)/0.4 - 0.4/2 * 0.1 * 2 (stream 2 and the decoder are active
    decoders) = 79.590734.
    """
    r2 = GraphDescriptor(GraphKind.RESTORE, 2, duration_ms=0.4)
    views = [
        blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64),
        blocked(2, [GraphKind.RESTORE, GraphKind.SNAPSHOT], Phase.DECODE),
        decoder(3),
    ]
    c = next(c for c in policy.candidates(with_graphs([r2], views=views)) if c.graph == r2)
    v2 = 88 + 0.1 * 3.831 * (10 + 3.831)
    contributions = [648 * 0.4 / (0.4 + 10.854), v2 * 0.4 / (0.4 + 3.831)]
    scale = math.exp(c.log_scale)
    assert c.following is None and [lane.rid for lane in c.lanes] == [1, 2]
    assert [lane.value * scale for lane in c.lanes] == pytest.approx(contributions)
    assert c.score * scale == pytest.approx(sum(contributions) / 0.4 - 0.4 / 2 * 0.2)
    assert c.score * scale == pytest.approx(79.590734, rel=1e-7)


@spec("prerequisites/continuation-unknown", "prerequisites/snapshot-discovery")
def test_unknown_durations_compare_by_value():
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64)
    c = choose([view], catalog=SPEC, costs=CostModel())
    assert c.indeterminate and c.score * math.exp(c.log_scale) == pytest.approx(648.0)


@spec(
    "prerequisites/terminal-lane-value",
    "prerequisites/terminal-own-value",
    "prerequisites/terminal-waiting-cost",
    "prerequisites/terminal-same-rules",
    "prerequisites/terminal-no-priority",
    "prerequisites/snapshot-no-credit",
)
def test_terminal_snapshot_value_by_hand():
    """One terminal row aged 20 ms and one decoder. sigma_terminal = 1 * 0.3 ms (snapshot B=1).
    Snapshot: (256 + 1*0.3*(20 + 0.3)) / 0.3 - 0.3/2*(0.1 + 1) = 873.465."""
    views = [terminal(1, age_ms=20.0), decoder(2)]
    snap = next(c for c in policy.candidates(inputs(views, **ORD)) if c.kind is GraphKind.SNAPSHOT)
    assert snap.graph.batch_capacity == 1 and snap.rids == (1,)
    assert snap.score * math.exp(snap.log_scale) == pytest.approx((256 + 0.3 * 20.3) / 0.3 - 0.15 * 1.1)
    assert all(lane.expected_tokens == 0 for lane in snap.lanes)  # no token or burst credit
    # The terminal row's age coefficient also weighs on every other candidate's waiting cost.
    dec = next(c for c in policy.candidates(inputs(views, **ORD)) if c.kind is GraphKind.DECODE)
    alone = next(c for c in policy.candidates(inputs([decoder(2)], **ORD)) if c.kind is GraphKind.DECODE)
    gap = (alone.score * math.exp(alone.log_scale)) - (dec.score * math.exp(dec.log_scale))
    assert gap == pytest.approx(dec.duration_ms / 2 * 1.0)


@spec("policy/terminal-both-zero", "policy/terminal-zero", "prerequisites/terminal-both-policies")
def test_terminal_preferences_follow_the_policy():
    both_off = PolicyConfig.preset("throughput", terminal_value=0, terminal_age_price=0)
    views = [terminal(1, age_ms=20.0)]
    snap = choose(views, policy_config=both_off, **ORD)
    assert snap.kind is GraphKind.SNAPSHOT and snap.score == 0.0  # no terminal service value left
    thr = choose(views, policy_config=PolicyConfig.preset("throughput"), **ORD)
    assert thr.score > 0


@spec("policy/terminal-zero")
@pytest.mark.parametrize(
    "overrides, snapshot_score",
    [
        # no terminal value: only the age term is left, (1*0.3*(20 + 0.3))/0.3 - 0.3/2*(0.1 + 1)
        (dict(terminal_value=0.0), 0.3 * 20.3 / 0.3 - 0.15 * 1.1),
        # no terminal age price: the value alone, 256/0.3 - 0.3/2*0.1, and no terminal waiting cost
        (dict(terminal_age_price=0.0), 256 / 0.3 - 0.15 * 0.1),
    ],
)
def test_each_zero_terminal_coefficient_removes_its_preference(overrides, snapshot_score):
    """One terminal row aged 20 ms and one decoder (ordinary catalog, snapshot B=1 0.3 ms,
    sigma_terminal 0.3 ms). Zeroing one terminal coefficient removes that term and keeps the
    other; a zero age price also takes the terminal row out of every candidate's waiting cost."""
    pc = PolicyConfig(**overrides)
    views = [terminal(1, age_ms=20.0), decoder(2, policy_config=pc)]
    cands = policy.candidates(inputs(views, policy_config=pc, **ORD))
    snap = next(c for c in cands if c.kind is GraphKind.SNAPSHOT and c.graph.batch_capacity == 1)
    assert snap.score * math.exp(snap.log_scale) == pytest.approx(snapshot_score)
    dec = next(c for c in cands if c.kind is GraphKind.DECODE)
    alone = next(
        c
        for c in policy.candidates(inputs([decoder(2, policy_config=pc)], policy_config=pc, **ORD))
        if c.kind is GraphKind.DECODE
    )
    gap = alone.score * math.exp(alone.log_scale) - dec.score * math.exp(dec.log_scale)
    assert gap == pytest.approx(dec.duration_ms / 2 * pc.terminal_age_price)


@spec(
    "prerequisites/continuation-unknown",
    "prerequisites/continuation-value",
    "prerequisites/continuation-images",
)
def test_an_unmeasured_later_stage_makes_the_continuation_optimistic():
    """Restore, then vision, then a 64-token prompt (x = 2), with everything measured but vision.
    F is unknown, so the stream contributes its whole value V = 9*64 + 72 = 648 (no V*T/(T+F)
    discount) while restore itself is measured: score 648/0.35, no active decoder."""
    costs = CostModel()
    for g in SPEC.graphs:
        if g.kind is not GraphKind.VISION:
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64)
    c = choose([view], catalog=SPEC, costs=costs)
    assert c.kind is GraphKind.RESTORE and not c.indeterminate and c.following is None
    scale = math.exp(c.log_scale)
    assert c.lanes[0].value * scale == pytest.approx(648.0)
    assert c.score * scale == pytest.approx(648.0 / 0.35)


@spec("prerequisites/continuation-value", "prerequisites/continuation-images")
def test_every_later_stage_adds_its_time_to_the_continuation():
    """Restore, then a window snapshot, then vision, then a 64-token prompt (x = 2): F = 0.3
    (snapshot B=1) + 6.0 (vision) + 4.854 (prefill 64) = 11.154 ms after restore's T = 0.35:
    contribution 648*0.35/(0.35 + 11.154), score that over 0.35."""
    view = blocked(1, [GraphKind.RESTORE, GraphKind.SNAPSHOT, GraphKind.VISION], Phase.PREFILL, tokens=64)
    c = choose([view], catalog=SPEC)
    assert c.kind is GraphKind.RESTORE and c.following is None
    scale = math.exp(c.log_scale)
    assert c.lanes[0].value * scale == pytest.approx(648.0 * 0.35 / (0.35 + 11.154))
    assert c.score * scale == pytest.approx(648.0 / (0.35 + 11.154))


# -- two-stage sequences against enumeration ---------------------------------------------------

PREREQUISITE_KINDS = (GraphKind.INITIALIZE, GraphKind.RESTORE, GraphKind.VISION, GraphKind.SNAPSHOT)
# Extra prerequisite shapes so that prerequisite batches above one compete.
EXTRA_PREREQUISITES = (
    GraphDescriptor(GraphKind.INITIALIZE, 4, duration_ms=0.25),
    GraphDescriptor(GraphKind.RESTORE, 2, duration_ms=0.4),
    GraphDescriptor(GraphKind.VISION, 1, duration_ms=6.0),
    GraphDescriptor(GraphKind.SNAPSHOT, 4, duration_ms=0.5),
)
# A host ragged program of width two (P = 5 < B*W = 8).
RAGGED_W2 = GraphDescriptor(
    GraphKind.SPECULATIVE,
    4,
    token_capacity=2,
    proposal_depth=1,
    target_capacity=5,
    allocation=Allocation.QUERY_LENGTH,
    duration_ms=4.0,
)


def _sequence_population(rng, depth, n_max=6):
    """Blocked streams (one or two prerequisites, enabling decode or a prompt), ready decoders
    and prompts, and terminal rows, with random prices, ages, limits and acceptance."""
    kinds = PREREQUISITE_KINDS
    views = []
    for i in range(int(rng.integers(1, n_max + 1))):
        rid = 10 + i
        kw = dict(
            slot=int(rng.permutation(32)[i]),
            last_selected_ns=int(rng.integers(0, 4)),
            runnable=bool(rng.random() > 0.05),
        )
        x = float(np.exp(rng.normal(0.0, 1.0)))
        role = rng.choice(["blocked", "blocked", "decode", "prompt", "terminal"])
        survival = np.cumprod(rng.uniform(0.2, 1.0, depth))
        dec = dict(
            x=x,
            z=float(np.exp(rng.normal(-1.5, 1.0))),
            age_ms=float(rng.uniform(0, 100)),
            survival=survival,
            forecast=np.cumprod(rng.uniform(0.2, 1.0, depth)),
            output_remaining=int(rng.choice([1, 2, 3, 500])),
        )
        tokens = int(rng.choice([30, 64, 100, 700]))
        pro = dict(
            x=x,
            needs_scores=bool(rng.random() < 0.2),
            prompt_limit=None if rng.random() < 0.8 else int(rng.integers(1, tokens + 1)),
        )
        if role == "blocked":
            chain = [kinds[int(rng.integers(len(kinds)))]]
            if rng.random() < 0.2:
                chain.append(kinds[int(rng.integers(len(kinds)))])
            enables = Phase.DECODE if rng.random() < 0.55 else Phase.PREFILL
            if enables is Phase.DECODE:
                views.append(blocked(rid, chain, enables, **dec, **kw))
            else:
                views.append(blocked(rid, chain, enables, tokens=tokens, **pro, **kw))
        elif role == "decode":
            views.append(decoder(rid, **dec, **kw))
        elif role == "prompt":
            views.append(prompt(rid, tokens, **pro, **kw))
        else:
            views.append(terminal(rid, age_ms=float(rng.uniform(0, 50)), **kw))
    return views


def _sequence_oracle(obj, views, graphs, costs, mode):
    """{(first key, following key): (best score, exact)} over every legal two-stage cohort,
    enumerated: at least one row the prerequisite enables joins the following program, the
    following program's other rows are already ready requests, the prerequisite's other rows
    retire terminal rows (snapshot) and the sequence is scored over U = T + F. Newly ready
    decoders use their own reference U, ready ones sigma; output ages reset at U; a terminal row
    retired at T also saves its waiting over the rest of the sequence. Adaptive ragged followers
    are searched, not enumerated, by the selector (exact = False: it may only fall short)."""
    runnable = [v for v in views if v.runnable]
    decoders = [v for v in runnable if v.phase is Phase.DECODE]
    prompts = [v for v in runnable if v.phase is Phase.PREFILL]
    terminals = [v for v in runnable if v.phase is Phase.TERMINAL]
    blocked_ = [v for v in runnable if v.phase is Phase.BLOCKED and v.prerequisites]
    alpha = obj.policy.adaptive_verification_alpha

    def expected(v, rows):
        return 1.0 + sum(s**alpha for s in cohorts._survival(v, obj.depth)[: rows - 1])

    out = {}
    for g1 in graphs:
        if g1.kind not in PREREQUISITE_KINDS:
            continue
        singles = [v for v in blocked_ if v.prerequisites[0] is g1.kind and len(v.prerequisites) == 1]
        t1 = costs.estimate_ms(g1.key)
        terms = terminals if g1.kind is GraphKind.SNAPSHOT else []
        for enables in (Phase.DECODE, Phase.PREFILL):
            new = [v for v in singles if v.enables is enables]
            if not new:
                continue
            for g2 in graphs:
                if enables is Phase.DECODE and not g2.kind.is_generation:
                    continue
                if enables is Phase.PREFILL and not (g2.kind.is_prefill or g2.kind is GraphKind.MIXED):
                    continue
                f = costs.estimate_ms(g2.key)
                unknown = t1 is None or f is None
                u = 0.0 if unknown else t1 + f
                tv = sorted(
                    (
                        obj.terminal_value(v, 0.0 if unknown else t1)
                        + (0.0 if unknown else obj.ct * (v.terminal_age_ms * f + 0.5 * (u * u - t1 * t1)))
                        for v in terms
                    ),
                    reverse=True,
                )

                def terminal_fill(rows, tv=tv):
                    return sum(tv[: max(rows, 0)])

                def decode_value(v, rows, newly, u=u):
                    ref = u if newly else obj.sigma
                    return (
                        obj.price(v.log_output_price) * expected(v, rows)
                        + obj.price(v.log_delivery_price)
                        + obj.c * ref * (v.age_ms + u)
                    )

                ragged = g2.kind is GraphKind.SPECULATIVE and g2.token_capacity > 1 and not g2.is_rectangular
                device = ragged and g2.allocation is Allocation.PREFIX_LIMIT
                exact = not (ragged and mode is not DecodeMode.FIXED)

                def cohort_value(members, g2=g2, ragged=ragged, device=device, exact=exact):
                    """Best value of decoders [(view, newly)] on g2 (None: they do not fit)."""
                    limits = [cohorts._lane_limit(v, g2) for v, _ in members]
                    if device:
                        if len(members) > g2.target_capacity:
                            return None
                        order = sorted(range(len(members)), key=lambda i: members[i][0].slot)
                        rows = prefix_allocation_naive(
                            [cohorts._forecast(members[i][0], g2.proposal_depth) for i in order],
                            [limits[i] for i in order],
                            [True] * len(order),
                            g2.target_capacity,
                        )
                        got = dict(zip(order, rows))
                        return sum(decode_value(v, int(got[i]), n) for i, (v, n) in enumerate(members))
                    choices = (
                        [range(1, w + 1) for w in limits] if ragged and not exact else [(w,) for w in limits]
                    )
                    best = None
                    for widths in itertools.product(*choices):
                        if ragged and sum(widths) > g2.target_capacity:
                            continue
                        val = sum(decode_value(v, w, n) for (v, n), w in zip(members, widths))
                        best = val if best is None else max(best, val)
                    return best

                best = None
                if enables is Phase.DECODE:
                    fixed_prompts = [None]
                    if g2.kind is GraphKind.MIXED:
                        fixed_prompts += [
                            p
                            for p in prompts
                            if not p.needs_scores and cohorts.prompt_work_naive(p, g2.prefill_capacity) > 0
                        ]
                    for p in fixed_prompts:
                        room = g2.batch_capacity - (p is not None)
                        pv = (
                            0.0
                            if p is None
                            else obj.prompt_value(p, cohorts.prompt_work_naive(p, g2.prefill_capacity))
                        )
                        for kn in range(1, min(len(new), g1.batch_capacity, room) + 1):
                            for nset in itertools.combinations(new, kn):
                                for kr in range(0, min(len(decoders), room - kn) + 1):
                                    for rset in itertools.combinations(decoders, kr):
                                        val = cohort_value(
                                            [(v, True) for v in nset] + [(v, False) for v in rset]
                                        )
                                        if val is None:
                                            continue
                                        val += pv + terminal_fill(g1.batch_capacity - kn)
                                        best = val if best is None else max(best, val)
                else:
                    mixed = g2.kind is GraphKind.MIXED
                    cap = g2.prefill_capacity if mixed else g2.token_capacity
                    scored_ = g2.kind is GraphKind.SCORED_PREFILL

                    def pvalue(v, cap=cap, scored_=scored_):
                        n = cohorts.prompt_work_naive(v, cap)
                        return obj.prompt_value(v, n) if n > 0 and v.needs_scores == scored_ else 0.0

                    for v in new:
                        if pvalue(v) <= 0:
                            continue
                        if mixed:  # the enabled prompt row and already ready decoders
                            for kr in range(0, min(len(decoders), g2.batch_capacity - 1) + 1):
                                for rset in itertools.combinations(decoders, kr):
                                    val = pvalue(v) + sum(
                                        decode_value(d, cohorts._lane_limit(d, g2), False) for d in rset
                                    )
                                    val += terminal_fill(g1.batch_capacity - 1)
                                    best = val if best is None else max(best, val)
                        else:
                            ready = sorted((pvalue(p) for p in prompts if pvalue(p) > 0), reverse=True)
                            val = (
                                pvalue(v)
                                + sum(ready[: g2.batch_capacity - 1])
                                + terminal_fill(g1.batch_capacity - 1)
                            )
                            best = val if best is None else max(best, val)
                if best is not None:
                    score = best if unknown else best / u - 0.5 * u * obj.waiting
                    prev = out.get((g1.key, g2.key))
                    if prev is None or score > prev[0]:
                        out[(g1.key, g2.key)] = (score, exact)
    return out


@spec(
    "prerequisites/pair-exact",
    "prerequisites/all-shape-pairs",
    "prerequisites/joint-cohorts",
    "prerequisites/following-ready",
    "prerequisites/first-finishes-terminal",
    "prerequisites/one-newly-ready",
    "prerequisites/sequence-score",
    "prerequisites/age-reset-following",
    "prerequisites/terminal-age-stops",
    "prerequisites/terminal-two-stage",
    "prerequisites/free-unused-capacity",
    "prerequisites/plan-duration-t",
    "useful-service/multistage-reference",
    "mixed-execution/prereq-cases",
    "mixed-execution/references-lookahead",
)
@pytest.mark.parametrize(
    "catalog, mode, extra, config",
    [
        (SPEC, DecodeMode.ADAPTIVE, (), POLICY),
        (SPEC, DecodeMode.FIXED, (), POLICY),
        (ORDINARY, DecodeMode.ORDINARY, (), POLICY),
        (RAGGED, DecodeMode.ADAPTIVE, (RAGGED_W2,), POLICY),
        (RAGGED, DecodeMode.FIXED, (), POLICY),
        (SPEC, DecodeMode.ADAPTIVE, (), dataclasses.replace(POLICY, adaptive_verification_alpha=2.0)),
    ],
    ids=["speculative", "fixed", "ordinary", "ragged-adaptive", "ragged-fixed", "speculative-alpha2"],
)
def test_two_stage_sequences_match_enumeration(catalog, mode, extra, config):
    """Random populations with blocked streams: every (prerequisite, following) pair the selector
    offers scores what exhaustive enumeration of the two cohorts finds (adaptive ragged
    followers: at most that), never more; its lanes carry the same values (the rows the
    prerequisite enables, the terminal rows it retires, free rows, then the following cohort)
    and the plan keeps the prerequisite's own duration. The last case discounts survival by
    alpha = 2, which every other case leaves at 1."""
    rng = np.random.default_rng(3)
    fixed_width = 4 if mode is DecodeMode.FIXED else None
    graphs = catalog.eligible(mode, fixed_width=fixed_width)
    graphs = graphs + tuple(g for g in EXTRA_PREREQUISITES + extra if g.key not in {h.key for h in graphs})
    compared = exact_compared = 0
    for case in range(30):
        costs = CostModel(POLICY.estimate_ttl_ns)
        for g in graphs:
            if g.duration_ms is not None and rng.random() > 0.08:
                costs.observe(g.key, [g.duration_ms * 1e6 * float(np.exp(rng.uniform(-0.1, 0.1)))], 0)
        views = _sequence_population(rng, max(g.proposal_depth for g in graphs))
        inp = policy.SelectionInput(views, graphs, costs, 0, config, mode)
        obj = cohorts.Objective(views, graphs, costs, config)
        want = _sequence_oracle(obj, views, graphs, costs, mode)
        by_rid = {v.rid: v for v in views}
        got = {}
        for c in policy.candidates(inp):
            if c.following is None:
                continue
            g1, g2 = c.graph, c.following.graph
            key = (g1.key, g2.key)
            got[key] = max(got.get(key, -math.inf), c.score)
            t1, f = costs.estimate_ms(g1.key), costs.estimate_ms(g2.key)
            unknown = t1 is None or f is None
            u = 0.0 if unknown else t1 + f
            assert (c.duration_ms, c.following.duration_ms) == (t1, f)
            assert c.sequence_ms == (None if unknown else pytest.approx(u))
            group = {
                v.rid
                for v in views
                if v.runnable
                and v.phase is Phase.BLOCKED
                and v.prerequisites
                and v.prerequisites[0] is g1.kind
            }
            assert all(lane.slot == by_rid[lane.rid].slot for lane in c.lanes + c.following.lanes)
            first = {lane.rid: lane for lane in c.lanes}
            assert len(first) == len(c.lanes) <= g1.batch_capacity
            newly = [lane for lane in c.following.lanes if by_rid[lane.rid].phase is Phase.BLOCKED]
            assert newly and all(first[lane.rid].role is LaneRole.PREREQUISITE for lane in newly)
            assert len(c.following.lanes) <= g2.batch_capacity
            prereq = [lane for lane in c.lanes if lane.role is LaneRole.PREREQUISITE]
            assert {lane.rid for lane in prereq} <= group and all(lane.value == 0.0 for lane in prereq)
            retired = [lane for lane in c.lanes if lane.role is LaneRole.TERMINAL]
            assert all(by_rid[lane.rid].phase is Phase.TERMINAL for lane in retired)
            assert not retired or g1.kind is GraphKind.SNAPSHOT
            # free rows fill the prerequisite's capacity from the rest of its group
            assert len(c.lanes) == min(g1.batch_capacity, len(retired) + len(group))
            for retired_lane in retired:
                v = by_rid[retired_lane.rid]
                extra = 0.0 if unknown else obj.ct * (v.terminal_age_ms * f + 0.5 * (u * u - t1 * t1))
                assert retired_lane.value == pytest.approx(
                    obj.terminal_value(v, 0.0 if unknown else t1) + extra, rel=1e-9
                )
            for follower in c.following.lanes:
                v = by_rid[follower.rid]
                if follower.role is LaneRole.PROMPT:
                    cap = g2.prefill_capacity if g2.kind is GraphKind.MIXED else g2.token_capacity
                    assert follower.prompt_tokens == cohorts.prompt_work_naive(v, cap)
                    assert follower.value == pytest.approx(
                        obj.prompt_value(v, follower.prompt_tokens), rel=1e-9
                    )
                else:
                    rows = follower.query_length or follower.ceiling
                    assert 1 <= rows <= cohorts._lane_limit(v, g2)
                    ref = u if v.phase is Phase.BLOCKED else obj.sigma
                    assert follower.value == pytest.approx(
                        obj.price(v.log_output_price) * follower.expected_tokens
                        + obj.price(v.log_delivery_price)
                        + obj.c * ref * (v.age_ms + u),
                        rel=1e-9,
                    )
            # the plan carries the follower as a candidate of the pair's scale and its lanes' value
            assert c.following.log_scale == c.log_scale
            follower_value = sum(lane.value for lane in c.following.lanes)
            assert c.following.useful_value == pytest.approx(follower_value, rel=1e-9)
            useful = sum(lane.value for lane in c.lanes) + follower_value
            assert c.useful_value == pytest.approx(useful, rel=1e-9)
            assert c.score == pytest.approx(
                useful if unknown else useful / u - 0.5 * u * obj.waiting, rel=1e-9
            )
        for key, score in got.items():
            assert key in want, key
            ref, exact = want[key]
            tol = 1e-7 * max(1.0, abs(ref))
            assert score <= ref + tol, (case, key)
            if exact:
                assert score >= ref - tol, (case, key)
                exact_compared += 1
            compared += 1
        for key in want:
            if key not in got:  # pruned: a pair of the same kinds, each shape the same or smaller
                assert any(
                    (k1, k2) != key and all(_same_or_smaller(a, b) for a, b in zip((k1, k2), key))
                    for k1, k2 in got
                ), (case, key)
    assert compared > 30 and exact_compared > 0


def _same_or_smaller(a, b) -> bool:
    """Cost keys of one kind and depth whose capacities are all at most b's."""
    caps = ("batch_capacity", "token_capacity", "target_capacity", "prefill_capacity", "steps")
    same = a.kind is b.kind and a.proposal_depth == b.proposal_depth
    return same and all(getattr(a, c) <= getattr(b, c) for c in caps)


def _costs_without(catalog, *skip):
    """The catalog measured, except the programs `skip` selects."""
    costs = CostModel()
    for g in catalog.graphs:
        if not any(s(g) for s in skip):
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    return costs


def _restore_lane_value(views, costs):
    c = next(
        c
        for c in policy.candidates(inputs(views, catalog=SPEC, costs=costs))
        if c.kind is GraphKind.RESTORE and c.graph.batch_capacity == 1
    )
    return c, c.lanes[0].value * math.exp(c.log_scale), c.score * math.exp(c.log_scale)


@spec("prerequisites/continuation-value", "prerequisites/continuation-unknown")
@pytest.mark.parametrize("measured_scored", [True, False])
def test_a_continuation_needing_prompt_scores_is_valued_on_scored_prefill(measured_scored):
    """Restore, vision, then a 64-token prompt that needs its scores (x = 2): V = 9*64 + 72 =
    648 comes from scored prefill only. Measured: F = vision 6.0 + scored 64 chunk 5.11 ms,
    contribution 648*0.35/(0.35 + 11.11). Scored prefill unmeasured (plain prefill measured,
    but it cannot serve the request): F is unknown and the contribution is V itself."""
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64, needs_scores=True)
    costs = _costs_without(SPEC, lambda g: not measured_scored and g.kind is GraphKind.SCORED_PREFILL)
    _, value, score = _restore_lane_value([view], costs)
    want = 648.0 * 0.35 / (0.35 + 11.11) if measured_scored else 648.0
    assert value == pytest.approx(want)
    assert score == pytest.approx(want / 0.35)


@spec("prerequisites/continuation-value", "prerequisites/continuation-unknown", "useful-service/shared-scale")
@pytest.mark.parametrize("measured_prefill", [True, False])
def test_a_small_continuation_value_keeps_its_own_size(measured_prefill):
    """A one-token prompt behind restore and vision, from a well served request (x = 1e6:
    prices 1 + 16e-6 per prompt token, 64 + 16e-6 for its output token, 65.000032 in all),
    beside a starved prompt (x = 0.01: output price 1664, the decision's scale). Its value is a
    small fraction of the scale (65.000032/1664) and is still discounted by T/(T + F) with
    F = 6.0 + 4.854 ms, or, with no prefill measured, taken whole (the most valuable chunk)."""
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=1, x=1e6)
    costs = _costs_without(SPEC, lambda g: not measured_prefill and g.kind.is_prefill)
    c, value, _ = _restore_lane_value([view, prompt(2, 64, x=0.01)], costs)
    assert math.exp(c.log_scale) == pytest.approx(1664.0)
    v = 1 + 16e-6 + 64 + 16e-6
    assert value == pytest.approx(v * 0.35 / (0.35 + 10.854) if measured_prefill else v, rel=1e-9)


@spec(
    "prerequisites/continuation-value",
    "prerequisites/continuation-unknown",
    "useful-service/multistage-reference",
)
def test_a_decoding_continuation_without_a_measured_generation_program():
    """Restore, snapshot, then decoding (x = 2, z = 0.25, A = 10), with no generation program
    measured: the time until its first delivery is unknown, so V is its output and delivery
    value alone, 72 + 16 = 88, taken whole; restore 0.35 ms and one active decoder:
    88/0.35 - 0.35/2*0.1."""
    view = blocked(1, [GraphKind.RESTORE, GraphKind.SNAPSHOT], Phase.DECODE)
    costs = _costs_without(SPEC, lambda g: g.kind.is_generation)
    _, value, score = _restore_lane_value([view], costs)
    assert value == pytest.approx(88.0)
    assert score == pytest.approx(88.0 / 0.35 - 0.35 / 2 * 0.1)


@spec(
    "duration-estimates/stale-usable",
    "duration-estimates/stale-ranked-measured",
    "prerequisites/plan-duration-t",
)
def test_a_sequence_plan_reports_its_prerequisites_staleness():
    """Restore then decode, measured at time 0. One freshness interval later the restore
    estimate is stale: the sequence still ranks on its measured costs (the same program pair
    and score) but is flagged stale, like any other plan on a stale estimate; once restore is
    observed again the flag clears."""
    views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE), decoder(2)]
    costs = measured(ORDINARY)
    later = POLICY.estimate_ttl_ns + 1
    fresh = policy.select(inputs(views, costs=costs, now_ns=0, **ORD))
    stale = policy.select(inputs(views, costs=costs, now_ns=later, **ORD))
    assert fresh.kind is GraphKind.RESTORE and fresh.following is not None and not fresh.stale
    assert stale.stale and (stale.graph, stale.following.graph, stale.score) == (
        fresh.graph,
        fresh.following.graph,
        fresh.score,
    )
    costs.observe(stale.graph.key, [0.35e6], later)
    again = policy.select(inputs(views, costs=costs, now_ns=later, **ORD))
    assert again.kind is GraphKind.RESTORE and not again.stale


@spec(
    "speculative-coverage/wp-not-imply-d",
    "speculative-coverage/querylength-fits-p",
    "useful-service/multistage-reference",
)
def test_a_newly_ready_decoder_is_bounded_by_the_following_programs_width():
    """A rectangular speculative program B=1, W=2 with D=3 proposals (legal: D is not derived
    from W) follows restore (0.35 ms) for a stream with survival 0.9**d, x = 2, z = 0.25,
    A = 10. The program verifies two rows per request, so the newly ready lane queries 2 rows,
    not the D + 1 = 4 its proposals would allow: E = 1 + 0.9, and with U = 0.35 + 3.9 ms the
    lane is worth 72*1.9 + 16 + 0.1*U*(10 + U) (its own future-delivery reference U)."""
    w2 = GraphDescriptor(
        GraphKind.SPECULATIVE,
        1,
        token_capacity=2,
        proposal_depth=3,
        target_capacity=2,
        allocation=Allocation.QUERY_LENGTH,
        duration_ms=3.9,
    )
    views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE, survival=geometric(0.9))]
    c = next(
        c
        for c in policy.candidates(with_graphs([w2], catalog=SPEC, mode=DecodeMode.ADAPTIVE, views=views))
        if c.following is not None and c.following.graph == w2
    )
    u = 0.35 + 3.9
    (lane,) = c.following.lanes
    assert (lane.rid, lane.query_length) == (1, 2)
    assert lane.expected_tokens == pytest.approx(1.9)
    assert lane.value * math.exp(c.log_scale) == pytest.approx(72 * 1.9 + 16 + 0.1 * u * (10 + u))


HOST_P6 = "speculative[B=4,W=4,D=3,C=0,P=6]"


def _ragged_sequence(views, extra=()):
    """The candidate that runs a snapshot and then ragged-small's host ragged program B=4,
    W=4, P=6 (adaptive mode), with the snapshot shape of largest batch."""
    cands = [
        c
        for c in policy.candidates(with_graphs(extra, catalog=RAGGED, mode=DecodeMode.ADAPTIVE, views=views))
        if c.kind is GraphKind.SNAPSHOT and c.following is not None and c.following.graph.name == HOST_P6
    ]
    return max(cands, key=lambda c: c.graph.batch_capacity)


@spec(
    "useful-service/adaptive-causal-pricing",
    "speculative-coverage/host-inputs",
    "prerequisites/following-ready",
)
def test_a_host_ragged_follower_allocates_rows_by_value_not_forecast():
    """Behind a window snapshot, stream 1 (survival 0.9**d, but confidence forecast 0.1**d)
    and a ready decoder 2 (survival 0.3**d, forecast 0.95**d), both x = 2. The host program
    P = 6 holds both pending rows and four more; host allocation ranks them by marginal value,
    72 * survival: stream 1's 64.8, 58.3, 52.5 before decoder 2's 21.6, so stream 1 queries 4
    rows (E = 1 + 0.9 + 0.81 + 0.729) and decoder 2 two (E = 1.3). Ranking by the device's
    forecast would give decoder 2 the four."""
    views = [
        blocked(
            1, [GraphKind.SNAPSHOT], Phase.DECODE, survival=geometric(0.9, 3), forecast=geometric(0.1, 3)
        ),
        decoder(2, survival=geometric(0.3, 3), forecast=geometric(0.95, 3)),
    ]
    c = _ragged_sequence(views)
    assert {lane.rid: lane.query_length for lane in c.following.lanes} == {1: 4, 2: 2}
    assert {lane.rid: lane.expected_tokens for lane in c.following.lanes} == pytest.approx({1: 3.439, 2: 1.3})


@spec(
    "prerequisites/following-ready", "prerequisites/joint-cohorts", "useful-service/adaptive-causal-pricing"
)
def test_a_ready_decoder_with_a_high_delivery_price_joins_a_ragged_follower():
    """Behind a window snapshot, stream 1 (x = 2, z = 0.25); beside it a ready decoder with
    z = 0.01, so its delivery price 4/0.01 = 400 is worth far more than its output token (72).
    Both fit the host program's B = 4 and P = 6 and every lane adds value, so the follower
    serves both; a search that counted the delivery price against the lane would drop it."""
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), decoder(2, z=0.01)]
    c = _ragged_sequence(views)
    assert sorted(c.following.rids) == [1, 2]
    scale = math.exp(c.log_scale)
    assert [lane.value * scale > 400 for lane in c.following.lanes if lane.rid == 2] == [True]


@spec(
    "prerequisites/fill-prerequisite",
    "prerequisites/first-finishes-terminal",
    "prerequisites/terminal-two-stage",
)
def test_a_snapshot_before_a_ragged_follower_retires_every_terminal_row_it_holds():
    """A snapshot B=4 (0.5 ms) enables stream 1 for the host ragged program (4.5 ms) and has
    three rows left: both terminal rows (aged 5 and 8 ms) retire in it, the older first, each
    worth its terminal value with the waiting it saves over the rest of the sequence
    (U = 5 ms, K_terminal = 2, sigma_terminal = min(2*0.3, 2*0.4/2, 2*0.5/2) = 0.4):
    256 + 0.4*(A + 0.5) + A*4.5 + (25 - 0.25)/2."""
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), terminal(2, age_ms=5.0), terminal(3, age_ms=8.0)]
    c = _ragged_sequence(views, extra=[GraphDescriptor(GraphKind.SNAPSHOT, 4, duration_ms=0.5)])
    assert c.graph.batch_capacity == 4 and c.sequence_ms == pytest.approx(5.0)
    assert [(lane.rid, lane.role) for lane in c.lanes] == [
        (1, LaneRole.PREREQUISITE),
        (3, LaneRole.TERMINAL),
        (2, LaneRole.TERMINAL),
    ]
    scale = math.exp(c.log_scale)
    retired = {a: 256 + 0.4 * (a + 0.5) + a * 4.5 + (25 - 0.25) / 2 for a in (8.0, 5.0)}
    assert [lane.value * scale for lane in c.lanes[1:]] == pytest.approx([retired[8.0], retired[5.0]])


@spec("prerequisites/continuation-value", "useful-service/dominance-prune")
def test_a_dominated_shape_never_carries_a_continuation_even_when_it_measures_faster():
    """A RESTORE B=2 measured at 0.3 ms beside the catalog's RESTORE B=1 (0.35 ms), and one stream
    that restores, then encodes an image, then prefills: B=1 serves the same cohort, so the larger
    shape is dominated and the continuation runs on B=1, although B=2's shorter time would score
    higher (V*T/(T+F)/T = V/(T+F))."""
    r2 = GraphDescriptor(GraphKind.RESTORE, 2, duration_ms=0.3)
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64)
    inp = with_graphs([r2], catalog=SPEC, mode=DecodeMode.ADAPTIVE, views=[view])
    restores = [c for c in policy.candidates(inp) if c.kind is GraphKind.RESTORE]
    assert [c.graph.batch_capacity for c in restores] == [1]
    assert policy.select(inp).graph.batch_capacity == 1
