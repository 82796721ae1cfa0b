"""Multi-prompt prefill programs in selection (RESOLUTIONS.md, 26).

A B-row prefill earns the sum of its rows' prefill values over its own measured duration; the
selector takes it when that rate beats one-row prefills and not otherwise, a cohort whose rows a
smaller prefill runs with the same work is discarded, and the production selector equals the
exhaustive reference, program by program, including which programs have a legal cohort at all.
"""

import dataclasses
import math

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.reference import cohorts, crosscheck
from helios_jax.scheduler import policy, service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole

from .helpers import SPEC, choose, inputs, prompt

spec = pytest.mark.spec


def _catalog(speedup: float, rows=(2, 4)):
    """The speculative catalog plus B-row prefills measured at speedup x B one-row runs."""
    return crosscheck.with_prefill_batch(SPEC, rows, speedup)


@spec(
    "useful-service/score-formula",
    "useful-service/full-prefill-wins",
    "useful-service/all-capacities-compete",
)
@pytest.mark.parametrize("speedup, wins", [(0.4, True), (1.0, False), (1.5, False)])
def test_selector_takes_several_prompts_only_when_worth_the_time(speedup, wins):
    views = [prompt(i, 64) for i in range(4)]
    chosen = choose(views, catalog=_catalog(speedup, rows=(4,)))
    assert chosen.kind is GraphKind.PREFILL
    assert (chosen.graph.batch_capacity == 4) is wins
    if wins:  # four prompt rows, each its whole 64-token prompt and its first output token
        assert sorted(chosen.rids) == [0, 1, 2, 3]
        assert all(lane.role is LaneRole.PROMPT and lane.prompt_tokens == 64 for lane in chosen.lanes)
        assert [lane.expected_tokens for lane in chosen.lanes] == [1.0] * 4
    else:
        assert chosen.served == 1


@spec("useful-service/dominance-prune", "useful-service/prefill-actual-tokens")
def test_equal_work_is_the_smaller_program():
    cat = _catalog(0.4)

    def rows(views, b, c):
        found = [
            cand
            for cand in policy.candidates(inputs(views, catalog=cat))
            if cand.kind is GraphKind.PREFILL
            and cand.graph.batch_capacity == b
            and cand.graph.token_capacity == c
        ]
        return sorted(found[0].rids) if found else None

    # One prompt: a two-row program would do the one-row program's work.
    assert rows([prompt(0, 64)], 2, 64) is None
    # Three prompts: the 4-row program serves all three (the 2-row one cannot).
    three = [prompt(i, 64) for i in range(3)]
    assert rows(three, 4, 64) == [0, 1, 2] and rows(three, 2, 64) is not None
    # Short prompts on a 128-token chunk consume what the 64-token chunk does: dominated, unless
    # one row needs the larger chunk; then it is in the cohort.
    assert rows(three, 4, 128) is None
    longer = three + [prompt(3, 100)]
    assert rows(longer, 4, 128) == [0, 1, 2, 3] and rows(longer, 2, 128) is not None
    assert 3 in rows(longer, 2, 128)


@spec("verification/mixed-exhaustive", "useful-service/dominance-prune", "verification/cpu-only")
def test_production_matches_enumeration_including_which_programs_compete():
    cat = _catalog(0.6)
    rng = np.random.default_rng(5)
    pc = PolicyConfig()
    compared = 0
    for _ in range(60):
        mode = DecodeMode.ADAPTIVE
        graphs = cat.eligible(mode)
        costs = CostModel(pc.estimate_ttl_ns)
        for g in graphs:
            factor = float(np.exp(rng.uniform(-0.15, 0.15)))
            costs.observe(g.key, [g.duration_ms * 1e6 * factor], 0)
        normalizers = service.Normalizers.measure(cat.graphs, costs)
        views = crosscheck.random_population(rng, cat, 5, pc, normalizers)
        production = {}
        for r in policy.scored(policy.SelectionInput(views, graphs, costs, 0, pc, mode)):
            if r.graph.kind.is_prefill:
                production[r.graph.key] = max(production.get(r.graph.key, -math.inf), r.score)
        reference = {
            k: v
            for k, v in cohorts.exhaustive_best(views, graphs, costs, pc, mode).items()
            if k.kind.is_prefill
        }
        assert production.keys() == reference.keys()
        for key, score in reference.items():
            assert production[key] == pytest.approx(score, rel=1e-9, abs=1e-12)
        compared += sum(1 for k in reference if k.batch_capacity > 1)
    assert compared > 25


def _without_one_row_chunk(catalog, chunk: int):
    """`catalog` without its one-row prefill program of `chunk` tokens."""
    graphs = tuple(
        g
        for g in catalog.graphs
        if not (g.kind is GraphKind.PREFILL and g.batch_capacity == 1 and g.token_capacity == chunk)
    )
    return dataclasses.replace(catalog, graphs=graphs)


