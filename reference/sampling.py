"""Deliberately naive numpy oracles for sampling and speculative acceptance (float64, loops).

- `processed_logits_naive(logits, ...)`: one row's logits after vLLM's logits processors, token
  by token in Python: allowed_token_ids and bad words (-inf), min_tokens (stop tokens -inf while
  fewer outputs exist), logit_bias, then the repetition (prompt or output tokens: logit / rp if
  positive else logit * rp), frequency (- f * count) and presence (- p if counted) penalties.
- `sampling_probs_naive(logits, temperature, top_k, top_p, min_p)`: one row's sampling
  distribution, built with Python sorting: greedy one-hot for temperature 0; else tempered
  softmax, min-p (keep probabilities >= min_p * the largest), top-k
  (keep probabilities >= the k-th largest), top-p (keep the most probable tokens up to and
  including the one whose cumulative mass reaches top_p; ties at the threshold kept), renormalised.
- `draw_inverse_cdf(probs, u)`: the first token whose cumulative mass exceeds u * total.
- `accept_naive(...)`: one lane of speculative acceptance, walked proposal by proposal:

      for j in 0 .. L-2:
          if u_j < min(1, p_j(d_j) / q_j(d_j)): emit d_j, continue
          emit a draw from normalize(max(0, p_j - q_j)); stop
      all accepted: emit a bonus draw from p_{L-1}

  It also returns the survival products prod_{i<=j} min(1, p_i(d_i) / q_i(d_i)).

Uniforms can be passed in (so the jax implementation can be compared draw for draw) or drawn from
a `numpy.random.Generator` (so the oracle stands alone in distribution tests).
"""

from __future__ import annotations

import numpy as np


def processed_logits_naive(
    logits,
    *,
    outputs=(),
    prompt=(),
    presence: float = 0.0,
    frequency: float = 0.0,
    repetition: float = 1.0,
    logit_bias=None,
    allowed=None,
    banned=(),
    stops=(),
    min_tokens: int = 0,
) -> np.ndarray:
    """One row's logits after the processors, given the output tokens generated before it."""
    out = [float(x) for x in logits]
    counts = {}
    for token in outputs:
        counts[int(token)] = counts.get(int(token), 0) + 1
    seen = set(int(t) for t in prompt) | set(counts)
    for v in range(len(out)):
        if (allowed is not None and v not in allowed) or v in banned:
            out[v] = -np.inf
        if len(outputs) < min_tokens and v in stops:
            out[v] = -np.inf
        out[v] += (logit_bias or {}).get(v, 0.0)
        if v in seen:
            out[v] = out[v] / repetition if out[v] > 0 else out[v] * repetition
        out[v] -= frequency * counts.get(v, 0)
        out[v] -= presence * (v in counts)
    return np.asarray(out, np.float64)


def sampling_probs_naive(
    logits, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    if temperature <= 0:
        out = np.zeros_like(logits)
        out[int(np.argmax(logits))] = 1.0
        return out
    z = logits / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if min_p > 0:
        probs = np.where(probs >= min_p * max(probs), probs, 0.0)
        probs /= probs.sum()
    if top_k > 0:
        kth = sorted(probs, reverse=True)[min(top_k, len(probs)) - 1]
        probs = np.where(probs >= kth, probs, 0.0)
        probs /= probs.sum()
    if top_p < 1.0:
        ordered = sorted(probs, reverse=True)
        mass, threshold = 0.0, ordered[0]
        for value in ordered:
            if mass >= top_p:
                break
            threshold = value
            mass += value
        probs = np.where(probs >= threshold, probs, 0.0)
        probs /= probs.sum()
    return probs


def draw_inverse_cdf(probs, u: float) -> int:
    probs = np.asarray(probs, np.float64)
    total = probs.sum()
    running = 0.0
    for token, value in enumerate(probs):
        running += value
        if running > u * total:
            return token
    return len(probs) - 1


def accept_naive(target_probs, draft_probs, proposals, length: int, *, uniforms=None, rng=None):
    """One lane's acceptance.

    Args:
      target_probs: [W, V] p_j per verified row.
      draft_probs: [W-1, V] q_j per proposal.
      proposals: [W-1] d_j.
      length: L, the rows verified (1..W): proposals 0..L-2 are evaluated.
      uniforms: optional [W] (u_0..u_{W-2} for acceptance, u_{W-1} for the final draw).
      rng: a numpy Generator used when `uniforms` is None.
    Returns:
      (emitted tokens list, survival list of length L-1).
    """
    p = np.asarray(target_probs, np.float64)
    q = np.asarray(draft_probs, np.float64)
    width = p.shape[0]
    if uniforms is None:
        uniforms = rng.random(width)
    emitted, survival, running = [], [], 1.0
    for j in range(length - 1):
        d = int(proposals[j])
        ratio = min(1.0, p[j, d] / q[j, d]) if q[j, d] > 0 else float(p[j, d] > 0)
        running *= ratio
        survival.append(running)
    for j in range(length - 1):
        d = int(proposals[j])
        ratio = min(1.0, p[j, d] / q[j, d]) if q[j, d] > 0 else float(p[j, d] > 0)
        if uniforms[j] < ratio:
            emitted.append(d)
            continue
        residual = np.maximum(p[j] - q[j], 0.0)
        final = residual if residual.sum() > 0 else p[j]
        emitted.append(draw_inverse_cdf(final, uniforms[width - 1]))
        return emitted, survival
    emitted.append(draw_inverse_cdf(p[length - 1], uniforms[width - 1]))
    return emitted, survival
