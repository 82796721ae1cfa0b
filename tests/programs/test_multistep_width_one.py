"""Multi-step width-one speculative programs (K steps in one `lax.scan`) against K single
width-one rounds (RESOLUTIONS.md, 25).

A width-one round is a decode step that also absorbs the committed pair into the draft (MTP)
context, so a later wider round can draft from it (`speculative-coverage/width-one-draft-context`).
Two drivers over the same model, pages and seeds: one runs the K-step program, the other the
single-step width-one program K times. Tokens, counts, every row's cursor, pending token, PRNG key
and output counter, the target cache **and the draft cache** must be equal, and a wider round
run next on both must propose, verify and emit the same; a stop token or a step limit mid-scan
ends the lane exactly where single rounds would have stopped it.
"""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind

from .helpers import (
    COUPLED,
    MULTISTEP_K,
    RECT,
    SAMPLED,
    STEP_PROMPTS,
    WIDTH_ONE,
    WIDTH_ONE_K,
    emitted,
    single_steps,
    started,
    states_equal,
)

spec = pytest.mark.spec
K = MULTISTEP_K
BOTH = ("target", "draft")


@spec("speculative-coverage/width-one-draft-context")
@pytest.mark.parametrize("sampling", [{}, SAMPLED, COUPLED], ids=["greedy", "sampled", "coupled"])
def test_k_steps_equal_k_width_one_rounds_and_keep_the_draft_context(
    spec_multistep_programs, params, sampling
):
    slots = sorted(STEP_PROMPTS)
    multi, single = (started(spec_multistep_programs, params, sampling) for _ in range(2))
    streams = [[] for _ in slots]
    for _ in range(2):
        out = multi.run(WIDTH_ONE_K, slots=slots, page_tables=multi.tables(slots))
        assert np.asarray(out.counts).tolist() == [K, K]
        for lane in range(len(slots)):
            streams[lane].extend(emitted(out, lane))
    assert streams == single_steps(single, WIDTH_ONE, slots, [2 * K] * len(slots))
    states_equal(multi, single, slots, BOTH)
    # Drafting resumes from the same context: a wider round proposes and commits the same.
    wide = [
        d.run(RECT, slots=slots, page_tables=d.tables(slots), query_lengths=[4, 4]) for d in (multi, single)
    ]
    for field in ("tokens", "counts", "sidecar"):
        np.testing.assert_array_equal(
            np.asarray(getattr(wide[0], field)), np.asarray(getattr(wide[1], field))
        )


def test_k_steps_write_the_draft_context(spec_multistep_programs, params):
    """The K-step width-one program's draft writes are real: the draft cache after it differs
    from the cache the prompts left (a step without the upkeep would leave it unchanged)."""
    slots = sorted(STEP_PROMPTS)
    d = started(spec_multistep_programs, params, {})
    before = np.asarray(d.state.draft.k).copy()
    d.run(WIDTH_ONE_K, slots=slots, page_tables=d.tables(slots))
    after = np.asarray(d.state.draft.k)
    changed = ~np.isclose(before, after, equal_nan=True)
    assert changed.any()


@spec("useful-service/conditional-acceptance")
def test_stop_token_and_limit_mid_scan(spec_multistep_programs, params):
    slots = sorted(STEP_PROMPTS)
    probe = started(spec_multistep_programs, params, SAMPLED)
    ahead = single_steps(probe, WIDTH_ONE, slots, [K, K])
    stop = ahead[0][2]
    ends = ahead[0].index(stop) + 1
    multi = started(spec_multistep_programs, params, SAMPLED)
    out = multi.run(
        WIDTH_ONE_K, slots=slots, page_tables=multi.tables(slots), steps=[K, 2], stop_tokens=[[stop], []]
    )
    assert np.asarray(out.counts).tolist() == [ends, 2]
    assert emitted(out, 0) == ahead[0][:ends] and emitted(out, 1) == ahead[1][:2]
    single = started(spec_multistep_programs, params, SAMPLED)
    single_steps(single, WIDTH_ONE, slots, [ends, 2])
    states_equal(multi, single, slots, BOTH)


def test_width_one_k_step_shape_and_inputs(spec_multistep_programs):
    program = spec_multistep_programs[WIDTH_ONE_K.key]
    assert program.shape.steps == K and program.shape.maintain_draft
    assert program.descriptor.kind is GraphKind.SPECULATIVE and not program.shape.takes_token_mask
    assert str(WIDTH_ONE_K.key).endswith(f",S={K}]")
    with pytest.raises(ValueError, match="token masks"):
        program.pack(slots=[0], page_tables=[[0]], token_masks={0: [0]})
