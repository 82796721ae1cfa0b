"""Batch-invariant numerics: a request's tokens and log-probabilities do not depend on its batch.

Sixteen requests decode greedily in every decode shape an engine with 16 request slots prepares:
alone (B = 1), in groups of 2, 4 and 8, all sixteen at once, and sixteen at once in a 4-step
program. A request must get the same tokens in each, and the top-20 log-probabilities behind
every token (the log-softmax of its logits row) must agree within float32 tolerance: a lane's
numbers may not leak into, or be rounded differently because of, its neighbours (a known failure
of batched serving engines: accuracy that drops when the batch grows). Groups take slots in a
shuffled order so that a request sits in a different lane in each shape.
"""

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import Catalog, GraphDescriptor, GraphKind

from .helpers import PAGE_SIZE, PREFILLS, SPECULATIVE_ENGINE, STATE_OPS, Driver, build

SLOTS = 16
STEPS = 8
MULTI = 4
MAX_LEN = 32  # prompts of 3..15 tokens and 8 more
ENGINE = SPECULATIVE_ENGINE.replace(
    request_slots=SLOTS,
    speculation="off",
    draft_tokens=0,
    proposal_depths=None,
    decode_steps=(1, MULTI),
    max_model_len=MAX_LEN,
    kv_pages=(SLOTS + 1) * MAX_LEN // PAGE_SIZE,
)
BATCHES = (1, 2, 4, 8, 16)
DECODES = {b: GraphDescriptor(GraphKind.DECODE, b, token_capacity=1, target_capacity=b) for b in BATCHES}
MULTI_STEP = dataclasses.replace(DECODES[SLOTS], steps=MULTI)


@pytest.fixture(scope="module")
def programs(params):
    graphs = PREFILLS + tuple(DECODES.values()) + (MULTI_STEP,) + STATE_OPS
    catalog = Catalog("test-batch-invariance", "ordinary", ENGINE.speculative_token_capacity, SLOTS, graphs)
    return build(ENGINE, catalog, params)


def _prompts() -> dict[int, list[int]]:
    rng = np.random.default_rng(11)
    return {s: [int(t) for t in rng.integers(1, 250, size=int(rng.integers(3, 16)))] for s in range(SLOTS)}


def _decode(programs, params, batch: int, graph=None) -> tuple[dict, dict]:
    """Every slot's STEPS greedy tokens and per-token top log-probabilities, decoding the slots in
    groups of `batch` (shuffled, so that each request sits in another lane)."""
    d = Driver(programs, params, seed=batch)
    for slot, prompt in _prompts().items():
        d.initialize(slot, logprobs=True)  # every row asks: the programs score every token
        d.prefill(slot, prompt)
    order = [int(s) for s in np.random.default_rng(batch).permutation(SLOTS)]
    tokens = {s: [] for s in range(SLOTS)}
    top = {s: [] for s in range(SLOTS)}
    graph = graph or DECODES[batch]
    for start in range(0, SLOTS, batch):
        group = order[start : start + batch]
        for _ in range(STEPS // graph.steps):
            out = d.run(graph, slots=group, page_tables=d.tables(group))
            for lane, slot in enumerate(group):
                n = int(out.counts[lane])
                tokens[slot] += [int(t) for t in np.asarray(out.tokens)[lane, :n]]
                top[slot] += list(np.asarray(out.top_logprobs)[lane, :n])
    return tokens, top


def test_a_requests_numbers_do_not_depend_on_its_batch(programs, params):
    want_tokens, want_top = _decode(programs, params, 1)
    assert all(len(t) == STEPS for t in want_tokens.values())
    runs = {f"B={b}": _decode(programs, params, b) for b in BATCHES[1:]}
    runs[f"B={SLOTS}, {MULTI} steps"] = _decode(programs, params, SLOTS, MULTI_STEP)
    assert np.isfinite(np.concatenate([np.ravel(v) for v in want_top.values()])).all()
    for name, (tokens, top) in runs.items():
        assert tokens == want_tokens, name
        for slot in range(SLOTS):
            np.testing.assert_allclose(
                np.asarray(top[slot]),
                np.asarray(want_top[slot]),
                rtol=0,
                atol=2e-5,
                err_msg=f"{name} slot {slot}",
            )
