"""Which rows a two-stage sequence's following program takes: multi-row prefill followers,
mixed followers' prompt rows, K-step followers and host-masked decoders, and the dominance
filter over sequence candidates (each test names the rows by hand; lane values against the
reference's prices)."""

import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference import cohorts
from helios_jax.reference.crosscheck import with_decode_steps, with_prefill_batch
from helios_jax.scheduler import policy
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, POLICY, SPEC, decoder, inputs, k_step_only, measured, prompt
from .test_prerequisites import blocked, with_graphs

spec = pytest.mark.spec


def _sequences(inp, kind=GraphKind.RESTORE):
    return [c for c in policy.candidates(inp) if c.kind is kind and c.following is not None]


def _prompt_rows(c):
    return {lane.rid: lane.prompt_tokens for lane in c.following.lanes if lane.role is LaneRole.PROMPT}


# Ready prompts beside a stream that a restore makes ready to prefill: 2 consumes a whole chunk
# of 64, 3 needs prompt scores (the other prefill family), 4 opens with an image span of 300
# tokens that a chunk of 64 cannot hold (it consumes nothing there), 5 has one token left.
READY_PROMPTS = (
    prompt(2, 500),
    prompt(3, 500, needs_scores=True),
    prompt(4, 500, atomic_spans=((0, 300),)),
    prompt(5, 1),
)


@spec("prerequisites/following-ready", "prerequisites/joint-cohorts", "useful-service/prompt-progress")
def test_a_multi_row_prefill_follower_fills_its_rows_with_ready_prompts_that_consume_tokens():
    """RESOLUTIONS 28: a restore followed by a 4-row prefill of 64-token chunks fills the rows
    the restored prompt leaves with ready prompts of its family that consume tokens: 2 (64) and
    5 (its last token); not 3 (scored prefill's) nor 4 (nothing fits before its image)."""
    cat = with_prefill_batch(ORDINARY, (4,))
    views = [blocked(1, [GraphKind.RESTORE], Phase.PREFILL, tokens=100), *READY_PROMPTS]
    inp = inputs(views, catalog=cat, mode=DecodeMode.ORDINARY)
    (c,) = [c for c in _sequences(inp) if c.following.graph.name == "prefill[B=4,W=64,D=0,C=0,P=0]"]
    assert _prompt_rows(c) == {1: 64, 2: 64, 5: 1}
    assert [lane.rid for lane in c.lanes] == [1]


@spec("mixed-execution/prereq-cases", "prerequisites/following-ready")
def test_a_mixed_followers_ready_prompt_row_is_one_that_consumes_tokens():
    """A restore that makes a decoder ready, followed by a mixed program of 64-token chunks: its
    prompt row, when it has one, is an already ready plain prompt that consumes tokens in the
    chunk, 2 or 5; never 3 (scored) nor 4 (nothing fits before its image)."""
    views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE), *READY_PROMPTS]
    inp = inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY)
    mixed = [c for c in _sequences(inp) if c.following.graph.name.startswith("mixed[B=2,W=1,D=0,C=64,")]
    assert {tuple(_prompt_rows(c).items()) for c in mixed} == {(), ((2, 64),), ((5, 1),)}
    assert all(1 in c.following.rids for c in mixed)


@spec(
    "prerequisites/age-reset-following",
    "prerequisites/following-ready",
    "useful-service/multistage-reference",
)
def test_a_k_step_follower_takes_its_rows_for_k_certain_tokens():
    """A catalog whose decode programs all run K = 2 steps (no single step, no mixed), and a
    RESTORE B=4. Newly ready after a restore, streams 1, 3, 4 and 5 ride each follower as K-step
    lanes: ceiling min(K, limits) (2; 1 for stream 3 with one output token left, stream 4 with
    one context position, stream 5 with a width limit of one), no query rows, that many tokens
    at their output price, one delivery and the age term over their own reference U; the ready
    decoder 6 the same with reference sigma (the reference's prices). Stream 2's samples take a
    host token mask, which a K-step program cannot apply."""
    cat = k_step_only(with_decode_steps(ORDINARY, (2,), 0.5))
    one = {3: dict(output_remaining=1), 4: dict(context_remaining=1), 5: dict(width_limit=1)}
    views = [
        blocked(1, [GraphKind.RESTORE], Phase.DECODE, slot=7, age_ms=12.0),
        blocked(2, [GraphKind.RESTORE], Phase.DECODE, host_mask=True),
        *(blocked(rid, [GraphKind.RESTORE], Phase.DECODE, x=8.0, **kw) for rid, kw in one.items()),
        decoder(6, slot=9, age_ms=30.0),
    ]
    r4 = GraphDescriptor(GraphKind.RESTORE, 4, duration_ms=0.5)
    inp = with_graphs([r4], catalog=cat, mode=DecodeMode.ORDINARY, views=views, costs=measured(cat))
    obj = cohorts.Objective(views, inp.graphs, inp.costs, POLICY)
    found = _sequences(inp)
    assert found and all(c.following.graph.steps == 2 for c in found)
    assert {lane.rid for c in found for lane in c.following.lanes} == {1, 3, 4, 5, 6}
    for c in found:
        u = c.sequence_ms
        for lane in c.following.lanes:
            v = views[lane.rid - 1]
            steps = 1 if lane.rid in one else 2
            assert (lane.slot, lane.ceiling, lane.query_length) == (v.slot, steps, 0)
            assert lane.expected_tokens == steps
            ref = obj.sigma if lane.rid == 6 else u
            want = (
                obj.price(v.log_output_price) * steps
                + obj.price(v.log_delivery_price)
                + obj.c * ref * (v.age_ms + u)
            )
            assert lane.value == pytest.approx(want, rel=1e-9)


