"""The per-frame token mask (`programs/token_mask.py`): xgrammar's layout, packing, and sampling.

- Layout: `apply_token_mask` leaves exactly the logits xgrammar's own
  `apply_token_bitmask_inplace` leaves (random masks, sign bits included); the host helpers
  round-trip token sets through the words.
- Packing refuses a masked lane with more than one target row (host query lengths and device
  ceilings), masks of another shape, empty masks and masks on K-step decode.
- Programs: sampled (temperature 1.5) decode and speculative rounds only ever emit allowed tokens
  for the masked lane; a greedy masked lane takes the best allowed token of the unmasked round's
  distribution; the unmasked lane beside it is bit for bit what it is without any mask.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import xgrammar

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.programs.inputs import ProgramShape
from helios_jax.programs.packing import InputError, pack_decode, pack_speculative
from helios_jax.programs.token_mask import allowed_tokens, apply_token_mask, mask_words, words_of

from .helpers import (
    DECODE,
    MAX_LEN,
    MODEL,
    PREFILLS,
    RAGGED_DEVICE,
    RECT,
    SPECULATIVE_ENGINE,
    Driver,
    _full_logits,
    as_bits,
    emitted,
)

V = MODEL.vocab_size
PROMPTS = {0: [7, 3, 250, 1, 19, 19, 4, 88, 2], 2: [40, 2, 9, 33, 5]}
ALLOWED = [3, 31, 32, 63, 200, 255]  # word boundaries and the sign bit of words 0 and 1


def test_masked_logits_equal_xgrammars_own_application():
    rng = np.random.default_rng(0)
    words = rng.integers(-(2**31), 2**31, (3, mask_words(37)), dtype=np.int64).astype(np.int32)
    logits = rng.normal(size=(3, 37)).astype(np.float32)
    want = torch.tensor(logits.copy())
    xgrammar.apply_token_bitmask_inplace(want, torch.tensor(words))
    got = apply_token_mask(
        jnp.asarray(logits)[:, None], jnp.asarray(words), jnp.ones(3, bool), jnp.ones(3, bool)
    )
    np.testing.assert_array_equal(np.asarray(got)[:, 0], want.numpy())
    assert allowed_tokens(words_of(ALLOWED, V), V).tolist() == ALLOWED
    assert words_of([31], 40).tolist() == [-(2**31), 0]


@pytest.mark.spec("verification/input-sampling-masks", "useful-service/conditional-acceptance")
def test_packing_refuses_masks_a_program_cannot_honour():
    def shape(graph):
        return ProgramShape.of(graph, SPECULATIVE_ENGINE, vocab=V)

    mask = {1: words_of(ALLOWED, V)}
    host = dict(slots=[0, 1], page_tables=[[0], [1]])
    inputs = pack_speculative(shape(RECT), query_lengths=[4, 1], token_masks=mask, **host)
    assert inputs.masked.tolist() == [False, True] and inputs.token_mask[1].tolist() == mask[1].tolist()
    assert not inputs.token_mask[0].any()
    with pytest.raises(InputError, match="lane 1: a masked lane verifies one target row"):
        pack_speculative(shape(RECT), query_lengths=[1, 2], token_masks=mask, **host)
    with pytest.raises(InputError, match="lane 1: a masked lane verifies one target row"):
        pack_speculative(shape(RAGGED_DEVICE), ceilings=[1, 4], token_masks=mask, **host)
    pack_speculative(shape(RAGGED_DEVICE), ceilings=[4, 1], token_masks=mask, **host)
    with pytest.raises(InputError, match="shape"):
        pack_decode(shape(DECODE), token_masks={0: np.zeros(3, np.int32)}, **host)
    with pytest.raises(InputError, match="allows no token"):
        pack_decode(shape(DECODE), token_masks={0: np.zeros(mask_words(V), np.int32)}, **host)
    with pytest.raises(InputError, match="outside the dense lane list"):
        pack_decode(shape(DECODE), token_masks={2: mask[1]}, **host)
    multistep = shape(GraphDescriptor(GraphKind.DECODE, 2, token_capacity=1, target_capacity=2, steps=4))
    with pytest.raises(InputError, match="multi-step"):
        pack_decode(multistep, token_masks=mask, **host)


def _last_logits(params, context) -> np.ndarray:
    """The full forward's logits after `context` (one compile, shared with greedy_reference)."""
    padded = np.zeros((MAX_LEN,), np.int32)
    padded[: len(context)] = context
    return np.asarray(_full_logits(MODEL, params, jnp.asarray(padded)))[len(context) - 1]