def _multi_row(cands, b: int, c: int):
    found = [
        x
        for x in cands
        if x.kind is GraphKind.PREFILL and x.graph.batch_capacity == b and x.graph.token_capacity == c
    ]
    assert len(found) <= 1
    return found[0] if found else None


@spec(
    "useful-service/dominance-prune",
    "useful-service/all-capacities-compete",
    "useful-service/prefill-actual-tokens",
    "verification/mixed-exhaustive",
)
@pytest.mark.parametrize(
    "views, two_rows",
    [
        ([prompt(0, 100)], [0]),
        ([prompt(0, 64, x=0.01), prompt(1, 64, x=0.02), prompt(2, 100), prompt(3, 100, x=4.0)], [0, 2]),
        ([prompt(0, 100), prompt(1, 500, prompt_limit=0)], [0]),
        ([prompt(0, 100, log_x=-50.0), prompt(1, 100)], [0, 1]),
    ],
    ids=["one-prompt", "cheap-rows-need-the-chunk", "one-row-consumes-nothing", "one-row-worth-nothing"],
)
def test_a_chunk_no_one_row_program_has_matches_enumeration(views, two_rows):
    """With no one-row 128-token prefill, the B-row 128-token programs do work no smaller
    program does for a row of more than 64 tokens, even alone. Against exhaustive enumeration
    (which programs compete, and their best scores) and by rows: when the most valuable rows are
    64-token prompts that the two-row 64-token program runs the same way, the two-row 128-token
    cohort is the best of them plus the best row that needs the larger chunk, and a row whose
    chunk consumes nothing (a prompt at its limit) is never one of its rows; a row whose value
    vanishes beside the others' (a price e^-50 of theirs) still rides along: equal values, more
    rows."""
    cat = _without_one_row_chunk(_catalog(0.6, rows=(2, 4)), 128)
    graphs = cat.eligible(DecodeMode.ADAPTIVE)
    costs = CostModel(PolicyConfig().estimate_ttl_ns)
    costs.seed_from_catalog(cat, 0)
    inp = policy.SelectionInput(views, graphs, costs, 0, PolicyConfig(), DecodeMode.ADAPTIVE)
    production = {}
    for r in policy.scored(inp):
        if r.graph.kind.is_prefill:
            production[r.graph.key] = max(production.get(r.graph.key, -math.inf), r.score)
    reference = {
        k: v
        for k, v in cohorts.exhaustive_best(views, graphs, costs, PolicyConfig(), DecodeMode.ADAPTIVE).items()
        if k.kind.is_prefill
    }
    assert production.keys() == reference.keys()
    for key, score in reference.items():
        assert production[key] == pytest.approx(score, rel=1e-9, abs=1e-12)
    cands = policy.candidates(inp)
    offered = [c.graph.key for c in cands if c.kind.is_prefill]
    assert len(offered) == len(set(offered))  # each program offers its one best cohort
    two = _multi_row(cands, 2, 128)
    assert two is not None and sorted(two.rids) == two_rows  # a 100-token row needs the 128 chunk
    assert all(lane.prompt_tokens > 0 for c in cands if c.kind.is_prefill for lane in c.lanes)
    if len(views) == 4:  # four rows: no smaller program holds them
        assert sorted(_multi_row(cands, 4, 128).rids) == [0, 1, 2, 3]


@spec("duration-estimates/prefill-explore-smaller", "useful-service/unknown-optimistic")
def test_an_unmeasured_multi_row_prefill_explores_only_rows_a_smaller_chunk_would_not_serve():
    """Every B-row prefill unmeasured, the one-row programs measured: a 128-token cohort leaves
    out the 64-token prompt (the 64-token chunk consumes it the same way) but takes the prompt
    whose first message ends at token 100 and the 100-token one (with two such rows the
    four-row program does the two-row one's work); a prompt needing scores runs only scored
    prefill, however valuable."""
    cat = _catalog(0.6, rows=(2, 4))
    views = [
        prompt(0, 1000, endpoint=100),
        prompt(1, 64, x=0.01),
        prompt(2, 100),
        prompt(3, 100, x=0.01, needs_scores=True),
    ]
    costs = CostModel(PolicyConfig().estimate_ttl_ns)
    for g in cat.graphs:
        if g.duration_ms is not None and g.batch_capacity == 1:
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    cands = policy.candidates(inputs(views, catalog=cat, costs=costs))
    cohort = _multi_row(cands, 2, 128)
    assert cohort is not None and cohort.indeterminate
    assert sorted(cohort.rids) == [0, 2]
    assert _multi_row(cands, 4, 128) is None  # two rows: the two-row program's work
    assert all(
        lane.rid != 3
        for c in cands
        if c.kind is GraphKind.PREFILL and c.graph.batch_capacity > 1
        for lane in c.lanes
    )
