"""Multi-step decode (K steps in one `lax.scan`) against K single-step executions.

Two drivers over the same model, pages and seeds: one runs the K-step program, the other the
single-step program K times. Tokens, counts and every row's cursor, pending token, PRNG key and
output counter must be equal, greedy and sampled; a stop token or a step limit mid-scan must end
the lane exactly where single steps would have stopped it (nothing emitted or written past it).
"""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind

from .helpers import (
    COUPLED,
    DECODE,
    DECODE_K,
    MULTISTEP_K,
    SAMPLED,
    STEP_PROMPTS,
    emitted,
    greedy_reference,
    reliable_prefix,
    single_steps,
    started,
    states_equal,
)

spec = pytest.mark.spec
K = MULTISTEP_K


@spec("useful-service/output-progress")
@pytest.mark.parametrize("sampling", [{}, SAMPLED, COUPLED], ids=["greedy", "sampled", "coupled"])
def test_k_steps_equal_k_single_steps(multistep_programs, params, sampling):
    slots = sorted(STEP_PROMPTS)
    multi, single = (started(multistep_programs, params, sampling) for _ in range(2))
    streams = [[] for _ in slots]
    for _ in range(3):  # 3 executions of K steps = 3K single steps
        out = multi.run(DECODE_K, slots=slots, page_tables=multi.tables(slots))
        assert np.asarray(out.counts).tolist() == [K, K]
        for lane in range(len(slots)):
            streams[lane].extend(emitted(out, lane))
    assert streams == single_steps(single, DECODE, slots, [3 * K] * len(slots))
    states_equal(multi, single, slots)
    if not sampling:  # and greedy output is the model's own continuation
        for lane, slot in enumerate(slots):
            want, margins = greedy_reference(params, STEP_PROMPTS[slot], 3 * K + 1)
            n = min(reliable_prefix(margins), 3 * K + 1) - 1
            assert n >= 6 and streams[lane][:n] == want[1 : n + 1]


@spec("useful-service/conditional-acceptance")
@pytest.mark.parametrize("sampling", [{}, SAMPLED, COUPLED], ids=["greedy", "sampled", "coupled"])
def test_stop_token_and_limit_mid_scan_deliver_nothing_past_the_end(multistep_programs, params, sampling):
    slots = sorted(STEP_PROMPTS)
    probe = started(multistep_programs, params, sampling)
    ahead = single_steps(probe, DECODE, slots, [K, K])
    # Lane 0 stops on its third token (its first occurrence); lane 1 is limited to two steps.
    stop = ahead[0][2]
    ends = ahead[0].index(stop) + 1
    multi = started(multistep_programs, params, sampling)
    out = multi.run(
        DECODE_K, slots=slots, page_tables=multi.tables(slots), steps=[K, 2], stop_tokens=[[stop], []]
    )
    assert np.asarray(out.counts).tolist() == [ends, 2]
    assert emitted(out, 0) == ahead[0][:ends] and emitted(out, 1) == ahead[1][:2]
    tokens = np.asarray(out.tokens)
    assert not tokens[0, ends:].any() and not tokens[1, 2:].any()
    single = started(multistep_programs, params, sampling)
    single_steps(single, DECODE, slots, [ends, 2])
    for s in slots:  # the rows stopped where single steps stopped: no state past the end
        assert multi.row(s) == single.row(s)
        assert np.array_equal(np.asarray(multi.state.rng[s]), np.asarray(single.state.rng[s]))


def test_multistep_program_shape(multistep_programs):
    program = multistep_programs[DECODE_K.key]
    assert program.shape.steps == K and program.descriptor.kind is GraphKind.DECODE
    assert str(DECODE_K.key).endswith(f",S={K}]") and str(DECODE.key).endswith("P=2]")
