"""K-step decode programs in selection and completion.

A K-step lane earns min(K, output left, context left, width limit) committed tokens and one
delivered burst over the program's measured duration; the selector takes it only when that is
more value per time than single steps, and the completion path commits up to K tokens per lane,
stopping at a stop token or the output limit exactly as single steps do.
"""

import dataclasses
import math

import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.reference import cohorts
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler import policy
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole

from .helpers import (
    ORDINARY,
    POLICY,
    TIMING,
    burst_records,
    choose,
    decoder,
    first_generation_plan,
    inputs,
    k_step_only,
)

spec = pytest.mark.spec
K = 8


def _catalog(speedup: float):
    """The ordinary catalog plus K-step decode programs measured at speedup x K single steps."""
    return with_decode_steps(ORDINARY, (K,), speedup)


@spec("useful-service/score-formula", "useful-service/all-capacities-compete")
@pytest.mark.parametrize("speedup, wins", [(0.5, True), (1.0, False), (1.3, False)])
def test_selector_takes_k_steps_only_when_worth_the_time(speedup, wins):
    views = [decoder(i, age_ms=5.0) for i in range(4)]
    chosen = choose(views, catalog=_catalog(speedup), mode="ordinary")
    assert chosen.kind is GraphKind.DECODE and chosen.served == 4
    assert (chosen.graph.steps == K) is wins
    if wins:  # every lane runs all K steps, one delivery each
        assert [lane.ceiling for lane in chosen.lanes] == [K] * 4
        assert [lane.expected_tokens for lane in chosen.lanes] == [K] * 4


@spec("useful-service/conditional-acceptance", "useful-service/dominance-prune")
def test_steps_respect_limits_and_equal_work_is_the_smaller_program():
    cat = _catalog(0.3)

    def k_step(views):
        return [
            c for c in policy.candidates(inputs(views, catalog=cat, mode="ordinary")) if c.graph.steps == K
        ]

    few = [decoder(0, output_remaining=3), decoder(1, output_remaining=5, width_limit=2)]
    steps = {c.graph.batch_capacity: sorted(lane.ceiling for lane in c.lanes) for c in k_step(few)}
    assert steps == {1: [3], 2: [2, 3]}  # larger batches do the B = 2 program's work: dominated
    # One token left everywhere: a K-step program would do a single step's work, so it is
    # dominated by the single-step program however fast it is measured.
    last = [decoder(i, output_remaining=1) for i in range(3)]
    assert k_step(last) == [] and choose(last, catalog=cat, mode="ordinary").graph.steps == 1
    # With one lane that has more left, the K-step program serves it (and the others with it).
    mixed = last + [decoder(3, output_remaining=50)]
    assert [sorted(lane.ceiling for lane in c.lanes) for c in k_step(mixed)] == [[K], [1, K], [1, 1, 1, K]]


@spec(
    "useful-service/output-progress", "service-accounting/validate-first", "planning-queue/queued-lane-bound"
)
def test_completion_commits_k_tokens_per_lane_and_stops_at_the_end():
    s, plan, fence = first_generation_plan(_catalog(0.3), GraphKind.DECODE)
    assert plan.graph.steps == K and plan.lanes[0].ceiling == 5  # 6 allowed, 1 already out
    assert plan.max_advance(plan.lanes[0]) == 5
    s.commit(plan, fence)
    with pytest.raises(ValueError, match="tokens from a lane of 5 steps"):
        s.complete(fence, burst_records(plan, (1,) * 6), TIMING)  # past the lane's steps: refused
    (gen,) = s.complete(fence, burst_records(plan, (1, 2, 3, 4, 5)), TIMING)
    assert gen.tokens == (1, 2, 3, 4, 5) and gen.finished and gen.finish_reason == "length"
    # A stop token mid-burst ends the output there (the device stops the lane at that step).
    s, plan, fence = first_generation_plan(_catalog(0.3), GraphKind.DECODE, stop_token_ids=(7,))
    s.commit(plan, fence)
    (gen,) = s.complete(fence, burst_records(plan, (1, 7)), TIMING)
    assert gen.tokens == (1, 7) and gen.finish_reason == "stop"


def _largest_single_step(catalog, batch: int):
    """`catalog` without its single-step decode programs above `batch` rows."""
    graphs = tuple(
        g
        for g in catalog.graphs
        if not (g.kind is GraphKind.DECODE and g.steps == 1 and g.batch_capacity > batch)
    )
    return dataclasses.replace(catalog, graphs=graphs)


