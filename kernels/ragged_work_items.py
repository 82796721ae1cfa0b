"""Ragged paged attention's work decomposition: packed query rows cut into static query tiles.

Both implementations of `kernels.ragged_paged_attention` share it. Each active row is cut into
tiles of `block_q` consecutive query tokens; a tile is one work item (row, first token). With
sum(query_lens) <= T there are at most min(T, ceil(T / block_q) + R) items (every tile holds a
token, every row at most one partial tile), a static bound, so the whole computation has static
shapes. Worked example, block_q 2, T 8, rows with query_lens [3, 0, 1] at query_starts [0, 3, 3]:
  tiles per row [2, 0, 1] -> items (row 0, tokens 0..1), (row 0, token 2), (row 2, token 0),
  then padding items with n_valid 0 up to min(8, 4 + 3) = 7 items.
Tiles gather their tokens from the packed queries (padding reads an appended zero row, never the
caller's NaN) and scatter their outputs back (padding tokens are dropped).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def query_tile_length(num_tokens: int, num_rows: int, lo: int, hi: int) -> int:
    """Query tokens per tile: the mean packed row length, as a power of two in [lo, hi]."""
    return min(max(next_power_of_two(-(-num_tokens // max(num_rows, 1))), lo), hi)


@dataclasses.dataclass(frozen=True)
class WorkItems:
    """Static-size list of (row, query tile) work items; padding items have n_valid 0."""

    row: jax.Array  # i32[N]
    packed_start: jax.Array  # i32[N] packed index of the tile's first token
    first_pos: jax.Array  # i32[N] absolute position of the tile's first token
    n_valid: jax.Array  # i32[N] real tokens in the tile (0..block_q)
    context_len: jax.Array  # i32[N]
    page_ids: jax.Array  # i32[N, pages_per_row] row's page table, unused slots set to page 0


def work_items(
    page_tables, context_lens, query_starts, query_lens, *, num_tokens, block_q, total_pages, page_size
) -> WorkItems:
    num_rows = page_tables.shape[0]
    # Each tile holds >= 1 token, and each row has at most one partial tile.
    num_items = min(num_tokens, -(-num_tokens // block_q) + num_rows)
    query_lens = jnp.maximum(query_lens, 0)
    tiles = -(-query_lens // block_q)  # i32[R] tiles per row
    ends = jnp.cumsum(tiles)  # item ids [ends[r] - tiles[r], ends[r]) belong to row r
    item = jnp.arange(num_items, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(ends, item, side="right"), num_rows - 1).astype(jnp.int32)
    offset = (item - (ends[row] - tiles[row])) * block_q  # first token of the tile, in the row
    n_valid = jnp.where(item < ends[-1], jnp.clip(query_lens[row] - offset, 0, block_q), 0)
    context_len = context_lens[row]
    used_pages = -(-context_len // page_size)
    slot = jnp.arange(page_tables.shape[1], dtype=jnp.int32)
    page_ids = jnp.where(slot[None, :] < used_pages[:, None], page_tables[row], 0)
    return WorkItems(
        row=row,
        packed_start=query_starts[row] + offset,
        first_pos=context_len - query_lens[row] + offset,
        n_valid=n_valid.astype(jnp.int32),
        context_len=context_len,
        page_ids=jnp.clip(page_ids, 0, total_pages - 1).astype(jnp.int32),
    )


def token_index(items: WorkItems, block_q: int, num_tokens: int) -> jax.Array:
    """i32[N, block_q] packed index of each tile token; num_tokens (one past the end) if padding."""
    k = jnp.arange(block_q, dtype=jnp.int32)
    valid = k[None, :] < items.n_valid[:, None]
    return jnp.where(valid, items.packed_start[:, None] + k[None, :], num_tokens)


def gather_query_tiles(q, index):
    """[N, block_q, H, D] query tiles; padding tokens read an appended zero row, never q's NaN."""
    q_padded = jnp.concatenate([q, jnp.zeros((1,) + q.shape[1:], q.dtype)])
    return q_padded[index]


def scatter_tiles(tiles, index, num_tokens, dtype):
    """Writes [N, block_q, H, D] tile outputs back to [T, H, D]; padding tokens are dropped."""
    out = jnp.zeros((num_tokens + 1,) + tiles.shape[2:], dtype)
    out = out.at[index.reshape(-1)].set(tiles.reshape((-1,) + tiles.shape[2:]).astype(dtype))
    return out[:num_tokens]
