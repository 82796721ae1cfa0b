"""Speculative acceptance: greedy and rejection sampling in one vectorised rule.

Lane b verified L_b target rows: its pending token and proposals d_0..d_{L_b-2}. Target row j
gives p_j, the distribution of the token after row j's token, so proposal d_j (drafted from the
proposal distribution q_j) is checked against p_j:

  accept d_j   with probability min(1, p_j(d_j) / q_j(d_j))        (u_j < ratio_j)
  the first rejection at j = a stops the lane: emit d_0..d_{a-1}, then a replacement drawn
               from normalize(max(0, p_a - q_a))
  all L_b - 1 accepted (a = L_b - 1): emit them, then a bonus token drawn from p_a

so a lane always emits a + 1 tokens, 1..L_b, and the emitted sequence is distributed exactly as
sampling from p token by token (Leviathan et al. 2023; Chen et al. 2023). Greedy rows use one-hot
p and q (`sampling.sampling_probs`), where the rule reduces to "accept while the proposal is the
target argmax, then emit the argmax". Copy proposals are point masses q = one-hot(d).

`completion_speculative_survival` of a lane: the cumulative products of min(1, p_j(d_j)/q_j(d_j))
over its evaluated proposals j < L_b - 1 (0 beyond), an estimate of each prefix's survival that
replaces binary acceptance observations on the host.

Worked example, one lane, L = 3, V = 3:
  q_0 = [0.5, 0.5, 0], d_0 = 1, p_0 = [0.2, 0.3, 0.5]: ratio 0.6; u_0 = 0.4 < 0.6: accept
  q_1 = [0.1, 0.1, 0.8], d_1 = 2, p_1 = [0.6, 0.2, 0.2]: ratio 0.25; u_1 = 0.9: reject (a = 1)
  residual max(0, p_1 - q_1) = [0.5, 0.1, 0] -> [5/6, 1/6, 0]; emit [1, x], count 2
  survival = [0.6, 0.15]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.programs.sampling import sample_inverse_cdf


@struct.dataclass
class Acceptance:
    tokens: jax.Array  # i32[B, W] emitted tokens; entries >= counts[b] are 0
    counts: jax.Array  # i32[B] emitted tokens, accepted + 1 (>= 1 for every lane)
    accepted: jax.Array  # i32[B] accepted proposals a
    survival: jax.Array  # f32[B, W-1] cumulative min(1, p/q) over evaluated proposals, 0 beyond


def accept_proposals(
    target_probs: jax.Array,  # f32[B, W, V] p_j for target rows j = 0..W-1
    draft_probs: jax.Array,  # f32[B, W-1, V] q_j, the distribution proposal j was drawn from
    proposals: jax.Array,  # i32[B, W-1]
    lengths: jax.Array,  # i32[B] verified rows L_b in 1..W (1: just sample from p_0)
    accept_uniforms: jax.Array,  # f32[B, W-1] u_j in [0, 1)
    sample_uniforms: jax.Array,  # f32[B] the replacement/bonus draw
) -> Acceptance:
    """Vectorised acceptance over a batch of lanes (module docstring)."""
    b, w, _ = target_probs.shape
    evaluated = jnp.arange(w - 1)[None, :] < (lengths[:, None] - 1)  # bool[B, W-1]
    p_at = jnp.take_along_axis(target_probs[:, : w - 1], proposals[..., None], axis=-1)[..., 0]
    q_at = jnp.take_along_axis(draft_probs, proposals[..., None], axis=-1)[..., 0]
    # q(d) > 0 for any drawn proposal; guard the division for impossible inputs anyway.
    ratio = jnp.where(
        q_at > 0, jnp.minimum(1.0, p_at / jnp.where(q_at > 0, q_at, 1.0)), (p_at > 0).astype(jnp.float32)
    )
    accepts = evaluated & (accept_uniforms < ratio)
    accepted = jnp.sum(jnp.cumprod(accepts.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    rejected = accepted < lengths - 1
    p_a = jnp.take_along_axis(target_probs, accepted[:, None, None], axis=1)[:, 0]  # [B, V]
    q_pad = jnp.concatenate([draft_probs, jnp.zeros_like(target_probs[:, :1])], axis=1)
    q_a = jnp.take_along_axis(q_pad, accepted[:, None, None], axis=1)[:, 0]
    residual = jnp.maximum(p_a - q_a, 0.0)
    # p == q exactly leaves no residual mass (then rejection had probability 0): fall back to p.
    has_mass = jnp.sum(residual, axis=-1, keepdims=True) > 0
    final = jnp.where(rejected[:, None] & has_mass, residual, p_a)
    last = sample_inverse_cdf(final, sample_uniforms)
    column = jnp.arange(w)[None, :]
    props = jnp.concatenate([proposals, jnp.zeros((b, 1), proposals.dtype)], axis=1)
    tokens = jnp.where(column < accepted[:, None], props, 0)
    tokens = jnp.where(column == accepted[:, None], last[:, None], tokens).astype(jnp.int32)
    survival = jnp.where(evaluated, jnp.cumprod(jnp.where(evaluated, ratio, 1.0), axis=1), 0.0)
    return Acceptance(tokens=tokens, counts=accepted + 1, accepted=accepted, survival=survival)
