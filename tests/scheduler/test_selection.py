"""The production selector on the measured synthetic catalogs (spec, "Verification" list).

Each scenario builds request views with prices derived from stated service rates and checks
the program, cohort and work the selector chooses; numbers quoted in docstrings come from the
catalog files (ms) and the PolicyConfig defaults.
"""

import dataclasses
import math

import numpy as np
import pytest

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.rounds import prefix_allocation_order
from helios_jax.scheduler.view import Candidate, Lane, LaneRole

from .helpers import ORDINARY, POLICY, RAGGED, SPEC, choose, decoder, geometric, inputs, measured, prompt

spec = pytest.mark.spec
ORD = dict(catalog=ORDINARY, mode=DecodeMode.ORDINARY)


@spec(
    "useful-service/score-formula",
    "useful-service/t-in-ms",
    "useful-service/sigma-formula",
    "useful-service/sigma-fastest",
    "useful-service/value-rate-accessor",
    "useful-service/log-scale-accessor",
    "intro/value-per-time",
    "intro/decode-age-continuation",
)
def test_score_by_hand():
    """One decoder, x = 2, z = 0.25, A = 10 ms, ordinary catalog.

    Output 64 + 16/2 = 72, delivery 4/0.25 = 16. K = 1, the fastest batch-feasible graph is
    decode B=1 (3.531 ms) so sigma = 3.531 ms. Score = (72 + 16 + 0.1*3.531*(10 + 3.531))/3.531
    - 3.531/2*0.1 = 26.09867; the decision's scale is 1/72 (the largest price).
    """
    c = choose([decoder(1)], **ORD)
    assert c.graph.name == "decode[B=1,W=1,D=0,C=0,P=1]"
    assert c.score * math.exp(c.log_scale) == pytest.approx(26.098668, rel=1e-6)
    assert c.log_scale == pytest.approx(math.log(72.0))


@spec("useful-service/prefill-not-in-k", "useful-service/decoders-only-delivery")
def test_prefill_only_requests_do_not_enlarge_k():
    alone = choose([decoder(1)], **ORD)
    with_prompt = policy.candidates(inputs([decoder(1), prompt(2, 10)], **ORD))
    same = [c for c in with_prompt if c.graph == alone.graph]
    assert same[0].score * math.exp(same[0].log_scale) == pytest.approx(
        alone.score * math.exp(alone.log_scale)
    )


@spec(
    "verification/selector-long-prefills",
    "useful-service/full-prefill-wins",
    "useful-service/no-decoder-no-age",
)
@pytest.mark.parametrize("n", [1, 2, 16])
def test_long_prefills_fill_the_largest_graph(n):
    """4096/89.526 ms = 45.8 prompt tokens per ms beats every smaller chunk (64/4.854 = 13.2)."""
    views = [prompt(i, 10_000, last_selected_ns=100 + i) for i in range(n)]
    c = choose(views)
    assert c.graph.name == "prefill[B=1,W=4096,D=0,C=0,P=0]"
    assert c.lanes[0].prompt_tokens == 4096
    assert c.lanes[0].rid == 0  # equal values: the least recently used request


@spec(
    "verification/selector-tails",
    "useful-service/tail-example",
    "useful-service/prefill-actual-tokens",
    "useful-service/no-smallest-fit-filter",
)
def test_fitting_and_padded_tails():
    assert choose([prompt(1, 64)]).graph.token_capacity == 64  # fitting tail
    padded = choose([prompt(1, 100)])
    assert padded.graph.token_capacity == 128 and padded.lanes[0].prompt_tokens == 100
    # 3000 tokens: the 4096 graph fits everything but 2048/46.5 ms is the better rate
    assert choose([prompt(1, 3000)]).graph.token_capacity == 2048
    # A 4096-token graph on a 64-token tail earns 64 prompt units (and one output token):
    # the same work as the 64-token graph, so it is dominated and never offered.
    cands = policy.candidates(inputs([prompt(1, 64)]))
    assert [c.graph.token_capacity for c in cands if c.kind is GraphKind.PREFILL] == [64]


@spec(
    "verification/selector-acceptance",
    "speculative-coverage/width-one-competes",
    "useful-service/all-capacities-compete",
    "useful-service/expected-scores",
)
def test_high_and_low_acceptance():
    high = choose([decoder(1, survival=geometric(0.95))])
    low = choose([decoder(1, survival=geometric(0.05))])
    assert (high.graph.token_capacity, high.lanes[0].query_length) == (8, 8)
    assert high.lanes[0].expected_tokens == pytest.approx(1 + sum(0.95**d for d in range(1, 8)))
    assert (low.graph.token_capacity, low.graph.proposal_depth) == (1, 0)


@spec("verification/selector-heterogeneous", "useful-service/unconstrained-top-lanes")
def test_heterogeneous_cohort_takes_the_highest_lane_values():
    """Six decoders, only B <= 4 graphs loaded: the four with the highest delivery prices win."""
    views = [
        decoder(i, z=z, survival=geometric(0.6)) for i, z in enumerate([0.5, 0.01, 0.3, 0.02, 0.04, 0.2])
    ]
    inp = inputs(views)
    graphs = [g for g in inp.graphs if g.batch_capacity <= 4 and g.kind is GraphKind.SPECULATIVE]
    c = policy.select(policy.SelectionInput(views, graphs, inp.costs, 0, POLICY))
    assert c.graph.batch_capacity == 4
    assert sorted(c.rids) == [1, 3, 4, 5]  # the lowest delivery rates carry the highest prices


@spec("verification/selector-padded-batches", "useful-service/partial-batch-competes")
def test_padded_batch_capacity_serves_everyone():
    """Three decoders: a batch-4 graph serving three beats a batch-2 graph serving two."""
    c = choose([decoder(i) for i in range(3)], **ORD)
    assert c.graph.batch_capacity == 4 and c.served == 3 and c.padding == 1


@spec("verification/selector-decode-pairs")
def test_long_decode_pairs_share_a_round():
    c = choose([decoder(i, survival=geometric(0.8), output_remaining=4000) for i in range(2)])
    assert c.graph.batch_capacity == 2 and c.served == 2
    assert all(lane.query_length == c.graph.token_capacity for lane in c.lanes)