@spec(
    "useful-service/score-formula",
    "useful-service/dominance-prune",
    "useful-service/burst-one-delivery",
    "verification/mixed-exhaustive",
)
@pytest.mark.parametrize("largest_single", [16, 4])
@pytest.mark.parametrize("outputs", [(1, 1, 1, 3, 50, 1), (1,) * 6], ids=["mixed", "last-tokens"])
@pytest.mark.parametrize("age_price, time_factor", [(0.1, 1.0), (100.0, 1.0), (100.0, 0.02)])
def test_k_step_cohorts_match_enumeration(largest_single, outputs, age_price, time_factor):
    """Every K-step program's best cohort against exhaustive enumeration (reference/cohorts.py),
    including which programs have a legal cohort: with single steps only up to B = 4, a K-step
    program holding more lanes does work no smaller program can, even one step per lane; and with
    an age price that outweighs the lanes' tokens (and programs under and over a millisecond) the
    age terms decide between cohort sizes."""
    pc = dataclasses.replace(POLICY, decode_age_price=age_price)
    cat = _largest_single_step(with_decode_steps(ORDINARY, (4, K), 0.5), largest_single)
    graphs = cat.eligible(DecodeMode.ORDINARY)
    costs = CostModel(pc.estimate_ttl_ns)
    for g in graphs:
        costs.observe(g.key, [g.duration_ms * 1e6 * time_factor], 0)
    views = [decoder(i, age_ms=float(i), output_remaining=n, policy_config=pc) for i, n in enumerate(outputs)]
    inp = policy.SelectionInput(views, graphs, costs, 0, pc, DecodeMode.ORDINARY)
    production: dict = {}
    for row in policy.scored(inp):
        if row.graph.steps > 1:
            production[row.graph.key] = max(production.get(row.graph.key, -math.inf), row.score)
    reference = {
        key: score
        for key, score in cohorts.exhaustive_best(views, graphs, costs, pc, DecodeMode.ORDINARY).items()
        if key.steps > 1
    }
    assert production.keys() == reference.keys()
    for key, score in reference.items():
        assert production[key] == pytest.approx(score, rel=1e-9, abs=1e-12)
    if largest_single == 4:  # six lanes: only a K-step program of B = 8 holds them all
        assert any(key.batch_capacity == 8 for key in reference)


@spec("useful-service/dominance-prune", "useful-service/score-formula")
def test_a_lane_worth_nothing_measurable_still_rides_along():
    """Single steps only up to B = 4: the B = 8 K-step program's cohorts of five and six lanes
    are both legal. A sixth lane whose value vanishes beside the others' (prices some 1e20 times
    smaller) leaves the total unchanged; equal values take more lanes."""
    cat = _largest_single_step(with_decode_steps(ORDINARY, (K,), 0.5), 4)
    views = [decoder(i, x=1e-20, z=1e-20) for i in range(5)] + [decoder(5)]
    (c,) = [
        c
        for c in policy.candidates(inputs(views, catalog=cat, mode="ordinary"))
        if c.graph.steps == K and c.graph.batch_capacity == 8
    ]
    assert sorted(c.rids) == [0, 1, 2, 3, 4, 5]


@spec("prerequisites/all-shape-pairs", "prerequisites/enabling-kinds")
def test_a_prompt_end_capture_is_scheduled_when_every_decode_program_runs_k_steps():
    """With checkpoint retention, a request whose prompt ends at an anchor waits for its SNAPSHOT
    before decoding. The snapshot is valued by the inference that follows it; with no single-step
    decode program in the catalog the follower search must still find one, or the request waits
    forever (the engine found idle with every request blocked on its capture)."""
    s = Scheduler(k_step_only(_catalog(0.3)), kv_pages=96, page_size=16, checkpoints=True, snapshot_rows=4)
    s.seed_costs(0)
    handles = [s.admit([1 + i, 2, 3], max_output=6) for i in range(4)]
    now, snapshots = 0, 0
    for fence in range(1, 40):
        if not s.requests:
            break
        s.advance_to(now * NS_PER_MS)
        plan = s.plan()
        assert plan is not None, {
            h.rid: (s.requests[h.rid].phase, s.requests[h.rid].prerequisites)
            for h in handles
            if h.rid in s.requests
        }
        if plan.kind is GraphKind.SNAPSHOT:  # valued by a K-step follower: 5 tokens left, 1 delivery
            follower = plan.following
            assert follower.graph.steps == K, follower.graph.name
            assert [lane.expected_tokens for lane in follower.lanes] == [5] * len(follower.lanes)
            snapshots += 1
        s.commit(plan, fence)
        now += 10
        s.advance_to(now * NS_PER_MS)
        recs = [
            dataclasses.replace(r, tokens=(1,) * lane.ceiling) if lane.role is LaneRole.DECODE else r
            for lane, r in zip(plan.lanes, burst_records(plan), strict=True)
        ]
        s.complete(fence, recs, TIMING)
    assert not s.requests and snapshots


