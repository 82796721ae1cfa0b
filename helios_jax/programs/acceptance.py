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

Coupled lanes (seeded requests, RESOLUTIONS.md 30) replace this rule by the drafter-invariant
coupling of Daliri et al. 2024: target row j's token is the Gumbel-max draw from p_j with noise
keyed by (seed, its absolute position), the draft used the same noise at the same position, and
d_j is accepted exactly when it equals that token (`accept_coupled`). Every emitted token is then
the target's keyed draw at its position, whatever the proposals were; the acceptance rate is
lower than rejection sampling's 1 - TV(p, q) (at least (1 - TV) / (1 + TV)).

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

from helios_jax.programs.sampling import (
    first_argmax,
    greedy_only,
    gumbel_max,
    per_row_choice,
    position_noise,
    sample_inverse_cdf,
    sampling_probs,
)


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
    evaluated = _evaluated(lengths, w)
    p_at = jnp.take_along_axis(target_probs[:, : w - 1], proposals[..., None], axis=-1)[..., 0]
    ratio = _ratio(p_at, draft_probs, proposals)
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
    return _result(proposals, accepted, last, evaluated, ratio)


def accept_greedy(
    target_tokens: jax.Array,  # i32[B, W] the target argmax at each row
    draft_probs: jax.Array,  # f32[B, W-1, V]
    proposals: jax.Array,  # i32[B, W-1]
    lengths: jax.Array,  # i32[B]
) -> Acceptance:
    """`accept_proposals` when every p_j is the one-hot of target_tokens[:, j], without p.

    Then p_j(d_j) is 0 or 1, so the ratio is 0 or 1 (q_j(d_j) <= 1) and u < ratio does not depend
    on u: accept while d_j is the target argmax. Whether the lane stops on a rejection (residual
    max(0, p_a - q_a) is a scaled one-hot of the argmax, or empty and replaced by p_a) or accepts
    everything, the last token is the inverse-CDF draw from a one-hot at the argmax: the argmax.
    """
    w = target_tokens.shape[1]
    evaluated = _evaluated(lengths, w)
    p_at = (proposals == target_tokens[:, : w - 1]).astype(jnp.float32)
    ratio = _ratio(p_at, draft_probs, proposals)
    accepts = evaluated & (ratio >= 1.0)  # u in [0, 1): u < 1 always, u < 0 never
    accepted = jnp.sum(jnp.cumprod(accepts.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    last = jnp.take_along_axis(target_tokens, accepted[:, None], axis=1)[:, 0]
    return _result(proposals, accepted, last.astype(jnp.int32), evaluated, ratio)


def accept_coupled(
    target_probs: jax.Array,  # f32[B, W, V] p_j
    noise: jax.Array,  # f32[B, W, V] Gumbel noise keyed by (seed, position of row j's token)
    draft_probs: jax.Array,  # f32[B, W-1, V]
    proposals: jax.Array,  # i32[B, W-1] drawn from q_j with the same noise (or supplied)
    lengths: jax.Array,  # i32[B]
) -> Acceptance:
    """The coupled rule: row j's token is `gumbel_max(p_j, noise_j)`; accept d_j while it equals
    that token; the last emitted token is the keyed draw at the first mismatch (or the bonus).
    That is `accept_greedy` on the keyed tokens. Survival is the realised match indicator's
    cumulative product (min(1, p/q) does not describe this rule's acceptance)."""
    return accept_greedy(gumbel_max(target_probs, noise), draft_probs, proposals, lengths)


def sample_and_accept(
    logits: jax.Array,  # f32[B, W, V] target logits at each lane's W rows
    temperature: jax.Array,  # f32[B, W]
    top_k: jax.Array,  # i32[B, W]
    top_p: jax.Array,  # f32[B, W]
    draft_probs: jax.Array,
    proposals: jax.Array,
    lengths: jax.Array,
    accept_key: jax.Array,  # typed keys [B]: test j uses fold_in(key, j)
    sample_key: jax.Array,  # typed keys [B]: the replacement/bonus draw
    live: jax.Array | None = None,  # bool[B] lanes whose results are used (None: all)
    coupled: jax.Array | None = None,  # bool[B] lanes under the coupled rule (None: none)
    noise_key: jax.Array | None = None,  # typed keys [B]: the seed's key of a coupled lane
    positions: jax.Array | None = None,  # i32[B, W] absolute position of row j's token
    min_p: jax.Array | None = None,  # f32[B, W] (None: off)
) -> Acceptance:
    """The target distributions (`sampling_probs`), their uniforms and `accept_proposals` (for
    `coupled` lanes: the keyed noise and `accept_coupled`); or, when every live lane is greedy,
    `accept_greedy` on the argmax alone (no softmax, no sorts, no cumulative sums, no uniforms).
    Live lanes get the same bits either way."""
    b, w, v = logits.shape

    def greedy(logits):
        return accept_greedy(first_argmax(logits), draft_probs, proposals, lengths)

    def full(logits):
        p = sampling_probs(logits, temperature, top_k, top_p, min_p)

        def rejection():
            accept_u = jax.vmap(
                lambda k: jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(k, j)))(jnp.arange(w - 1))
            )(accept_key).reshape(b, w - 1)
            sample_u = jax.vmap(jax.random.uniform)(sample_key)
            return accept_proposals(p, draft_probs, proposals, lengths, accept_u, sample_u)

        if coupled is None:
            return rejection()

        def keyed():
            keys = jnp.broadcast_to(noise_key[:, None], (b, w))
            noise = position_noise(keys, positions, v)
            return accept_coupled(p, noise, draft_probs, proposals, lengths)

        return per_row_choice(coupled, rejection, keyed, live)

    return jax.lax.cond(greedy_only(temperature, live), greedy, full, logits.astype(jnp.float32))


def _evaluated(lengths: jax.Array, w: int) -> jax.Array:
    """bool[B, W-1]: proposal j is checked (j < L_b - 1)."""
    return jnp.arange(w - 1)[None, :] < (lengths[:, None] - 1)


def _ratio(p_at: jax.Array, draft_probs: jax.Array, proposals: jax.Array) -> jax.Array:
    """f32[B, W-1] min(1, p_j(d_j) / q_j(d_j))."""
    q_at = jnp.take_along_axis(draft_probs, proposals[..., None], axis=-1)[..., 0]
    # q(d) > 0 for any drawn proposal; guard the division for impossible inputs anyway.
    return jnp.where(
        q_at > 0, jnp.minimum(1.0, p_at / jnp.where(q_at > 0, q_at, 1.0)), (p_at > 0).astype(jnp.float32)
    )


def _result(proposals, accepted, last, evaluated, ratio) -> Acceptance:
    """The emitted tokens d_0..d_{a-1}, last; counts; survival products."""
    b, w = proposals.shape[0], proposals.shape[1] + 1
    column = jnp.arange(w)[None, :]
    props = jnp.concatenate([proposals, jnp.zeros((b, 1), proposals.dtype)], axis=1)
    tokens = jnp.where(column < accepted[:, None], props, 0)
    tokens = jnp.where(column == accepted[:, None], last[:, None], tokens).astype(jnp.int32)
    survival = jnp.where(evaluated, jnp.cumprod(jnp.where(evaluated, ratio, 1.0), axis=1), 0.0)
    return Acceptance(tokens=tokens, counts=accepted + 1, accepted=accepted, survival=survival)