@spec("verification/selector-contention", "useful-service/knee-small-prefill")
def test_prefill_decode_contention_and_the_knee():
    """Sixteen decoders and an 8000-token prompt whose price rises as it waits.

    Fresh: decoding wins. Near the knee the prompt rides a mixed graph with a 1024-token chunk,
    imposing less waiting on the decoders; a pricier prompt takes longer chunks; alone, the
    same prompt takes the full 4096-token graph.
    """
    decoders = [decoder(i) for i in range(16)]
    assert choose(decoders + [prompt(99, 8000, x=4.0)], **ORD).kind is GraphKind.DECODE
    knee = choose(decoders + [prompt(99, 8000, x=2.0)], **ORD)
    assert knee.kind is GraphKind.MIXED and knee.graph.prefill_capacity == 1024 and knee.served == 16
    later = choose(decoders + [prompt(99, 8000, x=0.6)], **ORD)
    assert later.graph.prefill_capacity == 4096
    assert choose([prompt(99, 8000, x=2.0)], **ORD).graph.token_capacity == 4096


@spec("verification/selector-output-gaps", "useful-service/age-raises-value")
def test_output_age_raises_a_decoders_value():
    young = choose([decoder(1, age_ms=5.0)], **ORD)
    old = choose([decoder(1, age_ms=500.0)], **ORD)
    assert old.score > young.score
    # Against a pending prompt, growing age eventually gives the decoder its turn.

    def views(age):
        return [decoder(1, age_ms=age, x=20.0, z=2.0), prompt(2, 64, x=0.5)]

    assert choose(views(0.0), **ORD).kind is not GraphKind.DECODE
    assert choose(views(5000.0), **ORD).kind is not GraphKind.PREFILL


@spec(
    "verification/selector-expiry",
    "duration-estimates/stale-ranked-measured",
    "duration-estimates/stale-usable",
)
def test_graph_expiry_and_recovery():
    costs = measured(ORDINARY)
    later = POLICY.estimate_ttl_ns + 1
    stale = policy.select(inputs([decoder(1)], costs=costs, now_ns=later, **ORD))
    fresh = policy.select(inputs([decoder(1)], costs=costs, now_ns=0, **ORD))
    assert stale.stale and not fresh.stale
    assert (stale.graph, stale.score) == (fresh.graph, fresh.score)  # measured costs still rank
    costs.observe(stale.graph.key, [3.0e6], later)
    assert not policy.select(inputs([decoder(1)], costs=costs, now_ns=later, **ORD)).stale


@spec(
    "duration-estimates/indeterminate-first",
    "duration-estimates/indeterminate-by-value",
    "useful-service/unknown-optimistic",
)
def test_an_unknown_graph_wins_and_competes_by_value():
    costs = measured(ORDINARY)
    unknown = CostModel()
    for g in ORDINARY.graphs:
        if not (g.kind is GraphKind.DECODE and g.batch_capacity == 4):
            unknown.observe(g.key, [g.duration_ms * 1e6], 0)
    views = [decoder(i) for i in range(3)]
    c = policy.select(inputs(views, costs=unknown, **ORD))
    assert c.indeterminate and c.graph.batch_capacity == 4 and math.isfinite(c.score)
    assert not policy.select(inputs(views, costs=costs, **ORD)).indeterminate
    # With everything unknown the useful value decides: the largest useful chunk for a lone prompt.
    cold = policy.select(inputs([prompt(1, 10_000)], costs=CostModel()))
    assert cold.indeterminate and cold.graph.token_capacity == 4096


@spec(
    "duration-estimates/cold-request-largest",
    "duration-estimates/prefill-explore-smaller",
    "duration-estimates/measured-eligible",
)
def test_prefill_exploration_stops_at_the_next_endpoint():
    """A cold 1000-token prompt whose first message ends at token 100: 128 reaches the endpoint,
    so the unmeasured 256..4096 graphs are not explored; a 64-token prompt explores only 64."""
    cold = CostModel()
    c = policy.select(inputs([prompt(1, 1000, endpoint=100)], costs=cold))
    assert c.graph.token_capacity == 128
    assert policy.select(inputs([prompt(1, 64)], costs=cold)).graph.token_capacity == 64
    # Once the large graph is measured it competes on its cost again.
    big = next(g for g in SPEC.graphs if g.kind is GraphKind.PREFILL and g.token_capacity == 1024)
    cold.observe(big.key, [big.duration_ms * 1e6], 0)
    kinds = {
        x.graph.token_capacity
        for x in policy.candidates(inputs([prompt(1, 1000, endpoint=100)], costs=cold))
        if x.kind is GraphKind.PREFILL
    }
    assert 1024 in kinds and 256 not in kinds


@spec("useful-service/dominance-prune", "useful-service/no-padding-preference")
def test_padding_never_wins_through_timing_noise():
    """Batch 8 measured faster than batch 4 (noise) still never serves three decoders."""
    costs = measured(ORDINARY)
    b4 = next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == 4)
    b8 = next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == 8)
    costs.observe(b8.key, [1.0e6], 0)  # median of {3.748, 1.0} = 2.374 ms < 3.624 ms
    assert costs.estimate_ms(b8.key) < costs.estimate_ms(b4.key)
    c = choose([decoder(i) for i in range(3)], costs=costs, **ORD)
    assert c.graph == b4


@spec("useful-service/dominance-mixed", "verification/mixed-prompt-tails")
def test_mixed_prompt_tail_uses_the_fitting_capacity():
    cands = [
        c for c in policy.candidates(inputs([prompt(1, 40), decoder(2)], **ORD)) if c.kind is GraphKind.MIXED
    ]
    with_prompt = [c for c in cands if c.prefill_row is not None]
    assert {c.graph.prefill_capacity for c in with_prompt} == {64}
    assert {c.graph.batch_capacity for c in with_prompt} == {2}


