"""Multi-token bad words (vLLM's ``bad_words`` whose word is several tokens), banned on the host.

vLLM's rule, per banned token sequence ``w`` of length L >= 2: when the output so far ends with
``w[:-1]``, the next token may not be ``w[-1]``. (Single-token words are banned at every step by
the programs' own logit bias.) The engine turns the rule into the frame's token mask
(``token_masks.py``): all tokens allowed but the banned last tokens, so a request with
multi-token bad words samples one target row per round with completion feedback, like a grammar
request (its next mask depends on every committed token).

Worked example: words [[5, 6, 7], [5, 9]]; output ... 4, 5 -> token 9 is banned (the word
[5, 9] would complete) but 7 is not (the output does not end with 5, 6); output ... 5, 6 -> 7 is
banned.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def banned_next(sequences: Sequence[Sequence[int]], output: Sequence[int]) -> set[int]:
    """The tokens that would complete one of `sequences` after `output` (vLLM's rule: the prefix
    is matched against the output tokens only, never the prompt)."""
    banned = set()
    for seq in sequences:
        prefix = len(seq) - 1
        if prefix <= len(output) and list(output[len(output) - prefix :]) == list(seq[:prefix]):
            banned.add(int(seq[-1]))
    return banned


def ban_mask(banned: set[int], vocab_size: int) -> np.ndarray:
    """i32[ceil(V/32)]: every token allowed but `banned` (xgrammar's bitmask layout)."""
    bits = np.ones(((vocab_size + 31) // 32) * 32, np.uint8)
    bits[vocab_size:] = 0
    bits[np.fromiter(banned, np.int64, len(banned))] = 0
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
