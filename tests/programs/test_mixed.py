"""A mixed graph equals the same work run as separate prefill and decode/speculative programs.

Two engines start from identical states (same page reservations, seeds and NaN-poisoned pools):
two requests already decoding (slots 0 and 1) and a third whose 16-token prompt is waiting
(slot 2). Engine A runs one mixed frame (decode rows of width up to W plus the prompt row at a
nonzero packed offset); engine B runs the prefill program for the prompt and a separate
speculative (or ordinary decode) program for the decoders. Emitted tokens, per-row state and
both KV pools must agree: bitwise for integers and untouched bytes (NaN stays NaN), within
float32 batching noise (1e-5) for written K/V and hidden states. Sampling draws come from each
row's own key, so a sampled frame matches too.
"""

import numpy as np
import pytest

from helios_jax.programs.packing import packed_offsets, sampling_mask

from .helpers import DECODE, MIXED_ORDINARY, MIXED_W1, MIXED_W4, PREFILLS, RECT, WIDTH_ONE, Driver, emitted

spec = pytest.mark.spec
DECODERS = (0, 1)
NEWCOMER = 2
PROMPTS = {0: [3, 1, 4, 1, 5, 9, 2, 6, 5], 1: [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3]}
NEW_PROMPT = [11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71]


def _engines(programs, params, **sampling):
    engines = []
    for _ in range(2):
        d = Driver(programs, params, seed=5)
        for slot, prompt in PROMPTS.items():
            d.initialize(slot, seed=slot, **sampling)
            d.prefill(slot, prompt)
        d.initialize(NEWCOMER, seed=9, **sampling)
        engines.append(d)
    return engines


def _assert_same_state(a, b):
    for field in ("cursor", "pending", "generated", "rng", "coupled", "temperature", "top_k", "top_p"):
        np.testing.assert_array_equal(
            np.asarray(getattr(a.state, field)), np.asarray(getattr(b.state, field)), field
        )
    np.testing.assert_allclose(np.asarray(a.state.last_hidden), np.asarray(b.state.last_hidden), atol=1e-5)
    caches = [("target", a.state.target, b.state.target)]
    if a.state.draft is not None:
        caches.append(("draft", a.state.draft, b.state.draft))
    for name, x, y in caches:
        for kv in ("k", "v"):
            u, w = np.asarray(getattr(x, kv)), np.asarray(getattr(y, kv))
            np.testing.assert_array_equal(np.isnan(u), np.isnan(w), f"{name}.{kv}: written positions differ")
            np.testing.assert_allclose(u, w, atol=1e-5, equal_nan=True, err_msg=f"{name}.{kv}")


@spec(
    "mixed-execution/shared-forward",
    "mixed-execution/prompt-row-commit",
    "mixed-execution/spec-row-commit",
    "mixed-execution/complete-by-phase",
    "mixed-execution/separate-updates",
    "mixed-execution/disjoint-publication",
    "mixed-execution/prompt-upload",
    "mixed-execution/packed-offsets",
    "mixed-execution/decoder-inputs",
    "verification/mixed-decode-rows",
    "verification/input-sampling-masks",
)
@pytest.mark.parametrize("case", ["w4_greedy", "w4_copy", "w4_sampled", "w4_coupled", "w1_speculative"])
def test_mixed_frame_equals_separate_programs(spec_programs, params, case):
    sampling = dict(temperature=0.8, top_p=0.9) if case in ("w4_sampled", "w4_coupled") else {}
    if case == "w4_coupled":  # seeded requests: draws keyed by seed and position
        sampling.update(top_k=40, coupled=True)
    mixed, separate = _engines(spec_programs, params, **sampling)
    graph, other = (MIXED_W1, WIDTH_ONE) if case == "w1_speculative" else (MIXED_W4, RECT)
    lengths = [1, 1] if case == "w1_speculative" else [4, 2]
    copies = None
    if case == "w4_copy":
        # Copy the pending token's successors as the model would produce them: whatever they are,
        # both engines verify the same supplied prefixes.
        copies = [[7, 8, 9], [mixed.row(1)["pending"]]]
    # A: one mixed frame, lanes [decoder 0, prompt, decoder 1]: the prompt sits at offset 4.
    host = dict(
        slots=[0, NEWCOMER, 1],
        page_tables=mixed.tables([0, NEWCOMER, 1]),
        query_lengths=[lengths[0], len(NEW_PROMPT), lengths[1]],
        prefill_row=1,
        prompt_tokens=NEW_PROMPT,
        prompt_ends=True,
    )
    if copies is not None:
        host["copy_proposals"] = [copies[0], None, copies[1]]
    program = mixed.program(graph)
    inputs = program.pack(**host)
    offset = packed_offsets(inputs.query_lengths)[1]
    assert offset == lengths[0]
    np.testing.assert_array_equal(inputs.tokens[offset : offset + len(NEW_PROMPT)], NEW_PROMPT)
    mixed.state, out = program(mixed.params, mixed.state, inputs)
    mask = sampling_mask(program.shape, 3, prefill_row=1, prompt_ends=True)
    np.testing.assert_array_equal(np.asarray(out.counts) > 0, mask)
    # B: the same work as a prefill and a separate round.
    first = separate.run(
        PREFILLS[0], slot=NEWCOMER, tokens=NEW_PROMPT, page_table=separate.pages[NEWCOMER], prompt_ends=True
    )
    spec_host = dict(slots=list(DECODERS), page_tables=separate.tables(DECODERS), query_lengths=lengths)
    if copies is not None:
        spec_host["copy_proposals"] = copies
    rest = separate.run(other, **spec_host)
    assert emitted(out, 1) == [int(first.tokens[0])]
    assert emitted(out, 0) == emitted(rest, 0) and emitted(out, 2) == emitted(rest, 1)
    np.testing.assert_array_equal(np.asarray(out.query_lengths)[[0, 2]], np.asarray(rest.query_lengths))
    np.testing.assert_allclose(np.asarray(out.survival)[[0, 2]], np.asarray(rest.survival), atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.sidecar), np.asarray(rest.sidecar), atol=1e-5)
    _assert_same_state(mixed, separate)
    assert mixed.row(NEWCOMER)["cursor"] == len(NEW_PROMPT)


