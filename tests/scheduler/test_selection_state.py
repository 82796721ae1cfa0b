"""One selection's decision-wide state: the shared base of an acceptance probe, the prompt
prices and tables kept per decision, and the free prerequisite rows.

Every check compares the kept or shared state with the same quantity computed afresh: a
selection built with a `base` scores as one built from nothing, whatever base the caller hands
it (a base whose rows it cannot share is rebuilt, not trusted).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy.generation import generation_candidates
from helios_jax.scheduler.policy.selection import free_prerequisite_rows, free_prerequisite_views
from helios_jax.scheduler.policy.tables import PromptTable
from helios_jax.scheduler.view import Lane, LaneRole, Phase

from .helpers import SPEC, decoder, geometric, inputs, measured, prompt


def _prompt_arrays(sel: policy.Selection) -> dict[str, np.ndarray]:
    return {k: v for k, v in vars(sel.prompts).items() if isinstance(v, np.ndarray)}


def _scores(inp: policy.SelectionInput, sel: policy.Selection) -> list[tuple[str, float, tuple]]:
    return [(r.graph.name, r.score, r.build().lanes) for r in policy.scored(inp, sel)]


def test_a_base_shares_its_prompt_table_only_for_the_same_prompt_views():
    """An acceptance probe's selection (the same views, decoders with other survival) takes the
    base's prompt table as it is; a base of the same decision size whose prompt views are other
    objects (here: a prompt with fewer uncached tokens at the same prices, so the decision-wide
    quantities agree) gets its own table, and every program scores and builds the same lanes as
    in a selection built fresh."""
    views = [decoder(1, survival=geometric(0.6)), prompt(2, 500), prompt(3, 90, x=3.0)]
    prepared = policy.as_prepared(inputs(views).graphs)
    inp = dataclasses.replace(inputs(views), graphs=prepared)
    base = policy.Selection(inp)
    probe_views = [v.with_survival(geometric(0.9)) if v.rid == 1 else v for v in views]
    probe = dataclasses.replace(inp, views=probe_views, graphs=prepared.drafted(), reference=prepared)
    assert policy.Selection(probe, base).prompts is base.prompts
    for changed in ({2}, {2, 3}):  # one prompt view replaced, and every one
        other = [dataclasses.replace(v, prompt_remaining=40) if v.rid in changed else v for v in views]
        other_inp = dataclasses.replace(probe, views=other)
        got, want = policy.Selection(other_inp, base), policy.Selection(other_inp)
        assert got.decision == want.decision == base.decision  # shared: the same prices
        assert got.prompts is not base.prompts
        a, b = _prompt_arrays(got), _prompt_arrays(want)
        assert a.keys() == b.keys()
        for name, x in b.items():
            np.testing.assert_array_equal(a[name], x, strict=True, err_msg=name)
        assert _scores(other_inp, got) == _scores(other_inp, want)


def test_free_prerequisite_rows_are_the_first_room_views_not_taken_in_order():
    """Unused prerequisite capacity advances further blocked rows: the first `room` views (in
    the order given) whose request is not taken already, each a PREREQUISITE lane of value 0 in
    its own slot; no room (or a negative one) advances none. Every room and taken set over four
    views is compared with filtering then truncating."""
    views = [
        dataclasses.replace(decoder(rid, slot=10 + rid), phase=Phase.BLOCKED, runnable=False)
        for rid in (4, 1, 7, 2)
    ]
    rids = [v.rid for v in views]
    for room in range(-1, 6):
        for mask in range(1 << len(views)):
            taken = {rid for i, rid in enumerate(rids) if mask >> i & 1}
            want = [v for v in views if v.rid not in taken][: max(room, 0)]
            got = free_prerequisite_views(iter(views), room, iter(taken))
            assert [v.rid for v in got] == [v.rid for v in want], (room, taken)
            assert all(a is b for a, b in zip(got, want))
            rows = free_prerequisite_rows(views, room, taken)
            assert rows == [Lane(v.rid, v.slot, LaneRole.PREREQUISITE, value=0.0) for v in want]
            assert all(lane.value == 0.0 and lane.role is LaneRole.PREREQUISITE for lane in rows)


def test_prompt_prices_and_tables_kept_for_the_decision_equal_fresh_ones():
    """A prompt's scaled prices, kept per request for the decision, are its log prices scaled by
    the decision's shared factor (read twice: the same numbers), as the prompt table prices its
    rows; a prompt table kept by its requests equals one built afresh on the decision."""
    views = [prompt(3, 700, x=5.0), prompt(1, 40, x=0.5), decoder(2, x=9.0), prompt(5, 12)]
    sel = policy.Selection(inputs(views))
    scale = np.exp(-sel.decision.log_scale)
    for _ in range(2):
        for v in views:
            got = sel.prompt_prices(v)
            want = (np.exp(v.log_prefill_price) * scale, np.exp(v.log_output_price) * scale)
            np.testing.assert_allclose(got, want, rtol=1e-12)
            assert all(type(x) is float for x in got)
    table = sel.prompts
    for i, rid in enumerate(table.rids.tolist()):
        v = next(v for v in views if v.rid == rid)
        assert sel.prompt_prices(v) == (table.prefill_price[i], table.output_price[i])
    for chosen in ([views[1], views[0]], [views[3]], [views[0], views[1]]):
        for _ in range(2):
            got, want = sel.prompt_table(chosen), PromptTable(list(chosen), sel.decision)
            assert got.views == chosen
            for name in ("rids", "prefill_price", "output_price", "prompt_remaining", "endpoint"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name), strict=True)
            np.testing.assert_array_equal(got.values(64), want.values(64), strict=True)


def test_decode_lanes_sum_to_the_candidates_useful_value_measured_or_not():
    """A generation candidate's useful value is its lanes' values summed: each served decoder
    earns its tokens, its delivery and its age term c*sigma*(A + T) over the program's duration T;
    a program without a duration estimate scores its value at T = 0, and its lanes carry no T."""
    views = [decoder(i, survival=geometric(0.5 + 0.1 * i), age_ms=5.0 * i) for i in range(5)]
    costs = measured(SPEC)
    partial = CostModel()
    unmeasured = 0
    for g in SPEC.graphs:
        if g.batch_capacity % 4:  # every program of four or eight lanes stays unmeasured
            partial.observe(g.key, [g.duration_ms * 1e6], 0)
    for cm in (costs, partial):
        sel = policy.Selection(inputs(views, costs=cm))
        assert sel.decision.decode_age * sel.decision.sigma_decode > 0
        for row in generation_candidates(sel):
            c = row.build()
            decode = [lane for lane in c.lanes if lane.role is LaneRole.DECODE]
            assert decode and len(decode) == len(c.lanes)
            total = sum(lane.value for lane in decode)
            assert total == pytest.approx(c.useful_value, rel=1e-12), c.graph.name
            unmeasured += c.duration_ms is None
    assert unmeasured > 0


def test_a_program_outside_the_selection_is_estimated_once_and_scored_on_that_estimate():
    """duration() answers for any program, also one outside the programs the selection scores
    (here: a drafted-only selection asked about prefill programs): the cost model's estimate (None
    when unmeasured), kept, so that score() reads the same duration as every lane built for it."""
    views = [decoder(1, survival=geometric(0.7)), prompt(2, 300)]
    inp = inputs(views)
    prepared = policy.as_prepared(inp.graphs)
    sel = policy.Selection(dataclasses.replace(inp, graphs=prepared.drafted(), reference=prepared))
    outside = [g for g in prepared.graphs if g not in sel.prepared.graphs]
    assert outside
    costs = CostModel()
    costs.observe(outside[0].key, [2.5e6], 0)
    sel = policy.Selection(dataclasses.replace(sel.inp, costs=costs))
    for g in outside[:3]:
        want = costs.estimate_ms(g.key)
        assert sel.duration(g) == want and sel.duration(g) == want
        row = sel.score(g, 3.0, 0.5, None, lambda: ())
        assert row.duration_ms == want
        if want is None:
            assert row.score == 3.0
        else:
            assert want == pytest.approx(2.5)
            assert row.score == sel.decision.rate(3.0 + 0.5 * want, want)
            assert row.build().useful_value == 3.0 + 0.5 * want
