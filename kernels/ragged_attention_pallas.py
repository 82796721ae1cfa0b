"""Ragged paged attention, the Pallas path (Triton on a GPU; interpret mode on CPU for tests).

One program per (work item, kv head, key split) runs its own online softmax over key blocks of
whole pages and stops at the last key its tile needs. The q heads of one kv head are padded to
a power of two (`group_p`) and laid out token-major, so each program multiplies one contiguous
block of block_q x group_p rows. Layout, masking and the work decomposition are described in
`kernels/ragged_paged_attention.py`.

Two things keep the number of compiled kernels and the GPU's occupancy in hand:

- The layer is a runtime value (the fourth column of each item's metadata), not a block index:
  the kernels read the whole stacked cache ([L, K, pages, page_size, D]) at
  `k_pages_ref[layer, head, page_ids]`. Every layer of one shape is the same Triton kernel
  (before, each layer baked its index into the block index map and compiled its own).
- Split-KV (as JAX's paged attention does with `k_splits`): with few work items (a decode
  step at small batch has one item per row and a handful of kv heads) the grid gains a third
  axis of `num_splits` programs per (item, kv head), each walking an equal share of the item's
  key blocks; each writes its unnormalised accumulator, row max and row sum, and XLA merges
  them (`merge_splits`). `kv_splits` chooses the count from the static shape. Worked example:
  one decode row over a 4096-token window, page size 16, 2 kv heads, 64-key blocks: 64 key
  blocks for 2 programs without a split; with the default tiles 32 splits give 64 programs of
  at most 2 blocks each.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from helios_jax.kernels.jax_compat import TRITON_PROBLEM, triton_compiler_params, triton_dot
from helios_jax.kernels.ragged_attention_tiles import EXACT, MASK_VALUE
from helios_jax.kernels.ragged_work_items import (
    WorkItems,
    gather_query_tiles,
    next_power_of_two,
    query_tile_length,
    scatter_tiles,
    token_index,
    work_items,
)


def pallas_shape_problem(head_dim: int, page_size: int, pages_per_row: int) -> str | None:
    """Why the compiled (Triton) kernel cannot take these shapes, or None when it can.

    Triton blocks need power-of-two extents and tl.dot needs every extent >= 16; the kernel's
    key block is a whole number of pages, at most the row's (padded) page window.
    """
    if TRITON_PROBLEM:
        return TRITON_PROBLEM
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} must be a power of two >= 16 for the Triton kernel"
    if page_size & (page_size - 1):
        return f"page_size {page_size} must be a power of two for the Triton kernel"
    if next_power_of_two(pages_per_row) * page_size < 16:
        return (
            f"a row's page window ({pages_per_row} x {page_size}) must hold >= 16 keys for the Triton kernel"
        )
    return None


def kv_splits(num_programs: int, max_key_blocks: int, tiles) -> int:
    """Key splits per (item, kv head): `tiles.pallas_kv_splits` when set, else the largest power
    of two that keeps the grid within `tiles.pallas_target_programs`, at most
    `tiles.pallas_max_kv_splits` and at most the key blocks of the padded window."""
    if tiles.pallas_kv_splits:
        return max(1, min(tiles.pallas_kv_splits, max_key_blocks))
    splits = 1
    while (
        2 * splits <= min(max_key_blocks, tiles.pallas_max_kv_splits)
        and 2 * splits * num_programs <= tiles.pallas_target_programs
    ):
        splits *= 2
    return splits


def ragged_paged_attention_kernel(
    meta_ref,  # i32[4]: context_len, first_pos, n_valid, layer (this work item)
    page_ids_ref,  # i32[pages_per_row_p] the item's row page table, unused slots -> page 0
    q_ref,  # [rows, head_dim] rows = block_q x group_p: token-major, q head within the group minor
    k_pages_ref,  # [num_layers, num_kv_heads, total_pages, page_size, head_dim] the whole cache
    v_pages_ref,  # the same
    *out_refs,  # num_splits == 1: o [rows, D]; else acc f32[rows, D], max f32[rows], sum f32[rows]
    sm_scale: float,
    group_p: int,  # q heads per kv head, padded to a power of two
    pages_per_block: int,
    num_splits: int,
):
    """One (work item, kv head, split): online softmax over the split's share of the key blocks
    up to the tile's last position."""
    context_len, first_pos, n_valid, layer = meta_ref[0], meta_ref[1], meta_ref[2], meta_ref[3]
    head = pl.program_id(1)
    rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[3]
    block_k = pages_per_block * page_size
    q = q_ref[...]
    q_pos = first_pos + lax.broadcasted_iota(jnp.int32, (rows,), 0) // group_p  # i32[rows]
    # Keys past the tile's last token, the context or the row's page window are never read (a
    # context past the window, a caller's error, must not read past the page table: a GPU fault).
    n_keys = jnp.where(n_valid > 0, jnp.minimum(context_len, first_pos + n_valid), 0)
    num_blocks = jnp.minimum(pl.cdiv(n_keys, block_k), page_ids_ref.shape[0] // pages_per_block)
    per_split = pl.cdiv(num_blocks, num_splits)
    first_block = pl.program_id(2) * per_split if num_splits > 1 else 0
    last_block = jnp.minimum(first_block + per_split, num_blocks)

    def key_block(j, carry):
        acc, row_max, row_sum = carry  # f32[rows, D], f32[rows], f32[rows]
        page_ids = page_ids_ref[pl.ds(j * pages_per_block, pages_per_block)]
        key_pos = j * block_k + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        key_ok = key_pos < context_len
        k = k_pages_ref[layer, head, page_ids].reshape(block_k, head_dim)
        v = v_pages_ref[layer, head, page_ids].reshape(block_k, head_dim)
        k = jnp.where(key_ok[:, None], k, jnp.zeros_like(k))  # zero NaN poison past the context
        v = jnp.where(key_ok[:, None], v, jnp.zeros_like(v))
        logits = triton_dot(q, k, trans_b=True, precision=EXACT) * sm_scale  # f32[rows, block_k]
        causal = (key_pos[None, :] <= q_pos[:, None]) & key_ok[None, :]
        logits = jnp.where(causal, logits, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.exp(logits - new_max[:, None])
        row_sum = rescale * row_sum + jnp.sum(weights, axis=1)
        acc = rescale[:, None] * acc + triton_dot(weights.astype(v.dtype), v, precision=EXACT)
        return acc, new_max, row_sum

    init = (
        jnp.zeros((rows, head_dim), jnp.float32),
        jnp.full((rows,), MASK_VALUE, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    acc, row_max, row_sum = lax.fori_loop(first_block, last_block, key_block, init)
    if num_splits > 1:  # merged outside (`merge_splits`)
        acc_ref, max_ref, sum_ref = out_refs
        acc_ref[...], max_ref[...], sum_ref[...] = acc, row_max, row_sum
        return
    row_sum = jnp.where(row_sum == 0, 1.0, row_sum)  # padding items: 0 / 1, dropped later
    out_refs[0][...] = (acc / row_sum[:, None]).astype(out_refs[0].dtype)


def merge_splits(acc, row_max, row_sum, dtype):
    """Merges the splits' online softmax states: acc f32[..., S, rows, D], row_max and row_sum
    f32[..., S, rows] -> [..., rows, D] in `dtype`. An empty split (max MASK_VALUE, sum 0) weighs
    nothing beside a real one; an item with no keys at all gives 0."""
    best = jnp.max(row_max, axis=-2, keepdims=True)
    weight = jnp.exp(row_max - best)  # [..., S, rows]
    total = jnp.sum(weight * row_sum, axis=-2)
    out = jnp.sum(weight[..., None] * acc, axis=-3)
    return (out / jnp.where(total == 0, 1.0, total)[..., None]).astype(dtype)


def pallas_attention(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale,
    tiles,
    interpret,
    layer,
):
    """Every work item of layer `layer` (an i32 scalar, traced or not) of the stacked pages
    ([L, K, pages, page_size, D]); the other arguments are those of `ragged_paged_attention`."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, num_kv_heads, total_pages, page_size, _ = k_pages.shape
    num_rows = page_tables.shape[0]
    group = num_q_heads // num_kv_heads
    group_p = next_power_of_two(group)
    block_q = query_tile_length(
        num_tokens,
        num_rows,
        max(1, tiles.pallas_min_rows // group_p),
        max(1, tiles.pallas_block_rows // group_p),
    )
    items = work_items(
        page_tables,
        context_lens,
        query_starts,
        query_lens,
        num_tokens=num_tokens,
        block_q=block_q,
        total_pages=total_pages,
        page_size=page_size,
    )
    num_items = items.row.shape[0]
    index = token_index(items, block_q, num_tokens)
    q_tiles = _kv_head_query_tiles(q, index, num_kv_heads, group_p)
    out = _pallas_call(
        items,
        q_tiles,
        k_pages,
        v_pages,
        layer,
        sm_scale=sm_scale,
        group_p=group_p,
        tiles=tiles,
        interpret=interpret,
    )
    out = out.reshape(num_items, num_kv_heads, block_q, group_p, head_dim)[:, :, :, :group]
    out = out.transpose(0, 2, 1, 3, 4).reshape(num_items, block_q, num_q_heads, head_dim)
    return scatter_tiles(out, index, num_tokens, q.dtype)


def _kv_head_query_tiles(q, index, num_kv_heads: int, group_p: int):
    """The query tiles laid out for the kernel: [N, bq, H, D] -> [N, Hkv, bq * Gp, D], one
    contiguous row block per (item, kv head), token-major, the group's q heads padded to Gp."""
    num_items, block_q = index.shape
    _, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    q_tiles = gather_query_tiles(q, index).reshape(num_items, block_q, num_kv_heads, group, head_dim)
    q_tiles = jnp.pad(q_tiles, ((0, 0), (0, 0), (0, 0), (0, group_p - group), (0, 0)))
    return q_tiles.transpose(0, 2, 1, 3, 4).reshape(num_items, num_kv_heads, block_q * group_p, head_dim)


def _pallas_call(items: WorkItems, q_tiles, k_pages, v_pages, layer, *, sm_scale, group_p, tiles, interpret):
    """The kernel over the grid (item, kv head, split): q_tiles [N, Hkv, rows, D] -> [N, Hkv, rows, D].

    Each program reads its item's metadata (with the layer) and its row's page table padded to
    a power of two (Triton block extents), and key blocks of whole pages of the layer and kv
    head it names, at most that padded window. With splits the partial states are merged here.
    """
    num_items, num_kv_heads, rows, head_dim = q_tiles.shape
    page_size = k_pages.shape[3]
    pages_per_row = items.page_ids.shape[1]
    pages_per_row_p = next_power_of_two(pages_per_row)
    pages_per_block = min(max(1, tiles.pallas_block_k // page_size), pages_per_row_p)
    num_splits = kv_splits(num_items * num_kv_heads, pages_per_row_p // pages_per_block, tiles)
    page_ids = jnp.pad(items.page_ids, ((0, 0), (0, pages_per_row_p - pages_per_row)))
    layer_column = jnp.broadcast_to(jnp.asarray(layer, jnp.int32), items.n_valid.shape)
    meta = jnp.stack([items.context_len, items.first_pos, items.n_valid, layer_column], axis=1)
    kernel = functools.partial(
        ragged_paged_attention_kernel,
        sm_scale=sm_scale,
        group_p=group_p,
        pages_per_block=pages_per_block,
        num_splits=num_splits,
    )
    whole = pl.BlockSpec(k_pages.shape, lambda i, h, s: (0,) * k_pages.ndim)  # the kernel indexes it
    tile_spec = pl.BlockSpec((None, None, rows, head_dim), lambda i, h, s: (i, h, 0, 0))
    split_shape = (num_items, num_kv_heads, num_splits, rows)
    if num_splits == 1:
        out_specs = tile_spec
        out_shape = jax.ShapeDtypeStruct(q_tiles.shape, q_tiles.dtype)
    else:
        out_specs = (
            pl.BlockSpec((None, None, None, rows, head_dim), lambda i, h, s: (i, h, s, 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda i, h, s: (i, h, s, 0)),
            pl.BlockSpec((None, None, None, rows), lambda i, h, s: (i, h, s, 0)),
        )
        out_shape = (
            jax.ShapeDtypeStruct(split_shape + (head_dim,), jnp.float32),
            jax.ShapeDtypeStruct(split_shape, jnp.float32),
            jax.ShapeDtypeStruct(split_shape, jnp.float32),
        )
    out = pl.pallas_call(
        kernel,
        grid=(num_items, num_kv_heads, num_splits),
        in_specs=[
            pl.BlockSpec((None, 4), lambda i, h, s: (i, 0)),
            pl.BlockSpec((None, pages_per_row_p), lambda i, h, s: (i, 0)),
            tile_spec,
            whole,
            whole,
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=triton_compiler_params(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
        name="ragged_paged_attention",
    )(meta.astype(jnp.int32), page_ids, q_tiles, k_pages, v_pages)
    return out if num_splits == 1 else merge_splits(*out, q_tiles.dtype)
