"""Multi-prompt prefill programs in selection (RESOLUTIONS.md, 26).

A B-row prefill earns the sum of its rows' prefill values over its own measured duration; the
selector takes it when that rate beats one-row prefills and not otherwise, a cohort whose rows a
smaller prefill runs with the same work is discarded, and the production selector equals the
exhaustive reference, program by program, including which programs have a legal cohort at all.
"""

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
