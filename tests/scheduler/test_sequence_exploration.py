"""`duration-estimates/prefill-explore-smaller` on a two-stage sequence's follower: an unmeasured
prefill or mixed follower takes no prompt row that a smaller prepared chunk of its shape consumes
the same way up to the row's next message or prompt endpoint (RESOLUTIONS 36), exactly as the
direct candidates of that program leave the row out. Each case differs from the dominance
filter's: the larger chunk consumes more of the prompt, so no smaller pair has the same work."""

import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference.crosscheck import with_prefill_batch
from helios_jax.scheduler import policy
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, POLICY, measured, prompt
from .test_prerequisites import blocked

spec = pytest.mark.spec


def _unmeasured(catalog, *graphs):
    costs = measured(catalog)
    for g in graphs:
        costs._entries.pop(g.key)
    return costs


def _selection(catalog, costs, views):
    graphs = catalog.eligible(DecodeMode.ORDINARY)
    return policy.SelectionInput(list(views), graphs, costs, 0, POLICY, DecodeMode.ORDINARY)


def _followers(inp, name):
    """The restore sequences whose follower is program `name`, as {rid: prompt tokens} rows."""
    return [
        {lane.rid: lane.prompt_tokens for lane in c.following.lanes if lane.role is LaneRole.PROMPT}
        for c in policy.candidates(inp)
        if c.kind is GraphKind.RESTORE and c.following is not None and c.following.graph.name == name
    ]


@spec("duration-estimates/prefill-explore-smaller", "prerequisites/following-ready")
def test_an_unmeasured_prefill_follower_does_not_explore_a_prompt_a_smaller_chunk_consumes_alike():
    """A restored 100-token prompt whose next endpoint is at token 60, followed by prefill
    W = 128 (unmeasured): W = 128 would consume all 100 tokens against W = 64's 64, but up to
    the endpoint both consume 60, so the unmeasured program offers no sequence (the prompt is
    its only enabled row). With the endpoint at 80 (64 against 80) the sequence is explored,
    indeterminate; measured, W = 128 follows whatever the endpoint."""
    w128 = GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=128)
    costs = _unmeasured(ORDINARY, w128)
    at = {e: blocked(1, [GraphKind.RESTORE], Phase.PREFILL, tokens=100, endpoint=e) for e in (60, 80)}
    assert _followers(_selection(ORDINARY, costs, [at[60]]), w128.name) == []
    assert _followers(_selection(ORDINARY, costs, [at[80]]), w128.name) == [{1: 100}]
    assert _followers(_selection(ORDINARY, measured(ORDINARY), [at[60]]), w128.name) == [{1: 100}]
    # The direct candidates agree: the same prompt, ready, is not explored on W = 128 either.
    direct = {
        c.graph.name for c in policy.candidates(_selection(ORDINARY, costs, [prompt(1, 100, endpoint=60)]))
    }
    assert w128.name not in direct


@spec("duration-estimates/prefill-explore-smaller", "prerequisites/following-ready")
def test_an_unmeasured_multi_row_prefill_follower_leaves_out_the_ready_prompts_it_would_explore():
    """A restored 200-token prompt followed by a 4-row prefill of 128-token chunks
    (unmeasured) beside two ready prompts: 2 (100 tokens, endpoint at 60: W = 64 consumes the
    same 60) is left out, 3 (300 tokens) rides. Measured, the program takes both."""
    cat = with_prefill_batch(ORDINARY, (4,))
    b4 = GraphDescriptor(GraphKind.PREFILL, 4, token_capacity=128)
    views = [
        blocked(1, [GraphKind.RESTORE], Phase.PREFILL, tokens=200),
        prompt(2, 100, endpoint=60),
        prompt(3, 300),
    ]
    assert _followers(_selection(cat, _unmeasured(cat, b4), views), b4.name) == [{1: 128, 3: 128}]
    assert _followers(_selection(cat, measured(cat), views), b4.name) == [{1: 128, 2: 100, 3: 128}]


@spec("duration-estimates/prefill-explore-smaller", "mixed-execution/prereq-cases")
@pytest.mark.parametrize("row", ["ready", "enabled"])
def test_an_unmeasured_mixed_follower_does_not_explore_a_prompt_a_smaller_chunk_consumes_alike(row):
    """Mixed B = 2 of 128-token chunks (unmeasured) after a restore; its prompt row is a 100-token
    prompt with its next endpoint at 60, either already ready (beside a restored decoder) or the
    restored request itself. Mixed B = 2 of 64-token chunks consumes the same 60 up to the
    endpoint, so the unmeasured program's sequences carry no such row; measured, they do."""
    big = next(
        g for g in ORDINARY.of_kind(GraphKind.MIXED) if g.batch_capacity == 2 and g.prefill_capacity == 128
    )
    if row == "ready":
        views = [blocked(1, [GraphKind.RESTORE], Phase.DECODE), prompt(2, 100, endpoint=60)]
        rid = 2
    else:
        views = [blocked(1, [GraphKind.RESTORE], Phase.PREFILL, tokens=100, endpoint=60)]
        rid = 1
    unmeasured = _followers(_selection(ORDINARY, _unmeasured(ORDINARY, big), views), big.name)
    assert all(rid not in rows for rows in unmeasured)
    assert any(
        rows.get(rid) == 100 for rows in _followers(_selection(ORDINARY, measured(ORDINARY), views), big.name)
    )