@spec("useful-service/conditional-acceptance", "prerequisites/joint-cohorts")
def test_a_host_masked_stream_follows_on_single_step_programs():
    """A host token mask bars K-step lanes only: a masked stream that a restore makes ready
    rides the single-step decode programs that follow it."""
    views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE, host_mask=True)]
    found = _sequences(inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY))
    decode = [c for c in found if c.following.graph.kind is GraphKind.DECODE]
    assert decode and all(c.following.rids == (1,) for c in decode)


@spec("prerequisites/all-shape-pairs", "useful-service/dominance-prune")
def test_a_dominated_prerequisite_shape_offers_no_sequence_its_smaller_shape_carries():
    """RESTORE B=2, measured faster (0.3 ms) than the catalog's RESTORE B=1 (0.35 ms), beside one
    restoring stream and a ready decoder: B=1 does the same work before every follower, so B=2's
    sequences are dominated and none is offered, although each would score higher."""
    r2 = GraphDescriptor(GraphKind.RESTORE, 2, duration_ms=0.3)
    views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE), decoder(2)]
    inp = with_graphs([r2], catalog=SPEC, mode=DecodeMode.ADAPTIVE, views=views, costs=measured(SPEC))
    found = _sequences(inp)
    assert found and {c.graph.batch_capacity for c in found} == {1}


@spec("prerequisites/free-unused-capacity", "prerequisites/continuation-aggregate")
def test_a_continuations_free_rows_are_their_requests_rows_worth_nothing():
    """INITIALIZE B=4, the only initialization program, before one stream that initializes and
    then restores (a continuation) and two that only initialize: the continuation's candidate
    advances the two others in its unused rows, each in its own slot, as prerequisite lanes
    worth nothing."""
    init4 = GraphDescriptor(GraphKind.INITIALIZE, 4, duration_ms=0.2)
    graphs = tuple(g for g in ORDINARY.eligible(DecodeMode.ORDINARY) if g.kind is not GraphKind.INITIALIZE)
    costs = measured(ORDINARY)
    costs.observe(init4.key, [0.2e6], 0)
    views = [
        blocked(1, [GraphKind.INITIALIZE, GraphKind.RESTORE], Phase.DECODE, slot=11),
        blocked(2, [GraphKind.INITIALIZE], Phase.DECODE, slot=12),
        blocked(3, [GraphKind.INITIALIZE], Phase.PREFILL, slot=13),
    ]
    inp = policy.SelectionInput(views, (*graphs, init4), costs, 0, POLICY, DecodeMode.ORDINARY)
    (c,) = [c for c in policy.candidates(inp) if c.kind is GraphKind.INITIALIZE and c.following is None]
    assert [(lane.rid, lane.slot, lane.role) for lane in c.lanes] == [
        (rid, 10 + rid, LaneRole.PREREQUISITE) for rid in (1, 2, 3)
    ]
    assert c.lanes[0].value > 0 and [lane.value for lane in c.lanes[1:]] == [0.0, 0.0]


def _init_prefill(extra, costs, views):
    """The ordinary catalog with `extra` programs, INITIALIZE B=4 (0.25 ms) and `costs`."""
    init4 = GraphDescriptor(GraphKind.INITIALIZE, 4)
    costs.observe(init4.key, [0.25e6], 0)
    graphs = (*ORDINARY.eligible(DecodeMode.ORDINARY), init4, *extra)
    return policy.SelectionInput(views, graphs, costs, 0, POLICY, DecodeMode.ORDINARY)


@spec(
    "useful-service/dominance-prune",
    "useful-service/no-padding-preference",
    "prerequisites/all-shape-pairs",
)
@pytest.mark.parametrize("larger", ["chunk", "batch"])
def test_an_unmeasured_larger_follower_with_the_same_cohort_is_pruned(larger):
    """Three streams whose 64-token prompts wait on initialization. A follower with a larger
    chunk (prefill W = 128) or a larger batch (B = 16 beside B = 4) serves the same cohort with
    the same prompt work as the smaller one, so the pair is dominated by the pair with the
    smaller follower: its unknown duration must not score it by value alone and win (every later
    decision would prune that follower as a direct candidate, so it would never be measured
    and the streams would be initialized one decision at a time). A prompt the larger chunk
    serves with more work keeps its pair."""
    views = [blocked(i, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=64) for i in range(3)]
    if larger == "chunk":
        extra, costs = (), measured(ORDINARY)
        costs._entries.pop(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=128).key)
        small, big = "prefill[B=1,W=64,D=0,C=0,P=0]", "prefill[B=1,W=128,D=0,C=0,P=0]"
    else:
        p4, p16 = (GraphDescriptor(GraphKind.PREFILL, b, token_capacity=64) for b in (4, 16))
        extra, costs = (p16, p4), measured(ORDINARY)  # the dominated pair listed first
        costs.observe(p4.key, [6.0e6], 0)
        small, big = p4.name, p16.name
    found = _sequences(_init_prefill(extra, costs, views), kind=GraphKind.INITIALIZE)
    followers = {c.following.graph.name for c in found}
    assert small in followers and big not in followers
    c = policy.select(_init_prefill(extra, costs, views))
    assert c.following.graph.name == small and c.sequence_ms is not None  # priced by time
    if larger == "chunk":  # 100 tokens: W = 128 consumes more of the prompt than W = 64
        longer = [*views[:2], blocked(2, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=100)]
        found = _sequences(_init_prefill(extra, costs, longer), kind=GraphKind.INITIALIZE)
        assert any(c.following.graph.name == big and c.sequence_ms is None for c in found)