@spec("useful-service/dominance-speculative")
def test_dominance_requires_equal_proposal_depth():
    """A D=7 program is not pruned by a D=3 one even when both verify four rows."""
    views = [decoder(1, survival=geometric(0.9), output_remaining=4)]
    cands = [c for c in policy.candidates(inputs(views)) if c.kind is GraphKind.SPECULATIVE]
    depths = {(c.graph.batch_capacity, c.graph.proposal_depth) for c in cands}
    assert {(1, 3), (1, 7)} <= depths
    host = [c for c in cands if c.graph.proposal_depth > 0 and c.graph.allocation is Allocation.QUERY_LENGTH]
    assert host and all(c.lanes[0].query_length == 4 for c in host)  # the output limit binds


@spec(
    "verification/mixed-decode-rows",
    "mixed-execution/compare-populations",
    "mixed-execution/prompt-only-legal",
    "mixed-execution/same-score",
    "mixed-execution/step-role",
)
def test_mixed_populations():
    views = [prompt(1, 300, x=0.3), decoder(2, survival=geometric(0.9)), decoder(3, survival=geometric(0.9))]
    cands = [c for c in policy.candidates(inputs(views)) if c.kind is GraphKind.MIXED]
    roles = {tuple(lane.role for lane in c.lanes) for c in cands}
    assert (LaneRole.DECODE, LaneRole.DECODE) in roles  # decode-only population
    assert (LaneRole.PROMPT, LaneRole.DECODE, LaneRole.DECODE) in roles  # prompt row plus decoders
    wide = [c for c in cands if c.graph.token_capacity == 8 and c.prefill_row == 0]
    assert wide and all(lane.query_length == 8 for lane in wide[0].lanes[1:])  # speculative rows
    alone = [c for c in policy.candidates(inputs([prompt(1, 300)])) if c.kind is GraphKind.MIXED]
    assert alone and all(c.served == 1 and c.prefill_row == 0 for c in alone)  # prompt-only is legal


@spec("useful-service/fixed-complete-prefixes", "useful-service/constrained-ragged")
def test_fixed_ragged_keeps_complete_prefixes():
    """ragged-small: fixed width 4, the host ragged program (B=4, P=6) can take one lane of four
    rows and two lanes limited to one row each (6 rows), never a shortened width."""
    views = [
        decoder(1, survival=geometric(0.9, 3), output_remaining=100),
        decoder(2, survival=geometric(0.9, 3), output_remaining=1),
        decoder(3, survival=geometric(0.9, 3), output_remaining=1),
    ]
    costs = measured(RAGGED)
    inp = inputs(views, catalog=RAGGED, mode=DecodeMode.FIXED, costs=costs, fixed_width=4)
    ragged = [c for c in policy.candidates(inp) if c.graph.target_capacity == 6]
    assert len(ragged) == 1
    assert sorted((lane.rid, lane.query_length) for lane in ragged[0].lanes) == [(1, 4), (2, 1), (3, 1)]


@spec(
    "useful-service/adaptive-orderings",
    "useful-service/adaptive-causal-pricing",
    "speculative-coverage/prefix-limit-ceilings",
    "speculative-coverage/ceiling-bound",
    "speculative-coverage/price-full-program",
    "speculative-coverage/prices-rank-cohorts",
)
def test_device_allocated_cohort_is_priced_by_its_causal_allocation():
    """ragged-small's device program (B=4, W=4, P=8) with four decoders of ceiling 4 (16 > 8).

    Forecasts differ from acceptance: the device will give the extra rows to the lanes with
    the best joint prefix probabilities (forecast), and the host prices exactly that allocation.
    """
    views = [
        decoder(i, survival=geometric(0.9, 3), forecast=geometric(f, 3))
        for i, f in enumerate([0.95, 0.9, 0.2, 0.1])
    ]
    inp = inputs(views, catalog=RAGGED)
    c = next(x for x in policy.candidates(inp) if x.graph.allocation is Allocation.PREFIX_LIMIT)
    assert all(lane.ceiling == 4 and lane.query_length == 0 for lane in c.lanes)  # immutable ceilings
    expected = {lane.rid: lane.expected_tokens for lane in c.lanes}
    # Four pending rows, then the frontier by forecast: lane 0 d1 (0.95), lane 0 d2 (0.9025),
    # lane 1 d1 (0.9), lane 0 d3 (0.857): lane 0 reaches its ceiling 4, lane 1 gets 2 rows.
    assert expected[0] == pytest.approx(1 + 0.9 + 0.81 + 0.729) and expected[1] == pytest.approx(1.9)
    assert expected[2] == pytest.approx(1.0) and expected[3] == pytest.approx(1.0)


@spec("useful-service/max-64-slots")
def test_selection_is_bounded_to_64_slots():
    with pytest.raises(ValueError, match="64 request slots"):
        choose([decoder(i) for i in range(65)])


@spec("useful-service/no-subset-enumeration", "useful-service/adaptive-not-exhaustive")
def test_sixty_four_requests_select_quickly():
    """2^64 subsets would never finish; the selector is polynomial (well under a second here)."""
    import time

    views = [decoder(i, survival=geometric(0.7)) for i in range(40)] + [
        prompt(100 + i, 900) for i in range(24)
    ]
    start = time.perf_counter()
    c = choose(views)
    assert time.perf_counter() - start < 1.0 and c is not None


@spec("useful-service/shared-scale")
def test_extreme_prices_stay_representable():
    """A request unserved for minutes has x ~ e^-2000: its price needs the shared scale."""
    starving = prompt(1, 64, log_x=-2000.0)
    c = choose([starving, decoder(2)])
    assert c.rids[0] == 1 and c.log_scale > 1900 and math.isfinite(c.score) and c.score > 0


@spec("duration-estimates/tie-order")
def test_tie_order():
    """Equal value rates: shorter known time, more requests, least recently used, less padding."""
    views = [prompt(1, 64, last_selected_ns=5), prompt(2, 64, last_selected_ns=1)]
    assert choose(views).rids == (2,)
    a, b = policy.candidates(inputs([prompt(1, 64)]))[0], policy.candidates(inputs([prompt(2, 64)]))[0]
    import dataclasses

    quick = dataclasses.replace(b, duration_ms=a.duration_ms - 1)
    assert policy.better(quick, a, {}) and not policy.better(a, quick, {})
    assert policy.better(dataclasses.replace(a, score=a.score + 1), quick, {})


