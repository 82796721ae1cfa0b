"""Funded acceptance probes (``learning.probe``): which programs may probe and how they rank.

The first tests run the real scorer on single-request B=1 programs (W=1 at 3 ms, W=4 and W=8 at
5 ms; mean survival 0.02, so the ordinary choice is W=1; optimistic 0.95, so the wider programs
can beat it). The others hand ``probe`` scored rows with chosen scores and durations, so that
the ranking and tie rules are checked with figures derived by hand.
"""

import dataclasses
import types

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import learning, policy
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import Candidate, Lane, LaneRole

from .helpers import SPEC, decoder, prompt

spec = pytest.mark.spec


def _speculative(b, w):
    return next(
        g
        for g in SPEC.graphs
        if g.kind is GraphKind.SPECULATIVE and g.batch_capacity == b and g.token_capacity == w
    )


W1, W4, W8 = (_speculative(1, w) for w in (1, 4, 8))
B2W8 = _speculative(2, 8)
MIXED_W8 = next(
    g
    for g in SPEC.graphs
    if g.kind is GraphKind.MIXED and g.batch_capacity == 2 and g.token_capacity == 8 and g.proposal_depth == 7
)


def _setting(graphs=(W1, W4, W8), remaining=100):
    costs = CostModel()
    costs.observe(W1.key, [3.0e6], 0)
    for g in graphs:
        if g is not W1:
            costs.observe(g.key, [5.0e6], 0)
    view = decoder(1, survival=np.full(7, 0.02), output_remaining=remaining)
    view = dataclasses.replace(view, optimistic=np.full(7, 0.95))
    inp = policy.SelectionInput([view], list(graphs), costs, 0, PolicyConfig(), DecodeMode.ADAPTIVE)
    return inp, policy.select(inp), [dataclasses.replace(view, survival=view.optimistic)]


def _uninformed(rid, from_width, to_width):
    return 2.0


@spec("acceptance-learning/fixed-no-probe", "acceptance-learning/probe-can-beat")
def test_fixed_width_and_undetermined_ordinary_choices_never_probe():
    """The same decision probes W=8 in adaptive mode; in fixed-width mode, or when the ordinary
    choice is itself undetermined (unknown duration: discovery), there is no probe."""
    inp, ordinary, opt = _setting()
    assert ordinary.graph == W1
    assert learning.probe(inp, ordinary, opt, _uninformed).graph == W8
    fixed = dataclasses.replace(inp, mode=DecodeMode.FIXED)
    assert learning.probe(fixed, ordinary, opt, _uninformed) is None
    undetermined = dataclasses.replace(ordinary, duration_ms=None)
    assert learning.probe(inp, undetermined, opt, _uninformed) is None


@spec("acceptance-learning/probe-deeper")
def test_a_probe_is_a_complete_speculative_program():
    """A mixed program with W=8 speculative rows (5 ms, like W=8) could serve the decoder as deeply,
    but a probe is one complete speculative program: W=8 itself when it is loaded, and W=4 (the
    only speculative program left with proposals) when it is not."""
    inp, ordinary, opt = _setting((W1, W4, MIXED_W8))
    assert ordinary.graph == W1
    assert learning.probe(inp, ordinary, opt, _uninformed).graph == W4


# -- rows with chosen scores ---------------------------------------------------------------------

ORDINARY_SCORE = 10.0


def _decode(rid, width, slot=None):
    return Lane(rid=rid, slot=rid if slot is None else slot, role=LaneRole.DECODE, query_length=width)


def _candidate(graph, lanes, duration_ms, score):
    return Candidate(
        graph=graph,
        lanes=tuple(lanes),
        duration_ms=duration_ms,
        score=score,
        useful_value=score,
        log_scale=0.0,
    )


def _row(graph, lanes, duration_ms, score):
    c = _candidate(graph, lanes, duration_ms, score)
    return types.SimpleNamespace(
        graph=graph, score=score, duration_ms=duration_ms, indeterminate=duration_ms is None, build=lambda: c
    )


def _probe(monkeypatch, rows, ordinary_lanes=(), views=None, information=_uninformed):
    """probe() over exactly `rows` (in that order) against an ordinary W=1 choice of score 10."""
    monkeypatch.setattr(policy, "scored", lambda inp, sel=None: list(rows))
    monkeypatch.setattr(policy, "rows_with_ragged_programs", lambda sel, floor: (list(rows), None))  # probe's
    views = views or [decoder(rid, output_remaining=100) for rid in (1, 2, 3)]
    inp = policy.SelectionInput(
        views, [W1, W4, W8, B2W8], CostModel(), 0, PolicyConfig(), DecodeMode.ADAPTIVE
    )
    ordinary = _candidate(W1, ordinary_lanes or [_decode(1, 1)], 3.0, ORDINARY_SCORE)
    return learning.probe(inp, ordinary, views, information)