@spec(
    "mixed-execution/width-one-forward",
    "mixed-execution/ordinary-capture",
    "mixed-execution/one-prompt-row",
    "mixed-execution/prompt-row-commit",
)
def test_ordinary_mixed_equals_prefill_plus_decode(ordinary_programs, params):
    mixed, separate = _engines(ordinary_programs, params)
    assert mixed.state.draft is None  # an ordinary engine keeps no draft context
    # A non-final chunk first: the prompt row commits its tokens but emits nothing.
    half = len(NEW_PROMPT) // 2
    for d, program in ((mixed, MIXED_ORDINARY), (separate, None)):
        if program is None:
            d.run(
                PREFILLS[0],
                slot=NEWCOMER,
                tokens=NEW_PROMPT[:half],
                page_table=d.pages[NEWCOMER],
                prompt_ends=False,
            )
            continue
        out = d.run(
            program,
            slots=[NEWCOMER],
            page_tables=d.tables([NEWCOMER]),
            query_lengths=[half],
            prefill_row=0,
            prompt_tokens=NEW_PROMPT[:half],
            prompt_ends=False,
        )
        assert int(out.counts[0]) == 0
    out = mixed.run(
        MIXED_ORDINARY,
        slots=[0, NEWCOMER],
        page_tables=mixed.tables([0, NEWCOMER]),
        query_lengths=[1, len(NEW_PROMPT) - half],
        prefill_row=1,
        prompt_tokens=NEW_PROMPT[half:],
        prompt_ends=True,
    )
    first = separate.run(
        PREFILLS[0],
        slot=NEWCOMER,
        tokens=NEW_PROMPT[half:],
        page_table=separate.pages[NEWCOMER],
        prompt_ends=True,
    )
    rest = separate.run(DECODE, slots=[0], page_tables=separate.tables([0]))
    assert emitted(out, 1) == [int(first.tokens[0])] and emitted(out, 0) == emitted(rest, 0)
    _assert_same_state(mixed, separate)


@spec(
    "mixed-execution/prompt-only-legal", "mixed-execution/prefill-row-input", "mixed-execution/query-length"
)
def test_decode_only_and_prompt_only_populations(spec_programs, params):
    """prefill_row = -1 runs decode rows only; a prompt-only frame equals the prefill program."""
    mixed, separate = _engines(spec_programs, params)
    out = mixed.run(MIXED_W4, slots=list(DECODERS), page_tables=mixed.tables(DECODERS), query_lengths=[3, 4])
    assert (
        mixed.program(MIXED_W4)
        .pack(slots=[0], page_tables=mixed.tables([0]), query_lengths=[1])
        .prefill_row[0]
        == -1
    )
    rest = separate.run(
        RECT, slots=list(DECODERS), page_tables=separate.tables(DECODERS), query_lengths=[3, 4]
    )
    assert [emitted(out, i) for i in range(2)] == [emitted(rest, i) for i in range(2)]
    out = mixed.run(
        MIXED_W4,
        slots=[NEWCOMER],
        page_tables=mixed.tables([NEWCOMER]),
        query_lengths=[len(NEW_PROMPT)],
        prefill_row=0,
        prompt_tokens=NEW_PROMPT,
        prompt_ends=True,
    )
    first = separate.run(
        PREFILLS[0], slot=NEWCOMER, tokens=NEW_PROMPT, page_table=separate.pages[NEWCOMER], prompt_ends=True
    )
    assert emitted(out, 0) == [int(first.tokens[0])]
    assert int(out.query_lengths[0]) == len(NEW_PROMPT)
    _assert_same_state(mixed, separate)
