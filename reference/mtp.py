"""A deliberately naive numpy forward of the MTP draft head, and of its sequential proposals.

The head (DeepSeek-V3 / Qwen3-Next style), by transformers-style tensor names:

    u_i  = mtp.fc( concat( rms(embed(x_{i+1}); mtp.pre_fc_norm_embedding),
                           rms(h_i;            mtp.pre_fc_norm_hidden) ) )
    u    = mtp.layers.0 .. mtp.layers.{L-1}   (Qwen3 blocks, causal over i = 0..n-1, rope at i)
    g_i  = rms(u_i; model.norm)               the shared final norm
    logits_i = output projection(g_i)         the shared lm_head (or tied embeddings)

h_i is the target's final-normed hidden state at position i, x_{i+1} the token after it, and
logits_i draft the token at i + 2. Nothing is cached: `naive_proposals` recomputes the whole
draft sequence for every proposal, which is exactly what the package's paged, scanned
`helios_jax.model.mtp.propose` must reproduce.
"""
from __future__ import annotations

import numpy as np

from helios_jax.reference.qwen3 import Weights, decoder_block, linear, output_logits, rms_norm


def mtp_forward(weights: Weights, config, hidden, next_tokens) -> tuple[np.ndarray, np.ndarray]:
    """The draft head over pairs (hidden[i], next_tokens[i]) at positions i = 0..n-1.

    Args:
      weights: {name: ndarray} including `mtp.*`, `model.embed_tokens.weight`,
        `model.norm.weight` and the output projection.
      config: a ModelConfig (sizes and constants only).
      hidden: [n, H] target final-normed hidden states.
      next_tokens: [n] the token following each position.
    Returns:
      (draft hidden [n, H], logits [n, V]), float64.
    """
    eps = config.rms_norm_eps
    hidden = np.asarray(hidden, np.float64)
    rows = []
    for i, token in enumerate(next_tokens):
        e = rms_norm(weights["model.embed_tokens.weight"][int(token)], weights["mtp.pre_fc_norm_embedding.weight"], eps)
        h = rms_norm(hidden[i], weights["mtp.pre_fc_norm_hidden.weight"], eps)
        rows.append(linear(np.concatenate([e, h])[None, :], weights["mtp.fc.weight"])[0])
    x = np.stack(rows)
    positions = list(range(len(rows)))
    for layer in range(config.mtp_num_layers):
        x = decoder_block(weights, f"mtp.layers.{layer}.", x, positions, config)
    draft = rms_norm(x, weights["model.norm.weight"], eps)
    return draft, output_logits(weights, config, draft)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def naive_proposals(
    weights: Weights, config, hidden, next_tokens, depth: int, choose=None, temperature: float = 1.0
):
    """`depth` sequential proposals after the draft context (hidden[i], next_tokens[i]), i <= p.

    Step k appends the previous step's (draft hidden, proposal) pair at position p + k + 1 and
    recomputes the whole draft sequence from scratch.

    Args:
      hidden, next_tokens: the whole context, [p + 1, H] and [p + 1].
      depth: number of proposals D.
      choose: (step, probabilities) -> token; greedy argmax when None.
      temperature: draft distributions are softmax(logits / temperature).
    Returns:
      (tokens [D], probability of each token under its draft distribution [D]).
    """
    hidden = list(np.asarray(hidden, np.float64))
    tokens = [int(t) for t in next_tokens]
    proposals, probs = [], []
    for k in range(depth):
        draft, logits = mtp_forward(weights, config, np.stack(hidden), tokens)
        p = softmax(logits[-1] / temperature)
        token = int(np.argmax(p)) if choose is None else int(choose(k, p))
        proposals.append(token)
        probs.append(float(p[token]))
        hidden.append(draft[-1])
        tokens.append(token)
    return np.array(proposals), np.array(probs)