def _tied(batch, rids, duration_ms=3.6, score=10.0, width=None):
    """A candidate on decode B=batch, or on speculative B=batch W=width with one row per lane."""
    graph = next(
        g
        for g in (ORDINARY.graphs if width is None else SPEC.graphs)
        if g.batch_capacity == batch
        and (
            g.kind is GraphKind.DECODE
            if width is None
            else g.kind is GraphKind.SPECULATIVE and g.token_capacity == width
        )
    )
    lanes = tuple(Lane(r, r, LaneRole.DECODE, query_length=1) for r in rids)
    return Candidate(
        graph=graph, lanes=lanes, duration_ms=duration_ms, score=score, useful_value=score, log_scale=0.0
    )


@spec("duration-estimates/tie-order")
@pytest.mark.parametrize(
    "case, winner, loser",
    [
        # each winner loses every later criterion, so only its own criterion can decide
        ("shorter known time", _tied(2, [1], duration_ms=3.5), _tied(4, [2, 3])),
        ("more served requests", _tied(4, [1, 2, 3]), _tied(2, [4, 5])),
        ("less recently used", _tied(4, [6, 7]), _tied(2, [4, 5])),
        ("smaller padding", _tied(2, [4, 5]), _tied(4, [4, 5])),
        # padding 2 of 4 rows against 6 of 8: the larger physical shape with less padding wins
        ("smaller padding, larger shape", _tied(4, [4, 5], width=1), _tied(2, [4, 5], width=4)),
        ("equal within rounding", _tied(2, [2], score=10.0), _tied(2, [1], score=10.0 * (1 + 1e-12))),
    ],
)
def test_each_tie_break_decides_in_its_order(case, winner, loser):
    """Requests 6 and 7 were selected longest ago (recency 1, 2), request 1 most recently (9)."""
    recency = {1: 9, 2: 8, 3: 8, 4: 5, 5: 5, 6: 1, 7: 2}
    assert policy.better(winner, loser, recency) and not policy.better(loser, winner, recency)


@spec("duration-estimates/tie-order")
def test_equal_lane_values_take_the_least_recently_used_requests():
    """Three identical decoders and only batch-two decode: the cohort is the two served longest
    ago (recency 10 and 20), whatever their slots."""
    views = [
        decoder(1, last_selected_ns=30, slot=0),
        decoder(2, last_selected_ns=10, slot=2),
        decoder(3, last_selected_ns=20, slot=1),
    ]
    b2 = next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == 2)
    inp = inputs(views, **ORD)
    c = policy.select(policy.SelectionInput(views, [b2], inp.costs, 0, POLICY, DecodeMode.ORDINARY))
    assert sorted(c.rids) == [2, 3]
    # A request never selected (no last selection) is the least recently used of all.
    views[0] = decoder(1, slot=0)
    c = policy.select(policy.SelectionInput(views, [b2], inp.costs, 0, POLICY, DecodeMode.ORDINARY))
    assert sorted(c.rids) == [1, 2]


@spec("policy/zero-removes", "useful-service/no-decoder-no-age")
def test_throughput_preset_drops_age_and_delivery_terms():
    thr = PolicyConfig.preset("throughput")
    c = choose([decoder(1, age_ms=1e6, policy_config=thr)], policy_config=thr, **ORD)
    # Without age and delivery, the value is the output token alone: (64 + 8) / 3.531 ms.
    assert c.score * math.exp(c.log_scale) == pytest.approx(72.0 / 3.531)


@spec("confidence-acceptance/alpha-exponent")
def test_alpha_raises_every_survival_estimate_in_the_score():
    """adaptive_verification_alpha = 2, one decoder with survival 0.9**d, x = 2, z = 0.25, A = 10.

    The host program B=1 W=8 (5.442 ms) expects E = 1 + sum_{d=1..7} 0.81**d = 4.287884 tokens
    (alpha 1 would give 5.217031). K = 1 and sigma = 3.581 ms (B=1 W=1), so its score is
    (72*E + 16 + 0.1*3.581*(10 + 5.442))/5.442 - 5.442/2*0.1 = 60.414676.
    """
    squared = PolicyConfig(adaptive_verification_alpha=2.0)
    view = decoder(1, survival=geometric(0.9), policy_config=squared)
    w8 = next(
        c
        for c in policy.candidates(inputs([view], policy_config=squared))
        if c.graph.name == "speculative[B=1,W=8,D=7,C=0,P=8]"
    )
    assert w8.lanes[0].query_length == 8
    assert w8.lanes[0].expected_tokens == pytest.approx(4.2878841, rel=1e-7)
    assert w8.score * math.exp(w8.log_scale) == pytest.approx(60.414676, rel=1e-7)


@spec("confidence-acceptance/alpha-exponent")
def test_alpha_ranks_the_rows_of_a_host_ragged_program():
    """ragged-small's host program B=4, W=4, P=6 in adaptive mode; alpha = 2; two decoders with
    survival 0.8**d: lane 0 at x = 0.5 (output price 64 + 32 = 96), lane 1 at x = 2 (72).

    Four extension rows fit beside the two pending rows. Their values are price * s_d**alpha:
    lane 0: 61.44, 39.32, 25.17; lane 1: 46.08, 29.49, 18.87, so each lane gets two proposals
    (3 rows, E = 1 + 0.64 + 0.4096 = 2.0496). With alpha 1 (76.8, 61.44, 49.15 against 57.6,
    46.08, 36.86) lane 0 would take all three proposals and lane 1 one.
    """
    squared = PolicyConfig(adaptive_verification_alpha=2.0)
    views = [
        decoder(0, x=0.5, survival=geometric(0.8, 3), policy_config=squared),
        decoder(1, x=2.0, survival=geometric(0.8, 3), policy_config=squared),
    ]
    c = next(
        c
        for c in policy.candidates(inputs(views, catalog=RAGGED, policy_config=squared))
        if c.graph.name == "speculative[B=4,W=4,D=3,C=0,P=6]"
    )
    assert sorted((lane.rid, lane.query_length) for lane in c.lanes) == [(0, 3), (1, 3)]
    assert [lane.expected_tokens for lane in c.lanes] == pytest.approx([2.0496, 2.0496])


