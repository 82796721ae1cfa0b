"""The per-frame token masks the engine computes on the host (``programs/token_mask.py``).

A lane whose next sample is restricted gets i32 words in xgrammar's layout (token v allowed when
bit v % 32 of word v // 32 is set), keyed by its index in the plan's dense lane list:

- a structured-output request: its grammar matcher's next-token bitmask (`RequestGrammar`),
  computed from every committed token (such requests need completion feedback, so no round of
  theirs is in flight while the next is packed);
- a request with multi-token bad words: every token but those that would complete a bad word
  after its output so far (``bad_words.py``), and-ed with its grammar's mask when it has both.

Only lanes that sample get one: decode lanes, and prompt lanes (a prompt-ending chunk samples the
first output token). Lanes with nothing restricted are absent (unmasked).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from helios_jax.runtime.bad_words import ban_mask, banned_next
from helios_jax.scheduler.view import LaneRole

SAMPLING_ROLES = (LaneRole.DECODE, LaneRole.PROMPT)


def request_mask(active, vocab_size: int) -> np.ndarray | None:
    """i32 words restricting the next sample of one engine request record (its ``grammar``,
    ``request.sampling.bad_word_sequences`` and ``output``), or None when nothing is restricted."""
    grammar = active.grammar
    mask = None if grammar is None else grammar.next_token_mask()
    banned = banned_next(active.request.sampling.bad_word_sequences, active.output)
    if banned:
        ban = ban_mask(banned, vocab_size)
        mask = ban if mask is None else mask & ban
    return mask


def frame_token_masks(plan, actives: Mapping[int, object], vocab_size: int) -> dict[int, np.ndarray]:
    """lane index -> i32 words for the plan's restricted lanes (`actives`: rid -> the engine's
    request record)."""
    masks = {}
    for i, lane in enumerate(plan.lanes):
        active = actives.get(lane.handle.rid)
        if lane.role in SAMPLING_ROLES and active is not None:
            mask = request_mask(active, vocab_size)
            if mask is not None:
                masks[i] = mask
    return masks