@spec("useful-service/conditional-acceptance")
def test_a_decoder_with_a_host_token_mask_is_never_a_k_step_lane():
    """A grammar's token mask holds for one sample and K-step programs take no mask, so a
    masked decoder (``host_mask``) rides only single-step programs, directly or as a follower,
    while its unmasked neighbours still get K-step cohorts (K steps here cost 0.3 x K steps)."""
    from helios_jax.scheduler.view import Phase

    from .test_prerequisites import blocked

    cat = _catalog(0.3)
    views = [decoder(0, host_mask=True, width_limit=1), decoder(1), decoder(2, host_mask=True, width_limit=1)]
    cands = policy.candidates(inputs(views, catalog=cat, mode="ordinary"))
    k_step = [c for c in cands if c.graph.steps == K]
    assert k_step and all(sorted(c.rids) == [1] for c in k_step)
    assert any(sorted(c.rids) == [0, 1, 2] and c.graph.steps == 1 for c in cands)

    def k_step_followers(host_mask: bool) -> list:
        followed = [blocked(0, [GraphKind.INITIALIZE], Phase.DECODE, host_mask=host_mask), decoder(1)]
        cands = policy.candidates(inputs(followed, catalog=k_step_only(cat), mode="ordinary"))
        return [c.following for c in cands if c.following is not None and 0 in c.following.rids]

    assert k_step_followers(False) and all(f.graph.steps == K for f in k_step_followers(False))
    assert k_step_followers(True) == []  # with only K-step decode, nothing can follow it
    ready = [blocked(0, [GraphKind.INITIALIZE], Phase.DECODE), decoder(1, host_mask=True)]
    cands = policy.candidates(inputs(ready, catalog=k_step_only(cat), mode="ordinary"))
    follow = [c.following for c in cands if c.following is not None]
    assert follow and all(1 not in f.rids for f in follow)  # a masked ready decoder stays out
    s = Scheduler(cat, kv_pages=64, page_size=16)
    masked, plain = s.admit([1, 2, 3], max_output=6, host_mask=True), s.admit([4, 5], max_output=6)
    assert {v.rid: v.host_mask for v in s.views()} == {masked.rid: True, plain.rid: False}


def test_dominated_steps_are_kept_per_prepared_catalog():
    """The prepared catalog keeps each K-step program's dominated steps (`prepared.dominated_steps`
    in `GenerationRows.dominated`, read by `multistep.multistep_candidate`): the same
    program has other dominators, so another table, in a catalog without the larger single-step
    programs, and each table equals the largest K' among the dominators holding c lanes."""
    from helios_jax.scheduler.policy.prepared import PreparedGraphs

    full = with_decode_steps(ORDINARY, (4, K), 0.5)
    catalogs = [
        PreparedGraphs(c.eligible(DecodeMode.ORDINARY)) for c in (full, _largest_single_step(full, 4))
    ]
    tables = []
    for prepared in catalogs:
        for g in (g for g in prepared.generation if g.steps > 1):
            got = prepared.generation_rows.dominated[g]
            doms = prepared.dominators[g]
            want = [
                max((h.steps for h in doms if h.batch_capacity >= c), default=0)
                for c in range(1, 1 + g.batch_capacity)
            ]
            assert got.tolist() == want and prepared.generation_rows.dominated[g] is got
            assert not got.flags.writeable  # shared by every decision: read-only
        tables.append(
            {g: prepared.generation_rows.dominated[g].tolist() for g in prepared.generation if g.steps > 1}
        )
    assert any(tables[0][g] != kappa for g, kappa in tables[1].items())


@spec("useful-service/score-formula", "useful-service/unknown-optimistic")
def test_an_unmeasured_k_step_program_without_an_age_price_still_offers_its_cohort():
    """With the decode age price at zero and a K-step program not yet measured (its duration
    taken as 0 for the comparison of cohort sizes), the program still offers its largest cohort:
    the age term of that comparison is zero, never undefined."""
    from helios_jax.scheduler.config import PolicyConfig

    from .test_prerequisites import _costs_without

    cat = with_decode_steps(ORDINARY, (4,), 0.5)
    unmeasured = next(g for g in cat.graphs if g.steps == 4 and g.batch_capacity == 4)
    costs = _costs_without(cat, lambda g: g is unmeasured)
    config = PolicyConfig(decode_age_price=0.0)
    views = [decoder(rid, policy_config=config) for rid in range(1, 4)]
    inp = inputs(views, catalog=cat, mode="ordinary", costs=costs, policy_config=config)
    (c,) = [c for c in policy.candidates(inp) if c.graph == unmeasured]
    assert sorted(c.rids) == [1, 2, 3] and c.duration_ms is None