def _adaptive(base, extension, ceilings, batch, rows):
    """utility.adaptive_ragged with host allocation: extension rows by marginal value."""
    base, extension, ceilings = np.array(base, float), np.array(extension, float), np.array(ceilings)
    lanes, depths = prefix_allocation_order(extension, ceilings)
    total, cohort, alloc = utility.adaptive_ragged(base, extension, ceilings, lanes, depths, batch, rows)
    return total, cohort, alloc.tolist()


@spec("useful-service/adaptive-orderings", "useful-service/adaptive-causal-pricing")
@pytest.mark.parametrize(
    "case, base, extension, ceilings, batch, rows, expect",
    [
        # Total lane value: lane 1 is worth 1 + 3*3 = 10 alone; lane 0 has the higher pending value
        # (5) and value per row (5 against 2.5), so only the total ordering reaches 10.
        ("total", [5, 1], [[0, 0, 0], [3, 3, 3]], [1, 4], 1, 4, (10.0, [1], [0, 4])),
        # Pending-token value: totals 20, 12, 16 and values per row 6.7, 4, 5.3 both start with
        # lanes 0 and 2 (best 20: lane 0 with both proposals). By pending value lanes 1 and 0
        # take the three rows: 9 + 6 + lane 0's first proposal 8 = 23.
        ("pending", [6, 9, 3], [[8, 6], [3, 0], [8, 5]], [3, 3, 3], 2, 3, (23.0, [0, 1], [2, 1, 0])),
        # Value per target row: lane 0 (3 per row, one row) and lane 1 (7 over 3 rows) fill P = 3
        # best: 3 + 2 + 2.5 = 7.5. By total (7, 5.5, 3) the best prefix is 7 (lane 1 alone, or
        # lanes 1 and 2: 4.5 + 2.5); by pending value (3, 2.5, 2) lanes 0 and 2 give 5.5 + 1.5 = 7.
        ("per-row", [3, 2, 2.5], [[0, 0], [2.5, 2.5], [1.5, 1.5]], [1, 3, 3], 2, 3, (7.5, [0, 1], [1, 2, 0])),
    ],
)
def test_adaptive_ragged_searches_three_orderings(case, base, extension, ceilings, batch, rows, expect):
    """Each case is won by exactly one of the three bounded orderings."""
    total, cohort, alloc = _adaptive(base, extension, ceilings, batch, rows)
    assert (total, cohort, alloc) == (pytest.approx(expect[0]), expect[1], expect[2])


@spec("mixed-execution/same-score", "mixed-execution/compare-populations")
def test_mixed_populations_share_one_score_by_hand():
    """A 40-token prompt (x = 0.3) and two decoders (x = 2, z = 0.25, A = 10), ordinary catalog.
    K = 2 and sigma = 3.562 (decode B=2). The prompt row is worth its 40 tokens at 1 + 16/0.3 plus
    its first output token at 64 + 16/0.3 = 2290.667 (the 24 unused prompt tokens earn nothing);
    each decoder 88 + 0.1*3.562*(10 + T). Every population is divided by the full duration and
    pays the same waiting cost T/2 * 0.2:
    - mixed B=4 C=64 (4.947 ms), prompt and both decoders: 500.276456;
    - mixed B=2 C=64 (4.885 ms), prompt and one decoder: 487.529658;
    - mixed B=2 C=64, both decoders, no prompt: 37.710901.
    """
    views = [prompt(1, 40, x=0.3), decoder(2), decoder(3)]
    mixed = {
        (c.graph.batch_capacity, c.prefill_row): c
        for c in policy.candidates(inputs(views, **ORD))
        if c.kind is GraphKind.MIXED and c.graph.prefill_capacity == 64
    }
    prompt_value = (1 + 16 / 0.3) * 40 + (64 + 16 / 0.3)

    def by_hand(t, prompts, decoders):
        return (prompts * prompt_value + decoders * (88 + 0.1 * 3.562 * (10 + t))) / t - t / 2 * 0.2

    for (batch, row), t, prompts, decoders, figure in [
        ((4, 0), 4.947, 1, 2, 500.276456),
        ((2, 0), 4.885, 1, 1, 487.529658),
        ((2, None), 4.885, 0, 2, 37.710901),
    ]:
        c = mixed[(batch, row)]
        assert c.served == prompts + decoders
        assert c.score * math.exp(c.log_scale) == pytest.approx(by_hand(t, prompts, decoders))
        assert c.score * math.exp(c.log_scale) == pytest.approx(figure, rel=1e-7)


@spec("duration-estimates/prefill-explore-smaller", "duration-estimates/cold-request-largest")
def test_exploration_exclusion_does_not_depend_on_catalog_order():
    """The exploration rule of test_prefill_exploration_stops_at_the_next_endpoint with the
    prepared programs listed largest first: 128 still reaches the endpoint at token 100, so
    no unmeasured 256..4096 chunk is explored, whichever smaller capacity is listed last."""
    graphs = tuple(reversed(SPEC.eligible(DecodeMode.ADAPTIVE)))
    c = policy.select(policy.SelectionInput([prompt(1, 1000, endpoint=100)], graphs, CostModel(), 0, POLICY))
    assert c.indeterminate and c.graph.token_capacity == 128 and c.lanes[0].prompt_tokens == 128


def _fixed_ragged_views():
    """Four decoders at x = 2, z = 0.25 on ragged-small in fixed mode (width 4): X (survival 0.9**d,
    four rows), Y (two rows: output limit 2, s_1 = 0.5, age 118 ms), C and D (one row each:
    output limit 1)."""
    return [
        decoder(0, survival=geometric(0.9, 3), age_ms=0.0),
        decoder(1, survival=geometric(0.5, 3), age_ms=118.0, output_remaining=2),
        decoder(2, survival=geometric(0.9, 3), age_ms=0.0, output_remaining=1),
        decoder(3, survival=geometric(0.9, 3), age_ms=0.0, output_remaining=1),
    ]


