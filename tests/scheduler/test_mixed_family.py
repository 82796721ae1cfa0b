"""The mixed family (policy/mixed.py): its prompt rows against exhaustive enumeration where the
prompt's chunk has an endpoint or an atomic span at its cursor, the family's upper bound against
the shapes' own candidates, and the dominance rules kept on the prepared programs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.reference import cohorts
from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import mixed
from helios_jax.scheduler.view import LaneRole

from .helpers import POLICY, SPEC, decoder, geometric, inputs, prompt

spec = pytest.mark.spec


def _mixed_bests(views) -> tuple[dict, dict]:
    """(production, reference): each mixed program's best score, over the selector's rows and
    over every legal non-dominated cohort (reference/cohorts.py)."""
    inp = inputs(views)
    production: dict = {}
    for row in policy.scored(inp):
        if row.graph.kind is GraphKind.MIXED:
            production[row.graph.key] = max(production.get(row.graph.key, -math.inf), row.score)
    graphs = list(inp.graphs)
    objective = cohorts.Objective(views, graphs, inp.costs, inp.policy)
    reference = {}
    for g in graphs:
        if g.kind is GraphKind.MIXED:
            score = cohorts.best_for_graph(objective, g, DecodeMode.ADAPTIVE)
            if score is not None:
                reference[g.key] = score
    return production, reference


@spec("verification/mixed-exhaustive", "duration-estimates/prefill-explore-smaller")
def test_measured_mixed_programs_keep_the_prompt_rows_exploration_would_exclude():
    """A prompt whose next message endpoint (10 tokens) lies below every prompt capacity: on
    measured mixed programs each capacity consumes its own chunk (64, 128, ... tokens), so every
    capacity offers the prompt row; the exploration exclusion (a smaller capacity consumes the
    same tokens up to the endpoint) is for unmeasured programs only. Each mixed program's best
    equals exhaustive enumeration's, larger capacities included."""
    views = [decoder(i, survival=geometric(0.7)) for i in range(2)] + [prompt(9, 1000, endpoint=10)]
    production, reference = _mixed_bests(views)
    assert any(key.prefill_capacity > 64 for key in reference)  # larger capacities: prompt rows
    assert production.keys() == reference.keys()
    for key, score in reference.items():
        assert math.isclose(production[key], score, rel_tol=1e-9, abs_tol=1e-9), key


@spec("verification/mixed-exhaustive", "mixed-execution/compare-populations")
def test_mixed_prompt_row_never_consumes_zero_prompt_tokens():
    """A prompt whose atomic image span [0, 300) is at its cursor consumes no token at prompt
    capacities 64, 128 and 256 (a cut inside the span moves back to its start): there it is
    no prompt row, and those shapes offer only what enumeration finds (cohorts of prompt rows
    with work > 0); no mixed candidate's prompt lane consumes zero tokens."""
    views = [decoder(i, survival=geometric(0.7)) for i in range(2)]
    views.append(prompt(9, 1000, atomic_spans=((0, 300),)))
    production, reference = _mixed_bests(views)
    assert production.keys() == reference.keys()
    for key, score in reference.items():
        assert math.isclose(production[key], score, rel_tol=1e-9, abs_tol=1e-9), key
    for row in mixed.mixed_candidates(policy.Selection(inputs(views))):
        for lane in row.build().lanes:
            assert lane.role is not LaneRole.PROMPT or lane.prompt_tokens > 0, (row.graph.name, lane)


def _rows_by_shape(sel: policy.Selection) -> dict[int, list]:
    rows: dict[int, list] = {}
    for row in mixed.mixed_candidates(sel):
        rows.setdefault(id(row.graph), []).append(row)
    return rows


