"""Prerequisites, two-stage sequences, continuations and terminal snapshots in selection."""
import dataclasses
import math

import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole, Phase, RequestView

from .helpers import ORDINARY, POLICY, SPEC, choose, decoder, inputs, measured, prompt

spec = pytest.mark.spec
ORD = dict(catalog=ORDINARY, mode=DecodeMode.ORDINARY)


def blocked(rid, prerequisites, enables, **kw):
    base = decoder(rid, **kw) if enables is Phase.DECODE else prompt(rid, kw.pop("tokens", 64), **kw)
    return dataclasses.replace(base, phase=Phase.BLOCKED, prerequisites=tuple(prerequisites), enables=enables)


def terminal(rid, age_ms=0.0, **kw):
    return RequestView(rid=rid, slot=rid, phase=Phase.TERMINAL, terminal_age_ms=age_ms, **kw)


def with_graphs(extra, catalog=ORDINARY, mode=DecodeMode.ORDINARY, views=(), costs=None, **kw):
    graphs = tuple(catalog.eligible(mode)) + tuple(extra)
    costs = costs or measured(catalog)
    for g in extra:
        if g.duration_ms:
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    return policy.SelectionInput(list(views), graphs, costs, 0, kw.pop("policy_config", POLICY), mode)


@spec("prerequisites/all-shape-pairs", "prerequisites/joint-cohorts", "prerequisites/following-ready",
      "prerequisites/sequence-score", "prerequisites/age-reset-following", "prerequisites/plan-duration-t",
      "prerequisites/lookahead-not-timing", "prerequisites/first-only-executes", "useful-service/multistage-reference",
      "prerequisites/enabling-kinds")
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
    assert [l.role for l in c.lanes] == [LaneRole.PREREQUISITE]
    assert c.following.graph.batch_capacity == 2 and sorted(c.following.rids) == [1, 2]


@spec("prerequisites/free-unused-capacity", "prerequisites/tie-more-requests")
def test_unused_prerequisite_capacity_advances_more_rows():
    """Six streams blocked behind initialization, an extra INITIALIZE B=4 as fast as B=1 (0.2 ms).

    The pair (initialize, prefill 64) feeds one request to the prefill; B=4 advances three more
    rows in its unused capacity at no extra cost, so its value rate equals B=1's exactly and the
    tie goes to advancing more requests. It never takes more rows than its capacity.
    """
    init4 = GraphDescriptor(GraphKind.INITIALIZE, 4, duration_ms=0.2)
    views = [blocked(i, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=64, last_selected_ns=i) for i in range(6)]
    inp = with_graphs([init4], views=views)
    pairs = {c.graph.batch_capacity: c for c in policy.candidates(inp)
             if c.following is not None and c.following.graph.name == "prefill[B=1,W=64,D=0,C=0,P=0]"}
    one, four = pairs[1], pairs[4]
    assert four.score == one.score and len(one.lanes) == 1
    assert [l.rid for l in four.lanes] == [0, 1, 2, 3] and four.following.rids == (0,)
    assert all(l.role is LaneRole.PREREQUISITE for l in four.lanes)
    c = policy.select(inp)
    assert c.graph.batch_capacity == 4 and len(c.lanes) == 4  # one feeds the prefill, three ride free
    assert c.following.kind is GraphKind.PREFILL


@spec("prerequisites/free-unused-capacity")
def test_a_terminal_snapshot_advances_blocked_rows_in_its_unused_rows():
    """Snapshot B=4 retiring one terminal row also snapshots three of the five streams blocked
    behind a window snapshot, for the same score as retiring the terminal row alone."""
    views = [terminal(0, age_ms=5.0)] + [blocked(i, [GraphKind.SNAPSHOT], Phase.PREFILL, tokens=64)
                                         for i in range(1, 6)]
    snap = next(c for c in policy.candidates(inputs(views, **ORD))
                if c.graph.batch_capacity == 4 and c.following is None and c.lanes[0].role is LaneRole.TERMINAL)
    assert [(l.rid, l.role) for l in snap.lanes] == [(0, LaneRole.TERMINAL)] + [
        (i, LaneRole.PREREQUISITE) for i in (1, 2, 3)]
    # (256 + 1*0.3*(5 + 0.5)) / 0.5 - 0.5/2*1: the free rows add neither value nor cost
    assert snap.score * math.exp(snap.log_scale) == pytest.approx((256 + 0.3 * 5.5) / 0.5 - 0.25)


@spec("prerequisites/first-finishes-terminal")
def test_window_snapshot_also_retires_terminal_rows():
    views = [blocked(1, [GraphKind.SNAPSHOT], Phase.DECODE), terminal(2, age_ms=5.0), decoder(3)]
    cands = [c for c in policy.candidates(inputs(views, **ORD)) if c.following is not None]
    shared = [c for c in cands if c.graph.batch_capacity == 4]
    assert shared and {l.role for l in shared[0].lanes} == {LaneRole.PREREQUISITE, LaneRole.TERMINAL}