@spec(
    "useful-service/constrained-ragged",
    "useful-service/score-formula",
    "useful-service/fixed-complete-prefixes",
)
def test_fixed_ragged_cohorts_count_each_served_lanes_age_term():
    """The host ragged program B=4, W=4, P=6 (4.5 ms) with the four decoders of
    _fixed_ragged_views. K = 4; sigma = 4 * 4.5/4 = 4.5 ms (the fastest per stream of the fixed
    width-4 programs); each served decoder earns c*sigma*(A + T), so c*sigma*T = 0.1*4.5*4.5 =
    2.025 per lane on top of its value at T = 0:
    X 72*(1 + 0.9 + 0.81 + 0.729) + 16 = 263.608; Y 72*1.5 + 16 + 0.45*118 = 177.1; C = D = 88.
    Six rows hold X with Y (177.1 + 2*2.025 = 181.15 beside X) or X with C and D
    (176 + 3*2.025 = 182.075): the third lane's age term decides for C and D. Score
    (263.608 + 176 + 3*2.025)/4.5 - 4.5/2*0.4 = 98.140667."""
    inp = inputs(_fixed_ragged_views(), catalog=RAGGED, mode=DecodeMode.FIXED, fixed_width=4)
    c = next(c for c in policy.candidates(inp) if c.graph.name == "speculative[B=4,W=4,D=3,C=0,P=6]")
    assert sorted((lane.rid, lane.query_length) for lane in c.lanes) == [(0, 4), (2, 1), (3, 1)]
    assert c.score * math.exp(c.log_scale) == pytest.approx(98.140667, rel=1e-7)
    scale = math.exp(c.log_scale)
    assert sorted(lane.value * scale for lane in c.lanes) == pytest.approx(
        [88 + 2.025, 88 + 2.025, 263.608 + 2.025]
    )


@spec(
    "useful-service/dominance-prune",
    "useful-service/dominance-speculative",
    "useful-service/no-padding-preference",
)
def test_a_larger_host_ragged_program_with_the_same_cohort_is_pruned():
    """ragged-small in fixed mode plus a host ragged program B=4, W=4, P=7 measured faster
    (4.4 ms) than P=6 (4.5 ms). Decoders X (four rows) and C (one row, output limit 1) fit six
    rows: both programs would run the same cohort with the same widths, so the P=7 shape, all
    capacities at least P=6's and P larger, is discarded. With Y as well (two rows, seven in
    all) the cohorts differ and P=7 competes: it serves all three, P=6 takes X with Y (Y's age
    makes it worth about twice C)."""
    p7 = GraphDescriptor(
        GraphKind.SPECULATIVE,
        4,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=7,
        allocation=Allocation.QUERY_LENGTH,
        duration_ms=4.4,
    )
    costs = measured(RAGGED)
    costs.observe(p7.key, [4.4e6], 0)
    graphs = RAGGED.eligible(DecodeMode.FIXED, fixed_width=4) + (p7,)

    def ragged(views):
        inp = policy.SelectionInput(views, graphs, costs, 0, POLICY, DecodeMode.FIXED)
        return {
            c.graph.target_capacity: sorted((lane.rid, lane.query_length) for lane in c.lanes)
            for c in policy.candidates(inp)
            if c.graph.batch_capacity == 4 and c.graph.token_capacity == 4
        }

    x, y, c_ = _fixed_ragged_views()[0], _fixed_ragged_views()[1], _fixed_ragged_views()[2]
    assert ragged([x, c_]) == {6: [(0, 4), (2, 1)]}
    assert ragged([x, y, c_]) == {6: [(0, 4), (1, 2)], 7: [(0, 4), (1, 2), (2, 1)]}


@spec("duration-estimates/tie-order")
def test_a_request_never_selected_counts_as_the_least_recently_used():
    """Two candidates equal in score, time, served requests: one serves request 1 (last selected
    at 5 ns), the other request 2, absent from the recency map because it was never selected.
    Absent means never, the RequestView default last_selected_ns = -1, older than any
    selection time: the never-selected request wins, in both argument orders."""
    recent, never = _tied(2, [1]), _tied(2, [2])
    recency = {1: 5}
    assert policy.better(never, recent, recency)
    assert not policy.better(recent, never, recency)


@spec("duration-estimates/tie-order")
def test_a_candidate_is_never_preferred_to_an_identical_one():
    """Two candidates equal in every tie criterion, down to the physical shape and the request
    identities, are not ordered: `better` is a strict preference (false both ways, and false
    for a candidate against itself), so `best` keeps the first of them rather than letting
    list order flip the choice each time it is scanned."""
    a, b = _tied(2, [1, 2]), _tied(2, [1, 2])
    recency = {1: 3, 2: 4}
    assert not policy.better(a, a, recency)
    assert not policy.better(a, b, recency) and not policy.better(b, a, recency)
    views = [decoder(1, last_selected_ns=3), decoder(2, last_selected_ns=4)]
    assert policy.best([a, b], views) is a and policy.best([b, a], views) is b


@spec("acceptance-learning/probe-deeper", "speculative-coverage/wp-not-imply-d")
def test_the_drafted_programs_are_every_speculative_program_with_a_proposal():
    """Acceptance probes choose among the drafted programs: every complete speculative program
    with at least one proposal, down to D = 1 (a width-two program, which offers a request one
    depth beyond width one), and no width-one program, decode, mixed or prerequisite."""
    d1 = GraphDescriptor(
        GraphKind.SPECULATIVE,
        1,
        token_capacity=2,
        proposal_depth=1,
        target_capacity=2,
        allocation=Allocation.QUERY_LENGTH,
        duration_ms=3.9,
    )
    graphs = SPEC.eligible(DecodeMode.ADAPTIVE) + (d1,)
    drafted = policy.PreparedGraphs(graphs).drafted()
    want = {g for g in graphs if g.kind is GraphKind.SPECULATIVE and g.token_capacity > 1}
    assert d1 in want and set(drafted.graphs) == want
    assert all(g.proposal_depth >= 1 for g in drafted.graphs)