@spec("mixed-execution/compare-populations", "mixed-execution/prompt-only-legal")
@pytest.mark.parametrize("decoders, scale", [(0, 1.0), (5, 1.0), (5, 0.1)])
def test_mixed_upper_rates_equal_the_best_candidate_of_each_shape_offering_both(decoders, scale):
    """mixed_upper_rates is exact where a shape offers its decode-only cohort and its best
    prompt row: value = max(best prompt row + the min(B - 1, n) best lanes, the min(B, n) best
    lanes) with the age terms, rate value / T - T / 2 * waiting, i.e. the shape's best
    candidate's score; its magnitude is |value| / T + T / 2 * |waiting|. With five decoders
    (waiting > 0) B = 2 and 4 shapes hold fewer prompt-row decoders than decoders; with none,
    prompt-only rows (no decode-only cohort) are bounded by the best prompt row alone. `scale`
    0.1: every program ten times faster (mixed ones under a millisecond)."""
    views = [decoder(i, survival=geometric(0.6 + 0.05 * i), age_ms=5.0 * i) for i in range(decoders)]
    views += [prompt(20, 1000), prompt(21, 40, x=8.0)]
    costs = CostModel(POLICY.estimate_ttl_ns)
    for g in SPEC.graphs:
        costs.observe(g.key, [g.duration_ms * 1e6 * scale], 0)
    sel = policy.Selection(inputs(views, costs=costs))
    rates, magnitudes = mixed.mixed_upper_rates(sel)
    waiting = sel.decision.waiting
    assert (waiting > 0) == (decoders > 0)
    assert (min(sel.prepared.mixed_durations(sel.costs)) < 1.0) == (scale < 1)
    checked = 0
    for j, g in enumerate(sel.prepared.mixed):
        rows = _rows_by_shape(sel).get(id(g), [])
        if len(rows) != (2 if decoders else 1):  # a dominated prompt row, or no decode-only cohort
            continue
        top = max(rows, key=lambda r: r.score)
        t, value = top.duration_ms, top.build().useful_value
        assert math.isclose(rates[j], top.score, rel_tol=1e-12, abs_tol=1e-12), g.name
        assert math.isclose(rates[j], value / t - 0.5 * t * waiting, rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(magnitudes[j], abs(value) / t + 0.5 * t * waiting, rel_tol=1e-12), g.name
        checked += 1
        if decoders:
            assert any(r.signature is None for r in rows)  # the prompt row is one of the two
    assert checked >= 4


def _rule_population(count: int) -> policy.SelectionInput:
    """`count` decoders and a prompt on SPEC's adaptive programs, prepared once for the input."""
    views = [decoder(i, survival=geometric(0.7)) for i in range(count)] + [prompt(9, 700)]
    inp = inputs(views)
    return dataclasses.replace(inp, graphs=policy.PreparedGraphs(inp.graphs))


def test_mixed_dominance_rules_are_read_back_for_a_decision_of_the_same_key(monkeypatch):
    """The dominance rules are kept on the prepared programs under (decoder count, lane widths
    per (W, D)): a later decision with the same key reads them back without deciding any
    shape's rule again."""
    inp = _rule_population(2)
    prepared = inp.graphs
    first = mixed.MixedFamily(policy.Selection(inp)).rules()

    def refuse(self, g):
        raise AssertionError("a kept dominance rule was decided again")

    monkeypatch.setattr(mixed.MixedFamily, "_dominance_rule", refuse)
    again = mixed.MixedFamily(policy.Selection(dataclasses.replace(inp, now_ns=5)))
    assert again.rules() is first and len(prepared.mixed_rules) == 1


def test_mixed_dominance_rules_keep_at_most_rule_memo_keys():
    """The kept rule sets are bounded (RULE_MEMO): a new key when RULE_MEMO are kept clears
    them before keeping its own, so the memo never holds more than RULE_MEMO keys."""
    inp = _rule_population(3)
    prepared = inp.graphs
    for k in range(mixed.RULE_MEMO):
        prepared.mixed_rules[(-1 - k, ())] = {}
    rules = mixed.MixedFamily(policy.Selection(inp)).rules()
    assert len(prepared.mixed_rules) == 1 and list(prepared.mixed_rules.values()) == [rules]
    fresh = mixed.MixedFamily(policy.Selection(inp))
    assert rules == {id(g): fresh._dominance_rule(g) for g in prepared.mixed}
