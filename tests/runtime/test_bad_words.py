"""Multi-token bad words and the frame's token masks on the host (runtime/bad_words.py,
runtime/token_masks.py): vLLM's rule worked on paper, and the masks a plan's lanes get."""

import json
import types

import numpy as np

from helios_jax.runtime.bad_words import ban_mask, banned_next
from helios_jax.runtime.grammar import Grammars, GrammarSpec, allowed_tokens
from helios_jax.runtime.token_masks import frame_token_masks
from helios_jax.scheduler.view import LaneRole

from .helpers import tokenizer

WORDS = ((5, 6, 7), (5, 9))


def test_the_last_token_is_banned_when_the_output_ends_with_the_rest():
    assert banned_next(WORDS, [4, 5]) == {9}  # [5, 9] would complete; [5, 6, 7] would not
    assert banned_next(WORDS, [5, 6]) == {7}
    assert banned_next(WORDS, [6]) == set()
    assert banned_next(WORDS, []) == set()  # the prompt never counts (vLLM matches the output)
    assert banned_next(((3,), (8, 8)), [8]) == {3, 8}  # a one-token word: banned at every step


def test_the_ban_mask_allows_everything_else_in_xgrammars_layout():
    mask = ban_mask({0, 31, 33}, 40)
    assert mask.dtype == np.int32 and mask.shape == (2,)
    assert mask[0] == np.int32(0x7FFFFFFE)  # tokens 1..30 (token 31 is the sign bit)
    assert mask[1] == 0b11111101  # tokens 32 and 34..39; nothing past the vocabulary
    assert set(np.flatnonzero(~allowed_tokens(mask, 40))) == {0, 31, 33}


def _lane(rid, role):
    return types.SimpleNamespace(handle=types.SimpleNamespace(rid=rid), role=role)


def test_frame_masks_join_grammar_and_bad_words_on_sampling_lanes_only():
    tok = tokenizer()
    vocab = tok.vocab_size
    grammar = Grammars(tok, vocab, tok.eos_token_ids).compile(GrammarSpec("choice", json.dumps(["ab", "ac"])))

    def active(words, output, with_grammar):
        request = types.SimpleNamespace(sampling=types.SimpleNamespace(bad_word_sequences=words))
        matcher = grammar.start() if with_grammar else None
        if matcher is not None:
            matcher.accept(output)
        return types.SimpleNamespace(request=request, output=list(output), grammar=matcher)

    a, b, c = tok.encode("a")[0], tok.encode("b")[0], tok.encode("c")[0]
    actives = {
        1: active(((a, b),), [a], True),  # the grammar allows b and c after a; the word bans b
        2: active(((a, b),), [a], False),  # bad words alone
        3: active((), [], False),  # unrestricted: no mask
        4: active(((a, b),), [a], False),  # a prerequisite lane samples nothing
    }
    plan = types.SimpleNamespace(
        lanes=[_lane(1, LaneRole.DECODE), _lane(2, LaneRole.DECODE), _lane(3, LaneRole.DECODE)]
        + [_lane(4, LaneRole.PREREQUISITE)]
    )
    masks = frame_token_masks(plan, actives, vocab)
    assert sorted(masks) == [0, 1]
    assert set(np.flatnonzero(allowed_tokens(masks[0], vocab))) == {c}
    assert set(np.flatnonzero(~allowed_tokens(masks[1], vocab))) == {b}
