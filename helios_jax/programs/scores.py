"""Log-probabilities a generation program reports: generated tokens' (gated) and prompt tokens'.

Both are scores under the raw model distribution, log_softmax of the target logits at the row
that predicts the token (temperature 1, before top-k and top-p; docs/spec/RESOLUTIONS.md 26),
each with the TOP_LOGPROBS most probable alternatives.

Gate. A log-softmax over the vocabulary and a top-20 for every sampled row are not free, and
most requests never ask for them. Each state row carries a `logprobs` flag, set by `initialize`
from the request's settings like its temperature; `token_logprobs` computes the scores only when
some live lane's row has it (one `lax.cond`; the other branch returns NaN scores and token 0).
Whether computed or not, tokens and state are the same bits: the scores feed nothing else. Where
computed, every row is scored, so a lane's values do not depend on which other lanes asked.

Prompt scores (scored prefill only, which exists for requests that asked for them): packed
token t is predicted by the hidden state one position earlier, the carried h_{c-1} for the
chunk's first token, hidden[t - 1] otherwise; a request's very first token has no score.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from helios_jax.model import PackedBatch, compute_logits
from helios_jax.programs.inputs import TOP_LOGPROBS


def _scores(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log p(tokens) f32[...], top log p f32[..., N], top ids i32[..., N]) for logits f32[..., V]."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
    top, ids = jax.lax.top_k(log_probs, min(TOP_LOGPROBS, log_probs.shape[-1]))
    return picked, top, ids.astype(jnp.int32)


def token_logprobs(logits: jax.Array, tokens: jax.Array, wanted: jax.Array) -> dict:
    """Each output token's log-probability and the TOP_LOGPROBS most probable alternatives under
    the raw model distribution, when any lane in `wanted` asked; NaN scores and token 0 otherwise
    (module docstring, "Gate"). The same numbers on the greedy fast path and the sampled path,
    and for every program kind.

    Args:
      logits: f32[B, W, V] the target logits at each lane's sample rows.
      tokens: i32[B, W] the tokens emitted at those rows.
      wanted: bool[B] live lanes whose request asked for log-probabilities.
    Returns:
      RoundOutputs' logprobs f32[B, W], top_logprobs f32[B, W, N], top_tokens i32[B, W, N].
    """
    n = min(TOP_LOGPROBS, logits.shape[-1])

    def skipped(logits, tokens):
        b, w = tokens.shape
        nan = jnp.full((b, w), jnp.nan, jnp.float32)
        return nan, jnp.full((b, w, n), jnp.nan, jnp.float32), jnp.zeros((b, w, n), jnp.int32)

    picked, top, ids = jax.lax.cond(jnp.any(wanted), _scores, skipped, logits, tokens)
    return dict(logprobs=picked, top_logprobs=top, top_tokens=ids)


def prompt_logprobs(
    config,
    params,
    hidden: jax.Array,
    batch: PackedBatch,
    carried: jax.Array,
    lane: jax.Array,
    present: jax.Array,
    first: jax.Array,
) -> dict:
    """The prompt lane's packed tokens' scores.

    Args:
      hidden: [T, H] the packed target hidden states.
      batch: the packed batch (tokens, query starts and lengths).
      carried: [H] the prompt lane's carried h_{c-1}.
      lane: i32[] the prompt lane; present: bool[] there is one; first: bool[] its chunk starts
        the request (cursor 0).
    Returns:
      PrefillOutputs' prompt_logprobs f32[T] (log p(tokens[t] | prefix)), prompt_top_logprobs
      f32[T, N] and prompt_top_tokens i32[T, N]: NaN (token 0) outside the lane's chunk and for
      a request's first token.
    """
    t_cap = hidden.shape[0]
    start, length = batch.query_starts[lane], batch.query_lens[lane]
    previous = jnp.concatenate([carried[None].astype(hidden.dtype), hidden[:-1]], axis=0)
    t_index = jnp.arange(t_cap)
    predictor = jnp.where((t_index == start)[:, None], previous[0], previous)
    picked, top, ids = _scores(compute_logits(config, params, predictor), batch.tokens)
    inside = present & (t_index >= start) & (t_index < start + length)
    defined = inside & ~((t_index == start) & first)
    return dict(
        prompt_logprobs=jnp.where(defined, picked, jnp.nan),
        prompt_top_logprobs=jnp.where(defined[:, None], top, jnp.nan),
        prompt_top_tokens=jnp.where(defined[:, None], ids, 0),
    )
