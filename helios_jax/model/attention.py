"""The two `attend` strategies the decoder modules call (see `qwen3.py`).

- `causal_attend`: dense causal attention over one whole sequence, no cache. The verification
  forward (`forward_full`) uses it; it is the model's ground truth on every path.
- `paged_attend(...)`: writes this call's K/V into the paged cache, then runs the ragged paged
  attention kernel (`helios_jax.kernels.ragged_paged_attention`) over the pages.

The kernel contract (owned by kernels/ragged_paged_attention.py):

    ragged_paged_attention(q, k_pages, v_pages, page_tables, context_lens, query_starts,
                           query_lens, *, sm_scale, layer, impl="auto", interpret=False)
      q        [T, num_q_heads, head_dim]
      k_pages  [num_layers, num_kv_heads, total_pages, page_size, head_dim] (and v_pages):
               the whole stacked cache; the kernel reads layer `layer` (a Python int here; the
               kernel treats it as a runtime value, so all layers share one compiled kernel)
      returns  [T, num_q_heads, head_dim], zeros where no row covers the token.

Any callable with that signature can stand in for it (`attention=` on the packed forwards).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from helios_jax.model.cache import PagedKVCache, write_kv
from helios_jax.model.qwen3 import matmul_precision

AttentionKernel = Callable[..., jax.Array]


def default_attention_kernel() -> AttentionKernel:
    """The project's ragged paged attention kernel, imported on first use."""
    from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention

    return ragged_paged_attention


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, sm_scale: float) -> jax.Array:
    """Dense causal grouped-query attention.

    Args:
      q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim]. Token i attends to j <= i.
    Returns:
      [T, num_heads, head_dim] in q's dtype. Scores and softmax are float32; probabilities are
      cast back to v's dtype before the value product, as transformers' eager attention does.
    """
    t, heads, dim = q.shape
    kv_heads = k.shape[1]
    precision = matmul_precision(q.dtype)
    # Query head h reads kv head h // (heads // kv_heads) (transformers' repeat_kv).
    qg = q.reshape(t, kv_heads, heads // kv_heads, dim)
    scores = (
        jnp.einsum("tgrd,sgd->grts", qg, k, precision=precision, preferred_element_type=jnp.float32)
        * sm_scale
    )
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("grts,sgd->tgrd", probs, v, precision=precision)
    return out.reshape(t, heads, dim)


def causal_attend(layer, q, k, v, kv_state, *, sm_scale: float):
    """`attend` for the full-sequence forward: no cache, `kv_state` passes through."""
    del layer
    return causal_attention(q, k, v, sm_scale=sm_scale), kv_state


def paged_attend(
    *,
    pages: jax.Array,
    slots: jax.Array,
    page_tables: jax.Array,
    context_lens: jax.Array,
    query_starts: jax.Array,
    query_lens: jax.Array,
    sm_scale: float,
    kernel: AttentionKernel,
):
    """Builds the `attend` of the packed forward.

    Args:
      pages, slots: i32[T] write location of each packed token (`cache_write_locations`).
      page_tables, context_lens, query_starts, query_lens: the row metadata, handed to the
        kernel unchanged.
      sm_scale: softmax scale (head_dim ** -0.5).
      kernel: the ragged paged attention callable.
    """

    def attend(layer: int, q, k, v, cache: PagedKVCache):
        # Write first: the kernel's context_lens count this call's tokens as context.
        cache = write_kv(cache, layer, pages, slots, k, v)
        # The whole stacked cache and the layer: slicing cache.k[layer] here would copy a
        # layer's entire cache at every call on the CPU.
        out = kernel(
            q,
            cache.k,
            cache.v,
            page_tables,
            context_lens,
            query_starts,
            query_lens,
            sm_scale=sm_scale,
            layer=layer,
        )
        return out, cache

    return attend


def full_sequence_attend(sm_scale: float):
    return functools.partial(causal_attend, sm_scale=sm_scale)
