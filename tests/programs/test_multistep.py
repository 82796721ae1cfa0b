"""Multi-step decode (K steps in one `lax.scan`) against K single-step executions.

Two drivers over the same model, pages and seeds: one runs the K-step program, the other the
single-step program K times. Tokens, counts and every row's cursor, pending token, PRNG key and
output counter must be equal, greedy and sampled; a stop token or a step limit mid-scan must end
the lane exactly where single steps would have stopped it (nothing emitted or written past it).
"""

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import GraphKind

from .helpers import (
    DECODE,
    Driver,
    emitted,
    greedy_reference,
    reliable_prefix,
)

spec = pytest.mark.spec
K = 4
DECODE_K = dataclasses.replace(DECODE, steps=K)
PROMPTS = {0: [5, 9, 17, 3, 3, 41, 7], 2: [11, 2, 60, 9, 1, 33, 8, 19, 4, 4, 2]}
SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=40)
COUPLED = dict(SAMPLED, coupled=True)  # a seeded request: draws keyed by seed and position


def _started(programs, params, sampling: dict) -> Driver:
    d = Driver(programs, params, seed=3)
    for slot, prompt in PROMPTS.items():
        d.initialize(slot, seed=100 + slot, **sampling)
        d.prefill(slot, prompt)
    return d


def _single_steps(d: Driver, slots, limits) -> list[list[int]]:
    """Single-step decodes, lane by lane up to its limit (None: a stop token ends it)."""
    streams = [[] for _ in slots]
    for j in range(max(limits)):
        running = [s for s, n in zip(slots, limits) if j < n]
        out = d.run(DECODE, slots=running, page_tables=d.tables(running))
        for lane, slot in enumerate(running):
            streams[slots.index(slot)].extend(emitted(out, lane))
    return streams


def _rows_equal(a: Driver, b: Driver, slots) -> None:
    for s in slots:
        assert a.row(s) == b.row(s)
        assert np.array_equal(np.asarray(a.state.rng[s]), np.asarray(b.state.rng[s]))
    np.testing.assert_allclose(
        np.asarray(a.state.target.k), np.asarray(b.state.target.k), rtol=1e-5, atol=1e-5, equal_nan=True
    )


@spec("useful-service/output-progress")
@pytest.mark.parametrize("sampling", [{}, SAMPLED, COUPLED], ids=["greedy", "sampled", "coupled"])
def test_k_steps_equal_k_single_steps(multistep_programs, params, sampling):
    slots = sorted(PROMPTS)
    multi, single = (_started(multistep_programs, params, sampling) for _ in range(2))
    streams = [[] for _ in slots]
    for _ in range(3):  # 3 executions of K steps = 3K single steps
        out = multi.run(DECODE_K, slots=slots, page_tables=multi.tables(slots))
        assert np.asarray(out.counts).tolist() == [K, K]
        for lane in range(len(slots)):
            streams[lane].extend(emitted(out, lane))
    assert streams == _single_steps(single, slots, [3 * K] * len(slots))
    _rows_equal(multi, single, slots)
    if not sampling:  # and greedy output is the model's own continuation
        for lane, slot in enumerate(slots):
            want, margins = greedy_reference(params, PROMPTS[slot], 3 * K + 1)
            n = min(reliable_prefix(margins), 3 * K + 1) - 1
            assert n >= 6 and streams[lane][:n] == want[1 : n + 1]


@spec("useful-service/conditional-acceptance")
@pytest.mark.parametrize("sampling", [{}, SAMPLED, COUPLED], ids=["greedy", "sampled", "coupled"])
def test_stop_token_and_limit_mid_scan_deliver_nothing_past_the_end(multistep_programs, params, sampling):
    slots = sorted(PROMPTS)
    probe = _started(multistep_programs, params, sampling)
    ahead = _single_steps(probe, slots, [K, K])
    # Lane 0 stops on its third token (its first occurrence); lane 1 is limited to two steps.
    stop = ahead[0][2]
    ends = ahead[0].index(stop) + 1
    multi = _started(multistep_programs, params, sampling)
    out = multi.run(
        DECODE_K, slots=slots, page_tables=multi.tables(slots), steps=[K, 2], stop_tokens=[[stop], []]
    )
    assert np.asarray(out.counts).tolist() == [ends, 2]
    assert emitted(out, 0) == ahead[0][:ends] and emitted(out, 1) == ahead[1][:2]
    tokens = np.asarray(out.tokens)
    assert not tokens[0, ends:].any() and not tokens[1, 2:].any()
    single = _started(multistep_programs, params, sampling)
    _single_steps(single, slots, [ends, 2])
    for s in slots:  # the rows stopped where single steps stopped: no state past the end
        assert multi.row(s) == single.row(s)
        assert np.array_equal(np.asarray(multi.state.rng[s]), np.asarray(single.state.rng[s]))


def test_multistep_program_shape(multistep_programs):
    program = multistep_programs[DECODE_K.key]
    assert program.shape.steps == K and program.descriptor.kind is GraphKind.DECODE
    assert str(DECODE_K.key).endswith(f",S={K}]") and str(DECODE.key).endswith("P=2]")
