"""Selection cases that the rest of the suite leaves open: each pins a choice whose numbers
only come out right when one particular step of the selector does (found by mutating the
policy package and keeping the mutants no other test noticed)."""

import math

import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference import cohorts
from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import POLICY, RAGGED, decoder, prompt
from .test_prerequisites import HOST_P6, _sequence_oracle, blocked, terminal, with_graphs

spec = pytest.mark.spec


@spec(
    "prerequisites/terminal-two-stage",
    "prerequisites/first-finishes-terminal",
    "prerequisites/joint-cohorts",
    "prerequisites/pair-exact",
    "useful-service/adaptive-causal-pricing",
)
def test_a_snapshot_before_an_adaptive_ragged_follower_keeps_its_most_valuable_terminal_row():
    """A snapshot B=4 (0.5 ms) then ragged-small's host ragged program B=4, W=4, P=6 (4.5 ms),
    adaptive mode: U = 5 ms. Four streams blocked behind the snapshot (x = 2, z = 0.01,
    A = 10, survival 0.5) and two terminal rows aged 200 and 0 ms.

    - a newly ready decoder on two rows (E = 1.5; deeper rows survive with probability 0):
      72*1.5 + 4/0.01 + 0.1*U*(10 + U) = 515.5; on one row 479.5;
    - a terminal row (K_terminal = 2, sigma_terminal = 0.4): 256 + 0.4*(A + 0.5) + A*4.5 +
      (25 - 0.25)/2: 1248.575 aged 200, 268.575 aged 0.

    The snapshot's four rows go to k enabled streams and the best 4 - k terminal rows: three
    streams and the old terminal row, 3*515.5 + 1248.575 = 2795.075, beat two streams with both
    terminal rows (2*515.5 + 1517.15 = 2548.15) and four streams (2*515.5 + 2*479.5 = 1990).
    Pricing the 4 - k rows with the *least* valuable terminal rows instead (268.575 for k = 3)
    would take two streams and both terminals. Score: 2795.075/5 - 5/2*(4*0.1 + 2*1) = 553.015,
    what enumerating every joint cohort of the pair finds."""
    snap4 = GraphDescriptor(GraphKind.SNAPSHOT, 4, duration_ms=0.5)
    views = [blocked(i, [GraphKind.SNAPSHOT], Phase.DECODE, z=0.01) for i in (1, 2, 3, 4)] + [
        terminal(5, age_ms=200.0),
        terminal(6, age_ms=0.0),
    ]
    inp = with_graphs([snap4], catalog=RAGGED, mode=DecodeMode.ADAPTIVE, views=views)
    c = next(
        c
        for c in policy.candidates(inp)
        if c.graph == snap4 and c.following is not None and c.following.graph.name == HOST_P6
    )
    scale = math.exp(c.log_scale)
    assert [(lane.rid, lane.role) for lane in c.lanes] == [
        (1, LaneRole.PREREQUISITE),
        (2, LaneRole.PREREQUISITE),
        (3, LaneRole.PREREQUISITE),
        (5, LaneRole.TERMINAL),
    ]
    assert c.lanes[3].value * scale == pytest.approx(1248.575)
    assert sorted((lane.rid, lane.query_length) for lane in c.following.lanes) == [(1, 2), (2, 2), (3, 2)]
    assert [lane.value * scale for lane in c.following.lanes] == pytest.approx([515.5] * 3)
    assert c.useful_value * scale == pytest.approx(3 * 515.5 + 1248.575)
    assert c.score * scale == pytest.approx(2795.075 / 5 - 2.5 * 2.4)
    obj = cohorts.Objective(views, inp.graphs, inp.costs, POLICY)
    want, _ = _sequence_oracle(obj, views, inp.graphs, inp.costs, DecodeMode.ADAPTIVE)[
        (snap4.key, c.following.graph.key)
    ]
    assert c.score == pytest.approx(want, rel=1e-9)


def _mixed(batch, capacity):
    return GraphDescriptor(
        GraphKind.MIXED,
        batch,
        token_capacity=1,
        prefill_capacity=capacity,
        target_capacity=capacity + batch - 1,
    )


@spec("duration-estimates/prefill-explore-smaller", "useful-service/dominance-mixed")
def test_mixed_exploration_is_excluded_only_by_a_smaller_capacity_of_the_same_shape():
    """Mixed B=2 C=64 (measured, 4.9 ms), B=2 C=128 and B=4 C=128 (both unmeasured), three
    decoders and a 100-token prompt whose next endpoint is at token 60.

    B=2 C=128 would consume all 100 tokens against B=2 C=64's 64 (so it is not dominated), but
    up to the endpoint both consume the same 60: the unmeasured B=2 C=128 is not explored with
    the prompt row. B=4 C=128 serves three decoders beside the prompt, B=2 C=64 only one, so no
    smaller capacity *of its shape* exists and its prompt row, unmeasured, is explored with all
    100 tokens; a smaller capacity of another shape does not exclude it."""
    b2c64, b2c128, b4c128 = _mixed(2, 64), _mixed(2, 128), _mixed(4, 128)
    costs = CostModel()
    costs.observe(b2c64.key, [4.9e6], 0)
    views = [prompt(1, 100, endpoint=60)] + [decoder(i) for i in (2, 3, 4)]
    inp = policy.SelectionInput(views, (b2c64, b2c128, b4c128), costs, 0, POLICY, DecodeMode.ORDINARY)
    with_prompt = {
        (c.graph.batch_capacity, c.graph.prefill_capacity): (
            c.lanes[c.prefill_row].prompt_tokens,
            c.indeterminate,
            sorted(c.rids),
        )
        for c in policy.candidates(inp)
        if c.prefill_row is not None
    }
    assert with_prompt == {(2, 64): (64, False, [1, 2]), (4, 128): (100, True, [1, 2, 3, 4])}


@spec("speculative-coverage/prefix-limit-ceilings", "speculative-coverage/ceiling-bound")
def test_a_rectangular_device_allocated_program_gives_each_lane_its_ceiling():
    """A rectangular speculative program (P = B*W) whose rows the device allocates
    (prefix_limit): no aggregate capacity binds, and each lane carries its width as the device's
    ceiling (the reference's lane limit: 4, and 2 for a decoder with two output tokens left),
    not host query rows."""
    from helios_jax.catalog import Allocation

    g = GraphDescriptor(
        GraphKind.SPECULATIVE,
        2,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=8,
        allocation=Allocation.PREFIX_LIMIT,
        duration_ms=4.0,
    )
    views = [decoder(1, survival=(0.9, 0.8, 0.7)), decoder(2, survival=(0.9, 0.8, 0.7), output_remaining=2)]
    inp = with_graphs([g], catalog=RAGGED, views=views, mode=DecodeMode.ADAPTIVE)
    (c,) = [c for c in policy.candidates(inp) if c.graph == g]
    assert sorted((lane.rid, lane.ceiling, lane.query_length) for lane in c.lanes) == [
        (v.rid, cohorts._lane_limit(v, g), 0) for v in views
    ]
    assert [cohorts._lane_limit(v, g) for v in views] == [4, 2]
