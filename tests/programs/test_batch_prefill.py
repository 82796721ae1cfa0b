"""Multi-prompt prefill (B prompt rows in one execution) against B single-row prefills.

Two drivers over the same model, pages and seeds: one runs the B-row prefill program, the other
the single-row program once per row. Rows of different lengths (a whole short prompt, a first
chunk that does not end its prompt, a padding row left empty) must leave every row's cursor,
pending token, output counter, PRNG key and carried hidden state, the target and draft caches,
and the first output tokens exactly as the single-row executions leave them, greedy and seeded.
"""

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import Catalog, GraphKind

from .helpers import (
    CHUNK,
    MARGIN_TOL,
    PREFILLS,
    SPECULATIVE_ENGINE,
    STATE_OPS,
    Driver,
    build,
    greedy_reference,
)

spec = pytest.mark.spec
B = 4
BATCH_PREFILL = dataclasses.replace(PREFILLS[0], batch_capacity=B)
# slot -> prompt: 7 tokens (ends in one chunk), 20 (a 16-token chunk, then 4), 3 (ends); slot 2 idle
PROMPTS = {0: [5, 9, 17, 3, 3, 41, 7], 1: list(range(30, 50)), 3: [11, 2, 60]}
SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=40)


@pytest.fixture(scope="module")
def batch_programs(params):
    engine = SPECULATIVE_ENGINE.replace(prefill_batch=(1, B))
    catalog = Catalog(
        "test-batch-prefill",
        "speculative",
        engine.speculative_token_capacity,
        engine.request_slots,
        PREFILLS + (BATCH_PREFILL,) + STATE_OPS,
    )
    return build(engine, catalog, params)


def _initialized(programs, params, sampling: dict) -> Driver:
    d = Driver(programs, params, seed=3)
    for slot in range(4):
        d.initialize(slot, seed=100 + slot, **sampling)
    return d


def _chunks(step: int):
    """Round `step`'s rows: (slot, chunk, ends) for every prompt with a chunk left."""
    rows = []
    for slot, prompt in PROMPTS.items():
        chunk = prompt[step * CHUNK : (step + 1) * CHUNK]
        if chunk:
            rows.append((slot, chunk, (step + 1) * CHUNK >= len(prompt)))
    return rows


def _state_equal(a: Driver, b: Driver) -> None:
    for s in range(4):
        assert a.row(s) == b.row(s)
        assert np.array_equal(np.asarray(a.state.rng[s]), np.asarray(b.state.rng[s]))
    for x, y in (
        (a.state.last_hidden, b.state.last_hidden),
        (a.state.target.k, b.state.target.k),
        (a.state.target.v, b.state.target.v),
        (a.state.draft.k, b.state.draft.k),
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5, equal_nan=True)


@spec("useful-service/prompt-progress", "mixed-execution/inactive-no-mutation")
@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "seeded"])
def test_b_row_prefill_equals_b_single_row_prefills(batch_programs, params, sampling):
    batched, single = (_initialized(batch_programs, params, sampling) for _ in range(2))
    first = {}
    for step in range(2):
        rows = _chunks(step)
        out = batched.run(
            BATCH_PREFILL,
            slots=[s for s, _, _ in rows],
            chunks=[c for _, c, _ in rows],
            page_tables=batched.tables([s for s, _, _ in rows]),
            prompt_ends=[e for _, _, e in rows],
        )
        counts, tokens = np.asarray(out.counts), np.asarray(out.tokens)
        assert counts.tolist() == [int(e) for _, _, e in rows] + [0] * (B - len(rows))
        for lane, (slot, chunk, ends) in enumerate(rows):
            alone = single.run(
                PREFILLS[0], slot=slot, tokens=chunk, page_table=single.pages[slot], prompt_ends=ends
            )
            assert int(alone.counts[0]) == int(ends)
            if ends:
                assert int(tokens[lane]) == int(alone.tokens[0])
                first[slot] = int(tokens[lane])
        _state_equal(batched, single)
    assert sorted(first) == sorted(PROMPTS) and batched.row(2)["cursor"] == 0  # the idle slot
    if not sampling:  # greedy first tokens are the model's own continuation
        for slot, prompt in PROMPTS.items():
            want, margins = greedy_reference(params, prompt, 1)
            assert margins[0] < MARGIN_TOL or first[slot] == want[0]


@spec("mixed-execution/packed-offsets", "verification/input-packed-offsets")
def test_batch_prefill_shape_and_packing(batch_programs):
    program = batch_programs[BATCH_PREFILL.key]
    assert program.shape.lanes == B and program.shape.prefill_capacity == CHUNK
    assert program.descriptor.kind is GraphKind.PREFILL and str(BATCH_PREFILL.key).startswith("prefill[B=4,")
    inputs = program.pack(
        slots=[2, 0], chunks=[[7, 8, 9], [4, 5]], page_tables=[[1], [2]], prompt_ends=[1, 0]
    )
    assert np.asarray(inputs.tokens)[:6].tolist() == [7, 8, 9, 4, 5, 0]  # packed by prefix sums
    assert np.asarray(inputs.length).tolist() == [3, 2, 0, 0]
    assert np.asarray(inputs.prompt_ends).tolist() == [True, False, False, False]
