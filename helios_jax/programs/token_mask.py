"""The per-frame token mask: which tokens a lane's sample may take (grammar-constrained output).

Layout (xgrammar's, so `xgrammar.allocate_token_bitmask` / `fill_next_token_bitmask` output is
passed as is): a lane's mask is `ceil(V / 32)` int32 words; token v is allowed when bit v % 32 of
word v // 32 is set. Bits past V in the last word are ignored. Worked example, V = 40 (2 words):
allowing tokens 0, 5 and 33 is words [0b100001, 0b10] = [33, 2]; allowing token 31 alone sets
the sign bit of word 0: [-2147483648, 0] (uint32 words are accepted and viewed as int32).

Host side (`pack_token_masks`, numpy): the engine passes an optional mapping lane -> int32 words
(lane = index into the frame's dense lane list; an absent lane or None is unmasked). Programs
take `token_mask: i32[B, ceil(V/32)]` (zeros for unmasked lanes) and `masked: bool[B]`.

Device side (`apply_token_mask`): masked lanes' disallowed logits become -inf at every target
sample row of the lane, before the sampling processors and the draw, so greedy takes the best
allowed token and sampled rows renormalise over the allowed ones. A masked lane verifies one
target row only (no proposals: a grammar state advances token by token on the host), which
packing enforces. The whole step is one `lax.cond`, skipped when no live lane is masked.
Reported log-probabilities stay those of the raw model distribution (`scores.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

TokenMasks = Mapping[int, np.ndarray | None]  # lane -> int32 words i32[ceil(V/32)] (None: unmasked)


def mask_words(vocab: int) -> int:
    """Words per lane of a V-token mask."""
    return (vocab + 31) // 32


def pack_token_masks(
    lanes: int, words: int, vocab: int, masks: TokenMasks | None, used: int
) -> tuple[np.ndarray, np.ndarray]:
    """(i32[lanes, words] token_mask, bool[lanes] masked) from the engine's mapping.

    Raises ValueError naming the lane for a lane outside 0..used-1, a mask of another length or
    dtype, or one that allows no token of the vocabulary.
    """
    token_mask = np.zeros((lanes, words), np.int32)
    masked = np.zeros((lanes,), bool)
    for lane, mask in (masks or {}).items():
        if mask is None:
            continue
        if not 0 <= int(lane) < used:
            raise ValueError(f"token mask for lane {lane} outside the dense lane list 0..{used - 1}")
        array = np.asarray(mask)
        if array.dtype == np.uint32:
            array = array.view(np.int32)
        if array.dtype != np.int32 or array.shape != (words,):
            raise ValueError(
                f"lane {lane}: token mask must be int32 words of shape ({words},), "
                f"got {array.dtype} {array.shape}"
            )
        if not allowed_tokens(array, vocab).size:
            raise ValueError(f"lane {lane}: token mask allows no token")
        token_mask[int(lane)] = array
        masked[int(lane)] = True
    return token_mask, masked


def allowed_tokens(words: np.ndarray, vocab: int) -> np.ndarray:
    """i64[n] the tokens one lane's int32 words allow (host side, ascending)."""
    bits = np.unpackbits(np.ascontiguousarray(words, "<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab])


def words_of(tokens, vocab: int) -> np.ndarray:
    """i32[ceil(V/32)] the words allowing exactly `tokens` (the inverse of `allowed_tokens`)."""
    bits = np.zeros((mask_words(vocab) * 32,), np.uint8)
    bits[np.asarray(list(tokens), np.int64)] = 1
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


def unpack_token_mask(words: jax.Array, vocab: int) -> jax.Array:
    """bool[..., V] from i32[..., ceil(V/32)] words: bit v % 32 of word v // 32."""
    v = jnp.arange(vocab, dtype=jnp.int32)
    return (jnp.right_shift(words[..., v // 32], v % 32) & 1).astype(bool)


def apply_token_mask(
    logits: jax.Array,  # f32[B, W, V] a lane's target sample rows
    token_mask: jax.Array,  # i32[B, ceil(V/32)]
    masked: jax.Array,  # bool[B]
    live: jax.Array,  # bool[B] lanes whose results are used
) -> jax.Array:
    """f32[B, W, V]: -inf at the tokens a masked lane's mask disallows; the logits unchanged (no
    unpacking at all) when no live lane is masked."""

    def restrict(logits):
        allowed = unpack_token_mask(token_mask, logits.shape[-1])  # bool[B, V]
        keep = allowed[:, None, :] | ~masked[:, None, None]
        return jnp.where(keep, logits, -jnp.inf)

    return jax.lax.cond(jnp.any(masked & live), restrict, lambda logits: logits, logits)