@spec("duration-estimates/tie-order", "useful-service/full-prefill-wins")
def test_prompt_values_equal_within_rounding_go_to_the_least_recently_used():
    """Two 10000-token prompts for the 4096-token chunk whose values differ only by rounding
    (token rates 2 and 2*(1 + 1e-11): prefill prices 9 and 9 - 8e-11, values about 512 on the
    decision's scale, 1e-11 of it apart). The tie tolerance is relative (1e-9 of the larger
    value), so they are equal and the chunk goes to the request selected longest ago, the
    slightly cheaper one, just as two identical prompts would."""
    views = [
        prompt(1, 10_000, log_x=math.log(2.0), last_selected_ns=5),
        prompt(2, 10_000, log_x=math.log(2.0 * (1 + 1e-11)), last_selected_ns=1),
    ]
    # 4096 tokens at 1 + 16/x each, on the scale of the largest price (64 + 16/2 = 72)
    v1, v2 = ((1 + 16 / x) * 4096 / 72 for x in (2.0, 2.0 * (1 + 1e-11)))
    assert v1 > v2 > 1.0 and utility.nearly_equal(v1, v2) and (v1 - v2) > 1e-9 / v1
    c = choose(views)
    assert c.graph.token_capacity == 4096 and c.rids == (2,)
    assert c.useful_value == pytest.approx(v2, rel=1e-12)


@spec("useful-service/sigma-fastest", "useful-service/sigma-formula", "acceptance-learning/probe-can-beat")
def test_a_subset_of_programs_is_scored_on_the_whole_decisions_scale():
    """Acceptance probes score only the drafted programs, passing every loaded program as the
    reference. Three decoders on the speculative catalog: sigma comes from the fastest
    batch-feasible program of all (speculative B=4 W=1, 3.674 ms for three streams), which the
    drafted subset lacks, so each drafted program scores exactly as in the full decision;
    without the reference the subset would set its own, slower sigma."""
    views = [decoder(i, survival=geometric(0.8), age_ms=50.0) for i in range(3)]
    inp = inputs(views)
    full = {c.graph: c.score for c in policy.candidates(inp)}
    prepared = policy.PreparedGraphs(inp.graphs)
    sub = dataclasses.replace(inp, graphs=prepared.drafted(), reference=prepared)
    scored = {c.graph: c.score for c in policy.candidates(sub)}
    assert scored and all(g.proposal_depth > 0 for g in scored)
    assert scored == pytest.approx({g: full[g] for g in scored}, rel=1e-12)
    alone = {c.graph: c.score for c in policy.candidates(dataclasses.replace(sub, reference=None))}
    assert all(alone[g] != pytest.approx(full[g], rel=1e-9) for g in alone)


MIXED_ONLY = tuple(g for g in ORDINARY.graphs if g.kind is GraphKind.MIXED)


@spec(
    "mixed-execution/compare-populations",
    "useful-service/partial-batch-competes",
    "useful-service/dominance-mixed",
)
def test_every_mixed_shape_offers_its_decode_only_cohort_without_prompts():
    """Only mixed programs loaded, three decoders and no prompt waiting: each (B, W, D) shape
    still competes with its decode-only cohort on its smallest prompt capacity. B=2 serves two
    decoders, B=4 all three (B=8 and B=16 would serve the same three and are dominated), and
    B=4 wins: three lanes at 4.947 ms beat two at 4.885 ms."""
    views = [decoder(i) for i in range(3)]
    inp = policy.SelectionInput(views, MIXED_ONLY, measured(ORDINARY), 0, POLICY, DecodeMode.ORDINARY)
    offered = {(c.graph.batch_capacity, c.graph.prefill_capacity, c.served) for c in policy.candidates(inp)}
    assert offered == {(2, 64, 2), (4, 64, 3)}
    c = policy.select(inp)
    assert (c.graph.batch_capacity, c.served, c.prefill_row) == (4, 3, None)


def _mixed(batch, capacity, ms):
    return GraphDescriptor(
        GraphKind.MIXED,
        batch,
        token_capacity=1,
        prefill_capacity=capacity,
        target_capacity=capacity + batch - 1,
        duration_ms=ms,
    )


@spec(
    "useful-service/dominance-mixed", "useful-service/dominance-prune", "useful-service/no-padding-preference"
)
@pytest.mark.parametrize("order", ["as listed", "reversed"])
def test_a_mixed_prompt_row_is_dominated_by_the_largest_smaller_capacity_that_serves_it(order):
    """Mixed shapes B=2 C=256, B=4 C=128 and B=4 C=512, one decoder and a 200-token prompt.
    B=2 C=256 runs the prompt row and the decoder with the same work as B=4 C=512 (both
    capacities hold all 200 tokens), so the larger shape's prompt candidate is discarded
    even when it is measured faster; B=4 C=128 consumes only 128 tokens and competes. The
    decision uses the largest dominating capacity, whichever order the programs are listed."""
    graphs = [_mixed(2, 256, 9.0), _mixed(4, 128, 6.3), _mixed(4, 512, 5.0)]
    graphs = graphs if order == "as listed" else graphs[::-1]
    costs = CostModel()
    for g in graphs:
        costs.observe(g.key, [g.duration_ms * 1e6], 0)
    views = [decoder(1), prompt(2, 200)]
    inp = policy.SelectionInput(views, graphs, costs, 0, POLICY, DecodeMode.ORDINARY)
    with_prompt = {
        (c.graph.batch_capacity, c.graph.prefill_capacity): c.lanes[c.prefill_row].prompt_tokens
        for c in policy.candidates(inp)
        if c.prefill_row is not None
    }
    assert with_prompt == {(2, 256): 200, (4, 128): 128}


