"""`duration-estimates/prefill-explore-smaller` on a two-stage sequence's follower: an unmeasured
prefill or mixed follower takes no prompt row that a smaller prepared chunk of its shape consumes
the same way up to the row's next message or prompt endpoint (RESOLUTIONS 36), exactly as the
direct candidates of that program leave the row out. Each case differs from the dominance
filter's: the larger chunk consumes more of the prompt, so no smaller pair has the same work."""

import numpy as np
import pytest

from helios_jax import catalog_family
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
    (unmeasured) beside three ready prompts: 2 (100 tokens, endpoint at 60: W = 64 consumes the
    same 60) is left out, 3 (300 tokens) rides, 4 (300 tokens, but it needs prompt scores: the
    other family) never rides, explored or not. Measured, the program takes 2 and 3."""
    cat = with_prefill_batch(ORDINARY, (4,))
    b4 = GraphDescriptor(GraphKind.PREFILL, 4, token_capacity=128)
    views = [
        blocked(1, [GraphKind.RESTORE], Phase.PREFILL, tokens=200),
        prompt(2, 100, endpoint=60),
        prompt(3, 300),
        prompt(4, 300, needs_scores=True),
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


FAMILY = list(catalog_family.family(6, 0))


def _endpoint(v) -> int:
    """Tokens to the row's next message or prompt endpoint, within what a chunk may consume."""
    end = v.prompt_remaining if v.endpoint is None else v.endpoint
    limit = v.prompt_remaining if v.prompt_limit is None else v.prompt_limit
    return min(end, v.prompt_remaining, limit)


def _smaller_capacities(graphs, g2) -> list[int]:
    """The prompt capacities the rule compares `g2` with, read from the catalog: smaller chunks
    of its kind (prefill), or of its batch and width (mixed)."""
    if g2.kind is GraphKind.MIXED:
        return [
            h.prefill_capacity
            for h in graphs
            if h.kind is GraphKind.MIXED
            and (h.batch_capacity, h.token_capacity) == (g2.batch_capacity, g2.token_capacity)
            and h.prefill_capacity < g2.prefill_capacity
        ]
    return [h.token_capacity for h in graphs if h.kind is g2.kind and h.token_capacity < g2.token_capacity]


def _scenario(rng, first_rid=1):
    """Prompts behind a restore or an initialization, ready prompts and decoders, some restored:
    random lengths, about half with an endpoint inside the prompt."""
    views, rid = [], first_rid

    def endpoint(n):
        return int(rng.integers(1, n + 1)) if rng.random() < 0.5 else None

    for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(20, 600))
        kind = GraphKind.RESTORE if rng.random() < 0.5 else GraphKind.INITIALIZE
        views.append(blocked(rid, [kind], Phase.PREFILL, tokens=n, endpoint=endpoint(n)))
        rid += 1
    for _ in range(int(rng.integers(0, 4))):
        n = int(rng.integers(20, 600))
        views.append(prompt(rid, n, endpoint=endpoint(n)))
        rid += 1
    for _ in range(int(rng.integers(0, 3))):
        views.append(blocked(rid, [GraphKind.RESTORE], Phase.DECODE))
        rid += 1
    return views


@spec("duration-estimates/prefill-explore-smaller", "prerequisites/following-ready")
@pytest.mark.parametrize("index", range(len(FAMILY)))
def test_no_unmeasured_follower_explores_a_row_a_smaller_chunk_consumes_alike_on_generated_catalogs(index):
    """On the first six catalogs of the generated family (with four-row prefill programs added),
    random blocked and ready prompts with random endpoints and a random two fifths of the prompt
    programs unmeasured: every prompt row of every sequence's unmeasured follower is one that no
    smaller capacity of its shape consumes the same way up to the row's endpoint (the rule
    recomputed here from the views and the catalog). The property must be exercised: some
    unmeasured followers carry prompt rows."""
    member = FAMILY[index]
    cat = with_prefill_batch(member.catalog, (4,))
    mode = DecodeMode.ORDINARY if member.params["mode"] == "ordinary" else DecodeMode.ADAPTIVE
    graphs = cat.eligible(mode)
    rng = np.random.default_rng(index)
    rows = 0
    for _ in range(25):
        costs = measured(cat)
        for g in graphs:
            if g.kind in (GraphKind.PREFILL, GraphKind.MIXED) and rng.random() < 0.4:
                costs._entries.pop(g.key, None)
        views = _scenario(rng)
        by_rid = {v.rid: v for v in views}
        inp = policy.SelectionInput(views, graphs, costs, 0, POLICY, mode)
        for c in policy.candidates(inp):
            g2 = c.following.graph if c.following is not None else None
            if g2 is None or g2.kind not in (GraphKind.PREFILL, GraphKind.MIXED) or costs.is_known(g2.key):
                continue
            cap = g2.prefill_capacity if g2.kind is GraphKind.MIXED else g2.token_capacity
            smaller = _smaller_capacities(graphs, g2)
            for lane in c.following.lanes:
                if lane.role is not LaneRole.PROMPT:
                    continue
                v = by_rid[lane.rid]
                end = _endpoint(v)
                mine = min(v.prompt_work(cap), end)
                assert all(min(v.prompt_work(h), end) != mine for h in smaller), (g2.name, v)
                rows += 1
    assert rows > 0