@spec("prerequisites/terminal-age-stops", "prerequisites/terminal-two-stage", "useful-service/multistage-reference")
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
    c = next(c for c in policy.candidates(inputs(views, **ORD)) if c.graph.batch_capacity == 4
             and c.following is not None and c.following.graph.name == "decode[B=2,W=1,D=0,C=0,P=2]")
    t, f = 0.5, 3.562
    u = t + f
    new = 88 + 0.1 * u * (10 + u)
    ready = 88 + 0.1 * 3.562 * (10 + u)
    retired = 256 + 0.3 * (5 + t) + (5 * f + (u * u - t * t) / 2)
    scale = math.exp(c.log_scale)
    assert c.sequence_ms == pytest.approx(u) and c.duration_ms == pytest.approx(t)
    assert [(l.rid, l.role) for l in c.lanes] == [(1, LaneRole.PREREQUISITE), (2, LaneRole.TERMINAL)]
    assert c.lanes[1].value * scale == pytest.approx(retired)
    assert {l.rid: l.value * scale for l in c.following.lanes} == pytest.approx({1: new, 3: ready})
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
@pytest.mark.parametrize("snapshot_ms, shared_wins", [(0.3, True), (1.73, True), (1.83, False), (400.0, False)])
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
        assert c.following.graph.name == "decode[B=4,W=1,D=0,C=0,P=4]" and sorted(c.following.rids) == [1, 2, 3]
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
    views = [blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64),
             blocked(2, [GraphKind.RESTORE, GraphKind.SNAPSHOT], Phase.DECODE), decoder(3)]
    c = next(c for c in policy.candidates(with_graphs([r2], views=views)) if c.graph == r2)
    v2 = 88 + 0.1 * 3.831 * (10 + 3.831)
    contributions = [648 * 0.4 / (0.4 + 10.854), v2 * 0.4 / (0.4 + 3.831)]
    scale = math.exp(c.log_scale)
    assert c.following is None and [l.rid for l in c.lanes] == [1, 2]
    assert [l.value * scale for l in c.lanes] == pytest.approx(contributions)
    assert c.score * scale == pytest.approx(sum(contributions) / 0.4 - 0.4 / 2 * 0.2)
    assert c.score * scale == pytest.approx(79.590734, rel=1e-7)


@spec("prerequisites/continuation-unknown", "prerequisites/snapshot-discovery")
def test_unknown_durations_compare_by_value():
    view = blocked(1, [GraphKind.RESTORE, GraphKind.VISION], Phase.PREFILL, tokens=64)
    c = choose([view], catalog=SPEC, costs=CostModel())
    assert c.indeterminate and c.score * math.exp(c.log_scale) == pytest.approx(648.0)


@spec("prerequisites/terminal-lane-value", "prerequisites/terminal-own-value", "prerequisites/terminal-waiting-cost",
      "prerequisites/terminal-same-rules", "prerequisites/terminal-no-priority", "prerequisites/snapshot-no-credit")
def test_terminal_snapshot_value_by_hand():
    """One terminal row aged 20 ms and one decoder. sigma_terminal = 1 * 0.3 ms (snapshot B=1).
    Snapshot: (256 + 1*0.3*(20 + 0.3)) / 0.3 - 0.3/2*(0.1 + 1) = 873.465."""
    views = [terminal(1, age_ms=20.0), decoder(2)]
    snap = next(c for c in policy.candidates(inputs(views, **ORD)) if c.kind is GraphKind.SNAPSHOT)
    assert snap.graph.batch_capacity == 1 and snap.rids == (1,)
    assert snap.score * math.exp(snap.log_scale) == pytest.approx((256 + 0.3 * 20.3) / 0.3 - 0.15 * 1.1)
    assert all(l.expected_tokens == 0 for l in snap.lanes)  # no token or burst credit
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
@pytest.mark.parametrize("overrides, snapshot_score", [
    # no terminal value: only the age term is left, (1*0.3*(20 + 0.3))/0.3 - 0.3/2*(0.1 + 1)
    (dict(terminal_value=0.0), 0.3 * 20.3 / 0.3 - 0.15 * 1.1),
    # no terminal age price: the value alone, 256/0.3 - 0.3/2*0.1, and no terminal waiting cost
    (dict(terminal_age_price=0.0), 256 / 0.3 - 0.15 * 0.1),
])
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
    alone = next(c for c in policy.candidates(inputs([decoder(2, policy_config=pc)], policy_config=pc, **ORD))
                 if c.kind is GraphKind.DECODE)
    gap = alone.score * math.exp(alone.log_scale) - dec.score * math.exp(dec.log_scale)
    assert gap == pytest.approx(dec.duration_ms / 2 * pc.terminal_age_price)


@spec("prerequisites/continuation-unknown", "prerequisites/continuation-value", "prerequisites/continuation-images")
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