@spec(
    "useful-service/adaptive-causal-pricing",
    "useful-service/score-formula",
    "useful-service/constrained-ragged",
)
def test_an_adaptive_ragged_cohort_counts_each_lanes_age_term_over_the_program():
    """ragged-small's host program B=4, W=4, P=6 (4.5 ms), adaptive mode. Decoders 0 and 1 at
    x = 0.1 (output price 224) with survival 0.99**d, decoder 2 at x = 2, z = 0.25 (72 + 16)
    with output age 357.4 ms. K = 3, sigma = 3.68 ms (B=4 W=1), c*sigma = 0.368.
    Serving decoder 2 takes the row that would otherwise give decoder 1 its second proposal,
    worth 224*0.99**2 = 219.54. Decoder 2 is worth 88 + 0.368*(357.4 + 4.5) = 221.18: the
    age it accrues over the program's own 4.5 ms (1.66) is what tips it above that row, so
    the cohort serves all three (rows 3, 2, 1: 686.64 + 467.10 + 221.18 against 2*686.64)."""
    views = [
        decoder(0, x=0.1, survival=geometric(0.99, 3)),
        decoder(1, x=0.1, survival=geometric(0.99, 3)),
        decoder(2, age_ms=357.4, survival=geometric(0.5, 3)),
    ]
    c = next(
        c
        for c in policy.candidates(inputs(views, catalog=RAGGED))
        if c.graph.name == "speculative[B=4,W=4,D=3,C=0,P=6]"
    )
    assert sorted(lane.query_length for lane in c.lanes) == [1, 2, 3] and sorted(c.rids) == [0, 1, 2]
    scale = math.exp(c.log_scale)
    lane2 = next(lane for lane in c.lanes if lane.rid == 2)
    assert lane2.value * scale == pytest.approx(88 + 0.368 * (357.4 + 4.5))
    assert lane2.value * scale > 224 * 0.99**2 > 88 + 0.368 * 357.4


@spec(
    "speculative-coverage/prefix-limit-ceilings",
    "speculative-coverage/frontier-ties",
    "speculative-coverage/prices-rank-cohorts",
)
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2)])
def test_price_ceilings_break_frontier_ties_by_slot_whatever_the_view_order(order):
    """ragged-small's device program B=4, W=4, D=3, P=8, all three decoders at z = 0.01.
    Requests 5 (slot 1) and 6 (slot 0): x = 100 (output price 64.16), forecast 0.9**d; request
    7 (slot 2): x = 0.05 (price 384), forecast 0.5**d. Five rows beyond the pending ones.
    The device's frontier by forecast: 0.9, 0.9, 0.81, 0.81, then the 0.729 tie goes to the
    lower slot: slot 0 gets 4 rows, slot 1 3, request 7 one. Priced by forecast times price:
    192, 96 (request 7), 57.7, 57.7, then the 51.9 tie again to the lower slot: slot 0 3,
    slot 1 2, request 7 3. Both H lanes get fewer priced rows, so their ceilings drop to 3
    (slot 0) and 2 (slot 1); request 7 keeps 4, and the device then gives it the two rows
    left (E = 1.75). The frontier orders lanes by slot, never by where a request is listed."""
    views = [
        decoder(5, slot=1, x=100.0, z=0.01, survival=geometric(0.9, 3)),
        decoder(6, slot=0, x=100.0, z=0.01, survival=geometric(0.9, 3)),
        decoder(7, slot=2, x=0.05, z=0.01, survival=geometric(0.5, 3)),
    ]
    c = next(
        c
        for c in policy.candidates(inputs([views[i] for i in order], catalog=RAGGED))
        if c.graph.name == "speculative[B=4,W=4,D=3,C=0,P=8]"
    )
    assert {lane.rid: lane.ceiling for lane in c.lanes} == {5: 2, 6: 3, 7: 4}
    assert {lane.rid: lane.expected_tokens for lane in c.lanes} == pytest.approx({5: 1.9, 6: 2.71, 7: 1.75})


@spec("duration-estimates/tie-order")
@pytest.mark.parametrize("order", ["as admitted", "reversed"])
def test_equal_lanes_of_one_cohort_go_to_the_least_recently_used_whatever_the_view_order(order):
    """ragged-small's device program (B=4, W=4, D=3, P=8) alone: two decoders of equal value
    (rate, survival, age) compete for the rows left beside a third. Cohorts {6, 7} and {5, 7}
    tie in value, time and served requests, so the less recently used request, 6 (selected at
    1 ns against 10 ns), is served, however the views are listed."""
    from .helpers import RAGGED

    device = dataclasses.replace(
        RAGGED,
        graphs=tuple(
            g
            for g in RAGGED.graphs
            if g.kind is GraphKind.SPECULATIVE
            and g.batch_capacity == 4
            and g.allocation is not None
            and g.allocation.value == "prefix_limit"
        ),
    )
    views = [
        decoder(5, slot=1, x=100.0, survival=geometric(0.9, 3), last_selected_ns=10),
        decoder(6, slot=0, x=100.0, survival=geometric(0.9, 3), last_selected_ns=1),
        decoder(7, slot=2, x=0.05, survival=geometric(0.5, 3)),
    ]
    if order == "reversed":
        views = views[::-1]
    chosen = policy.select(inputs(views, catalog=device))
    served = {lane.rid for lane in chosen.lanes}
    assert 6 in served and 5 not in served


@spec("useful-service/prefill-logical-limits", "prerequisites/atomic-span-chunk")
def test_a_prompt_chunk_that_can_consume_nothing_is_never_a_candidate():
    """An image span from the cursor that the smaller chunks cannot hold whole, or a prompt stopped
    at its limit: those chunks offer that prompt no prefill, not a chunk that consumes nothing."""
    spanned = prompt(1, 500, atomic_spans=((0, 300),))
    stopped = prompt(2, 500, prompt_limit=0)
    for catalog in (SPEC, ORDINARY):
        mode = DecodeMode.ORDINARY if catalog is ORDINARY else DecodeMode.ADAPTIVE
        cands = policy.candidates(inputs([spanned, stopped], catalog=catalog, mode=mode))
        prefill = [c for c in cands if c.kind.is_prefill]
        assert prefill and all(c.graph.token_capacity >= 300 for c in prefill)
        assert all(lane.rid == 1 and lane.prompt_tokens > 0 for c in prefill for lane in c.lanes)