def _started(programs, params, temperature):
    """A driver with slots 0 and 2 initialized and prefilled, and each slot's context."""
    d = Driver(programs, params, seed=3)
    contexts = {}
    for slot, prompt in PROMPTS.items():
        d.initialize(slot, temperature=temperature, seed=slot + 1)
        contexts[slot] = list(prompt) + [d.prefill(slot, prompt)[0]]
    return d, contexts


def _round(d, kind, masks):
    slots = list(PROMPTS)
    if kind == "decode":
        return d.run(DECODE, slots=slots, page_tables=d.tables(slots), token_masks=masks)
    return d.run(RECT, slots=slots, page_tables=d.tables(slots), query_lengths=[3, 1], token_masks=masks)


@pytest.mark.spec("verification/input-sampling-masks")
@pytest.mark.parametrize("kind", ["decode", "speculative"])
def test_sampled_tokens_stay_inside_the_mask(ordinary_programs, spec_programs, params, kind):
    d, _ = _started(ordinary_programs if kind == "decode" else spec_programs, params, temperature=1.5)
    seen = set()
    for _ in range(12):
        out = _round(d, kind, {1: words_of(ALLOWED, V)})
        assert int(out.counts[1]) == 1
        seen.add(int(out.tokens[1, 0]))
    assert seen <= set(ALLOWED) and len(seen) > 1  # sampled, yet never outside the mask


@pytest.mark.parametrize("kind", ["decode", "speculative"])
def test_a_greedy_masked_lane_takes_the_best_allowed_token(ordinary_programs, spec_programs, params, kind):
    programs = ordinary_programs if kind == "decode" else spec_programs
    plain, _ = _started(programs, params, temperature=0.0)
    ref = _round(plain, kind, None)
    d, contexts = _started(programs, params, temperature=0.0)
    logits = _last_logits(params, contexts[2])
    allowed = [t for t in ALLOWED if t != int(np.argmax(logits))]
    best = sorted(allowed, key=lambda t: -logits[t])
    assert logits[best[0]] - logits[best[1]] > 1e-3  # a margin the packed forward cannot blur
    out = _round(d, kind, {1: words_of(allowed, V)})
    assert emitted(out, 1) == [best[0]]
    assert emitted(out, 0) == emitted(ref, 0)  # the unmasked lane beside it is untouched
    np.testing.assert_array_equal(as_bits(out.logprobs[0]), as_bits(ref.logprobs[0]))


def test_the_prompt_end_sample_of_prefill_honours_the_mask(spec_programs, params):
    prompt = PROMPTS[0]
    logits = _last_logits(params, prompt)
    allowed = [t for t in ALLOWED if t != int(np.argmax(logits))]
    best = sorted(allowed, key=lambda t: -logits[t])
    assert logits[best[0]] - logits[best[1]] > 1e-3
    d = Driver(spec_programs, params, seed=3)
    d.initialize(0)
    host = dict(slot=0, tokens=prompt, page_table=d.pages[0], prompt_ends=True)
    out = d.run(PREFILLS[0], token_masks={0: words_of(allowed, V)}, **host)
    assert int(out.counts[0]) == 1 and int(out.tokens[0]) == best[0]