@spec("acceptance-learning/rank-gain-rate")
def test_probes_rank_by_optimistic_improvement_per_execution_time(monkeypatch):
    """Against the ordinary score 10: W=4 at 4 ms scoring 14 gains 4/4 = 1.0 per ms; B=2 W=8 at
    3 ms scoring 12.5 gains 2.5/3 = 0.83; W=8 at 10 ms scoring 18 gains 8/10 = 0.8. W=4 wins,
    though W=8 improves the score most and B=2 W=8 has the best score per time."""
    rows = [
        _row(B2W8, [_decode(1, 8)], 3.0, 12.5),
        _row(W8, [_decode(1, 8)], 10.0, 18.0),
        _row(W4, [_decode(1, 4)], 4.0, 14.0),
    ]
    assert _probe(monkeypatch, rows).graph == W4


@spec("acceptance-learning/probe-can-beat", "acceptance-learning/probe-deeper")
def test_only_measured_rows_that_beat_the_ordinary_choice_and_add_depth_are_probes(monkeypatch):
    """The ordinary choice serves request 1 at W=4 with score 10. Not probes: a W=8 row scoring
    9.5 (cannot beat it), one scoring exactly 10 (only equals it), an unmeasured W=8 row (no
    duration to rank by), and a W=4 row for request 1 scoring 12 (beats it at no added depth).
    The W=8 row scoring 11 after them is the probe; alone the others give none."""
    ordinary = [_decode(1, 4)]
    losing = [
        _row(W8, [_decode(1, 8)], 5.0, 9.5),
        _row(W8, [_decode(1, 8)], 5.0, ORDINARY_SCORE),
        _row(W8, [_decode(1, 8)], None, 20.0),
        _row(W4, [_decode(1, 4)], 4.0, 12.0),
    ]
    assert _probe(monkeypatch, losing, ordinary) is None
    winner = _row(W8, [_decode(1, 8)], 5.0, 11.0)
    assert _probe(monkeypatch, losing + [winner], ordinary).score == 11.0


@spec("acceptance-learning/tie-order")
@pytest.mark.parametrize("order", ["short first", "long first"])
def test_equal_gains_and_information_prefer_the_shorter_execution(monkeypatch, order):
    """Gains 4/4 = 2/2 = 1.0 per ms and equally informed prefixes: the 2 ms execution wins,
    whichever comes first."""
    short, long = _row(W8, [_decode(1, 8)], 2.0, 12.0), _row(W8, [_decode(1, 8)], 4.0, 14.0)
    rows = [short, long] if order == "short first" else [long, short]
    assert _probe(monkeypatch, rows).duration_ms == 2.0


@spec("acceptance-learning/tie-order")
def test_equal_gains_information_and_durations_prefer_the_smaller_geometry(monkeypatch):
    """W=8 and W=4 (B=1) both gain 4/4: the smaller physical geometry, W=4, wins."""
    rows = [_row(W8, [_decode(1, 8)], 4.0, 14.0), _row(W4, [_decode(1, 4)], 4.0, 14.0)]
    assert _probe(monkeypatch, rows).graph == W4


@spec("acceptance-learning/tie-order")
def test_a_complete_tie_keeps_the_candidate_scored_first(monkeypatch):
    """Two W=8 rows, one deepening request 2 and one request 3, equal in gain, information,
    duration and geometry: the first scored is the probe, in either order."""
    two, three = _row(W8, [_decode(2, 8)], 4.0, 14.0), _row(W8, [_decode(3, 8)], 4.0, 14.0)
    assert _probe(monkeypatch, [two, three]).lanes[0].rid == 2
    assert _probe(monkeypatch, [three, two]).lanes[0].rid == 3


@spec("acceptance-learning/probe-deeper", "acceptance-learning/tie-order")
def test_added_depths_are_measured_from_the_ordinary_width_of_each_request(monkeypatch):
    """The ordinary choice serves request 1 at W=4 (and request 4's prompt). A B=2 W=8 row serving
    request 1 at 8 rows, request 2 at 2 rows (limited) and request 3 at 1 row adds depths 4..7 for
    request 1 (from width 4 to 8) and depth 1 for request 2 (from 1, the width of a request the
    ordinary choice does not serve, to 2); request 3 adds nothing. The least-informed added prefix
    is asked for exactly those."""
    calls = []

    def information(rid, from_width, to_width):
        calls.append((rid, from_width, to_width))
        return 2.0

    views = [decoder(rid, output_remaining=100) for rid in (1, 2, 3)] + [prompt(4, 64)]
    ordinary = [_decode(1, 4), Lane(rid=4, slot=4, role=LaneRole.PROMPT, prompt_tokens=64)]
    row = _row(B2W8, [_decode(1, 8), _decode(2, 2), _decode(3, 1)], 5.0, 12.0)
    assert _probe(monkeypatch, [row], ordinary, views, information) is not None
    assert sorted(calls) == [(1, 4, 8), (2, 1, 2)]
