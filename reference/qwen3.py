"""A deliberately naive numpy Qwen3 forward: float64, explicit loops, transformers' tensor names.

An oracle, not an implementation: every attention score is a Python loop over heads and keys,
nothing is batched or cached, and weights are read by their Hugging Face names straight from
a `{name: ndarray}` dictionary (torch Linear layout [out, in]), so a mistake in the package's
flax name mapping or layout cannot hide here. Used by `reference/mtp.py` and the model tests.
"""

from __future__ import annotations

import math

import numpy as np

Weights = dict  # str -> np.ndarray, transformers' names


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., n] scaled to unit root-mean-square, then by `weight`."""
    x = np.asarray(x, np.float64)
    return weight.astype(np.float64) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """torch Linear without bias: x @ weight.T."""
    return np.asarray(x, np.float64) @ weight.astype(np.float64).T


def rotate(x: np.ndarray, position: int, theta: float) -> np.ndarray:
    """Rotary embedding of one head vector x [d] at `position`, rotate_half convention:
    pair (x[i], x[i + d/2]) is rotated by angle position * theta ** (-2i/d)."""
    d = x.shape[-1]
    out = np.empty_like(x, dtype=np.float64)
    for i in range(d // 2):
        angle = position * theta ** (-(2 * i) / d)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + d // 2]
        out[i] = a * c - b * s
        out[i + d // 2] = b * c + a * s
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Causal grouped-query attention, one query at a time.

    Args:
      q: [n, heads, d]; k, v: [n, kv_heads, d]. Query i sees keys 0..i; query head h reads
        kv head h // (heads // kv_heads).
    """
    n, heads, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros((n, heads, d))
    for i in range(n):
        for h in range(heads):
            g = h // group
            scores = np.array([scale * float(q[i, h] @ k[j, g]) for j in range(i + 1)])
            p = np.exp(scores - scores.max())
            p /= p.sum()
            for j in range(i + 1):
                out[i, h] += p[j] * v[j, g]
    return out


def decoder_block(weights: Weights, prefix: str, x: np.ndarray, positions, config) -> np.ndarray:
    """One Qwen3 block (`prefix` like "model.layers.0.") over a whole sequence x [n, H]."""
    w = lambda name: weights[prefix + name]  # noqa: E731
    n = x.shape[0]
    eps, d = config.rms_norm_eps, config.head_dim
    h = rms_norm(x, w("input_layernorm.weight"), eps)
    q = linear(h, w("self_attn.q_proj.weight")).reshape(n, config.num_heads, d)
    k = linear(h, w("self_attn.k_proj.weight")).reshape(n, config.num_kv_heads, d)
    v = linear(h, w("self_attn.v_proj.weight")).reshape(n, config.num_kv_heads, d)
    q = rms_norm(q, w("self_attn.q_norm.weight"), eps)
    k = rms_norm(k, w("self_attn.k_norm.weight"), eps)
    for i in range(n):
        for hd in range(q.shape[1]):
            q[i, hd] = rotate(q[i, hd], positions[i], config.rope_theta)
        for hd in range(k.shape[1]):
            k[i, hd] = rotate(k[i, hd], positions[i], config.rope_theta)
    a = attention(q, k, v, d**-0.5).reshape(n, config.num_heads * d)
    x = x + linear(a, w("self_attn.o_proj.weight"))
    h = rms_norm(x, w("post_attention_layernorm.weight"), eps)
    gate = linear(h, w("mlp.gate_proj.weight"))
    up = linear(h, w("mlp.up_proj.weight"))
    silu = gate / (1.0 + np.exp(-gate))
    return x + linear(silu * up, w("mlp.down_proj.weight"))


def output_logits(weights: Weights, config, hidden: np.ndarray) -> np.ndarray:
    """Logits [n, V] of final-normed hidden states (tied embeddings reuse embed_tokens)."""
    name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    return linear(hidden, weights[name])


def qwen3_forward(weights: Weights, config, tokens) -> tuple[np.ndarray, np.ndarray]:
    """Full causal forward of one sequence at positions 0..n-1.

    Returns:
      (final-normed hidden [n, H], logits [n, V]), float64.
    """
    tokens = [int(t) for t in tokens]
    x = np.stack([weights["model.embed_tokens.weight"][t].astype(np.float64) for t in tokens])
    positions = list(range(len(tokens)))
    for layer in range(config.num_layers):
        x = decoder_block(weights, f"model.layers.{layer}.", x, positions, config)
    hidden = rms_norm(x, weights["model.norm.weight"], config.rms_norm_eps)
    return hidden, output_logits(weights, config, hidden)
