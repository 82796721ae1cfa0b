"""Paged KV cache and the packed-batch description of one forward.

Layout. Each layer's keys and values live in fixed-size pages:

    k, v: [num_layers, num_kv_heads, total_pages, page_size, head_dim]

the per-layer slice `k[layer]` being exactly what the ragged paged attention kernel reads.
The host owns page allocation; a row (one request) reaches its pages through its page table
`i32[rows, pages_per_row]`: absolute position p of row r lives at

    page = page_tables[r, p // page_size],  slot = p % page_size.

Packed batch. A forward runs T packed tokens that belong to R rows:

    tokens     i32[T]  token ids; row r's new tokens are tokens[query_starts[r] : + query_lens[r]]
    positions  i32[T]  absolute position of each token (rotary embeddings and the cache slot)
    page_tables i32[R, pages_per_row]
    context_lens i32[R]  valid context of row r INCLUDING this call's new tokens
    query_starts i32[R]  exclusive prefix sums of query_lens
    query_lens   i32[R]  new tokens of row r; 0 marks an inactive row

Worked example: rows A (prefill chunk of 3 at positions 4..6), B (inactive), C (decode at 9),
T = 5 with one padding token at the end:

    query_lens   = [3, 0, 1]      query_starts = [0, 3, 3]      context_lens = [7, 0, 10]
    tokens       = [a4, a5, a6, c9, pad]
    positions    = [ 4,  5,  6,  9,   0]
    token row    = [ A,  A,  A,  C,  none]   -> the padding token writes nothing

Decode (one token per row), verification (several per row) and a prefill chunk are all this
one call. Tokens that no row covers are padding: their K/V writes are dropped (scatter with
mode="drop" on an out-of-range page index), so padding never mutates the cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.kernels.raw_bits import scatter_set, storage
from helios_jax.model.config import ModelConfig


@struct.dataclass
class PagedKVCache:
    """Keys and values of every layer, in pages."""

    k: jax.Array  # [num_layers, num_kv_heads, total_pages, page_size, head_dim]; float, or
    #               on a CPU a 16-bit float's bits (uint16: init_paged_cache)
    v: jax.Array  # [num_layers, num_kv_heads, total_pages, page_size, head_dim]

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def total_pages(self) -> int:
        return self.k.shape[2]

    @property
    def page_size(self) -> int:
        return self.k.shape[3]


def init_paged_cache(
    config: ModelConfig,
    *,
    total_pages: int,
    page_size: int,
    num_layers: int | None = None,
    dtype=None,
    fill: float = 0.0,
) -> PagedKVCache:
    """A zero (or `fill`) cache for the target model, or for the MTP head with
    `num_layers=config.mtp_num_layers`.

    Args:
      config: model sizes (kv heads, head_dim, dtype).
      total_pages: pages per layer.
      page_size: tokens per page.
      num_layers: defaults to the target's `config.num_layers`.
      dtype: defaults to the model dtype.
      fill: initial value; tests poison unused pages with NaN.

    On a CPU a 16-bit float cache is stored as its bits (uint16, `kernels/raw_bits.py`): the
    compiler there has no 16-bit float gather or scatter, and a cast of the whole pool is a copy.
    Readers name the float dtype (the model's); a GPU keeps the float dtype.
    """
    layers = config.num_layers if num_layers is None else num_layers
    shape = (layers, config.num_kv_heads, total_pages, page_size, config.head_dim)
    buf = storage(jnp.full(shape, fill, dtype or config.jnp_dtype))
    return PagedKVCache(k=buf, v=buf.copy())


@struct.dataclass
class PackedBatch:
    """One packed forward's inputs (see the module docstring for the contract)."""

    tokens: jax.Array  # i32[T]
    positions: jax.Array  # i32[T]
    page_tables: jax.Array  # i32[R, pages_per_row]
    context_lens: jax.Array  # i32[R]
    query_starts: jax.Array  # i32[R]
    query_lens: jax.Array  # i32[R]

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]


def packed_token_rows(query_starts: jax.Array, query_lens: jax.Array, num_tokens: int):
    """Which row each packed token belongs to.

    Returns:
      rows: i32[T], the covering row (0 where none covers; read together with `valid`).
      valid: bool[T], whether some row covers the token.
    """
    t = jnp.arange(num_tokens, dtype=jnp.int32)[None, :]
    starts = query_starts[:, None]
    covered = (t >= starts) & (t < starts + query_lens[:, None])  # bool[R, T]
    return jnp.argmax(covered, axis=0).astype(jnp.int32), jnp.any(covered, axis=0)


def cache_write_locations(batch: PackedBatch, page_size: int, total_pages: int):
    """(page, slot) of every packed token; padding and out-of-table positions get page
    `total_pages`, one past the end, so that a mode="drop" scatter discards them.

    Returns:
      pages: i32[T], slots: i32[T].
    """
    rows, valid = packed_token_rows(batch.query_starts, batch.query_lens, batch.num_tokens)
    logical = batch.positions // page_size
    in_table = (logical >= 0) & (logical < batch.page_tables.shape[1])
    pages = batch.page_tables[rows, jnp.clip(logical, 0, batch.page_tables.shape[1] - 1)]
    pages = jnp.where(valid & in_table, pages, total_pages)
    return pages.astype(jnp.int32), (batch.positions % page_size).astype(jnp.int32)


def write_kv(
    cache: PagedKVCache, layer: int, pages: jax.Array, slots: jax.Array, k: jax.Array, v: jax.Array
) -> PagedKVCache:
    """Writes `k, v: [T, num_kv_heads, head_dim]` at (pages[t], slots[t]) of `layer`.

    Out-of-range pages are dropped. With the cache donated to the enclosing jit the scatter
    updates the buffer in place.
    """
    if pages.shape[0] == 1:
        # A one-token write would be simplified to a dynamic-update-slice, which the CPU
        # compiler then guards with copies of the whole cache (the attention loop reads the
        # same buffer): add a second, dropped, update so it stays an in-place scatter.
        pages = jnp.concatenate([pages, jnp.full((1,), cache.k.shape[2], pages.dtype)])
        slots = jnp.concatenate([slots, jnp.zeros((1,), slots.dtype)])
        k = jnp.concatenate([k, jnp.zeros_like(k)])
        v = jnp.concatenate([v, jnp.zeros_like(v)])
    # Advanced indices (layer, pages, slots) around a slice put the token axis first, so the
    # indexed view has shape [T, num_kv_heads, head_dim], exactly k's.
    return PagedKVCache(
        k=scatter_set(cache.k, (layer, slice(None), pages, slots), k),
        v=scatter_set(cache.v, (layer, slice(None), pages, slots), v),
    )
