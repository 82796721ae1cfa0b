"""K-step width-one speculative programs in selection and completion (RESOLUTIONS.md, 25).

Under speculation the width-one round is the decode step that keeps the draft context; with
K > 1 steps it is valued and bounded exactly as K-step decode: min(K, output left, context left,
width limit) certain tokens, one delivered burst, over its measured duration, and it is taken only
when that is more value per time than single rounds. Its completion commits up to K tokens per
lane and no acceptance observation (it verified no proposal).
"""

import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler import policy

from .helpers import SPEC, TIMING, burst_records, choose, decoder, first_generation_plan, inputs

spec = pytest.mark.spec
K = 8


def _catalog(speedup: float):
    """The speculative catalog plus K-step width-one programs measured at speedup x K rounds."""
    return with_decode_steps(SPEC, (K,), speedup)


def _width_one_k(g) -> bool:
    return g.kind is GraphKind.SPECULATIVE and g.token_capacity == 1 and g.steps == K


@spec("useful-service/score-formula", "speculative-coverage/width-one-competes")
@pytest.mark.parametrize("mode", [DecodeMode.ADAPTIVE, DecodeMode.FIXED])
@pytest.mark.parametrize("speedup, wins", [(0.3, True), (1.0, False), (1.3, False)])
def test_selector_takes_k_width_one_steps_only_when_worth_the_time(mode, speedup, wins):
    views = [decoder(i, age_ms=5.0, survival=(0.05,)) for i in range(4)]  # drafts barely pay
    fixed = 1 if mode is DecodeMode.FIXED else None
    chosen = choose(views, catalog=_catalog(speedup), mode=mode, fixed_width=fixed)
    assert chosen.kind is GraphKind.SPECULATIVE and chosen.graph.token_capacity == 1
    assert _width_one_k(chosen.graph) is wins
    if wins:  # every lane runs all K steps, one delivery each
        assert [lane.ceiling for lane in chosen.lanes] == [K] * 4
        assert [lane.expected_tokens for lane in chosen.lanes] == [K] * 4


@spec("useful-service/conditional-acceptance", "useful-service/dominance-prune")
def test_steps_respect_limits_and_equal_work_is_the_smaller_program():
    cat = _catalog(0.3)

    def k_step(views):
        return [c for c in policy.candidates(inputs(views, catalog=cat)) if _width_one_k(c.graph)]

    few = [decoder(0, output_remaining=3), decoder(1, output_remaining=5, width_limit=2)]
    steps = {c.graph.batch_capacity: sorted(lane.ceiling for lane in c.lanes) for c in k_step(few)}
    assert steps == {1: [3], 2: [2, 3]}  # larger batches do the B = 2 program's work: dominated
    last = [decoder(i, output_remaining=1) for i in range(3)]
    assert k_step(last) == []  # one token left: a single round's work


@spec(
    "useful-service/output-progress",
    "confidence-acceptance/width-one-no-acceptance",
    "planning-queue/queued-lane-bound",
)
def test_completion_commits_k_tokens_and_learns_no_acceptance():
    s, plan, fence = first_generation_plan(_catalog(0.1), GraphKind.SPECULATIVE, mode="adaptive")
    assert _width_one_k(plan.graph) and plan.lanes[0].ceiling == 5  # 6 allowed, 1 already out
    assert plan.max_advance(plan.lanes[0]) == 5
    s.commit(plan, fence)
    with pytest.raises(ValueError, match="tokens from a lane of 5 steps"):
        s.complete(fence, burst_records(plan, (1,) * 6), TIMING)  # past the lane's steps: refused
    (gen,) = s.complete(fence, burst_records(plan, (1, 2, 3, 4, 5)), TIMING)
    assert gen.tokens == (1, 2, 3, 4, 5) and gen.finished and gen.finish_reason == "length"
    assert s.speculative["drafts_offered"] == 0 and not s.offered_by_position
    s, plan, fence = first_generation_plan(
        _catalog(0.1), GraphKind.SPECULATIVE, mode="adaptive", stop_token_ids=(7,)
    )
    s.commit(plan, fence)
    (gen,) = s.complete(fence, burst_records(plan, (1, 7)), TIMING)
    assert gen.tokens == (1, 7) and gen.finish_reason == "stop"
