"""Ragged paged attention, the Pallas path (Triton on a GPU; interpret mode on CPU for tests).

One program per (work item, kv head) runs its own online softmax over key blocks of whole pages
and stops at the last key its tile needs. The q heads of one kv head are padded to a power of
two (`group_p`) and laid out token-major, so each program multiplies one contiguous block of
block_q x group_p rows. Layout, masking and the work decomposition are described in
`kernels/ragged_paged_attention.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

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
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} must be a power of two >= 16 for the Triton kernel"
    if page_size & (page_size - 1):
        return f"page_size {page_size} must be a power of two for the Triton kernel"
    if next_power_of_two(pages_per_row) * page_size < 16:
        return (
            f"a row's page window ({pages_per_row} x {page_size}) must hold >= 16 keys for the Triton kernel"
        )
    return None


def ragged_paged_attention_kernel(
    meta_ref,  # i32[4]: context_len, first_pos, n_valid, unused (this work item)
    page_ids_ref,  # i32[pages_per_row_p] the item's row page table, unused slots -> page 0
    q_ref,  # [rows, head_dim] rows = block_q x group_p: token-major, q head within the group minor
    k_pages_ref,  # [total_pages, page_size, head_dim] this program's kv head
    v_pages_ref,  # [total_pages, page_size, head_dim]
    o_ref,  # [rows, head_dim]
    *,
    sm_scale: float,
    group_p: int,  # q heads per kv head, padded to a power of two
    pages_per_block: int,
):
    """One (work item, kv head): online softmax over key blocks up to the tile's last position."""
    context_len, first_pos, n_valid = meta_ref[0], meta_ref[1], meta_ref[2]
    rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    block_k = pages_per_block * page_size
    q = q_ref[...]
    q_pos = first_pos + lax.broadcasted_iota(jnp.int32, (rows,), 0) // group_p  # i32[rows]
    # Keys past the tile's last token or the context are never needed.
    n_keys = jnp.where(n_valid > 0, jnp.minimum(context_len, first_pos + n_valid), 0)

    def key_block(j, carry):
        acc, row_max, row_sum = carry  # f32[rows, D], f32[rows], f32[rows]
        page_ids = page_ids_ref[pl.ds(j * pages_per_block, pages_per_block)]
        key_pos = j * block_k + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        key_ok = key_pos < context_len
        k = k_pages_ref[page_ids].reshape(block_k, head_dim)
        v = v_pages_ref[page_ids].reshape(block_k, head_dim)
        k = jnp.where(key_ok[:, None], k, jnp.zeros_like(k))  # zero NaN poison past the context
        v = jnp.where(key_ok[:, None], v, jnp.zeros_like(v))
        logits = pltriton.dot(q, k, trans_b=True, precision=EXACT) * sm_scale  # f32[rows, block_k]
        causal = (key_pos[None, :] <= q_pos[:, None]) & key_ok[None, :]
        logits = jnp.where(causal, logits, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.exp(logits - new_max[:, None])
        row_sum = rescale * row_sum + jnp.sum(weights, axis=1)
        acc = rescale[:, None] * acc + pltriton.dot(weights.astype(v.dtype), v, precision=EXACT)
        return acc, new_max, row_sum

    init = (
        jnp.zeros((rows, head_dim), jnp.float32),
        jnp.full((rows,), MASK_VALUE, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    acc, _, row_sum = lax.fori_loop(0, pl.cdiv(n_keys, block_k), key_block, init)
    row_sum = jnp.where(row_sum == 0, 1.0, row_sum)  # padding items: 0 / 1, dropped later
    o_ref[...] = (acc / row_sum[:, None]).astype(o_ref.dtype)


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
    """Every work item of layer `layer` of the stacked pages ([L, K, pages, page_size, D]), one
    kernel program per (item, kv head); the arguments are those of `ragged_paged_attention`."""
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
        sm_scale=sm_scale,
        group_p=group_p,
        tiles=tiles,
        interpret=interpret,
        layer=layer,
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


def _pallas_call(items: WorkItems, q_tiles, k_pages, v_pages, *, sm_scale, group_p, tiles, interpret, layer):
    """The kernel over the grid (item, kv head): q_tiles [N, Hkv, rows, D] -> [N, Hkv, rows, D].

    Each program reads its item's metadata and its row's page table padded to a power of two
    (Triton block extents), and key blocks of whole pages, at most that padded window.
    """
    num_items, num_kv_heads, rows, head_dim = q_tiles.shape
    total_pages, page_size = k_pages.shape[2:4]
    pages_per_row = items.page_ids.shape[1]
    pages_per_row_p = next_power_of_two(pages_per_row)
    pages_per_block = min(max(1, tiles.pallas_block_k // page_size), pages_per_row_p)
    page_ids = jnp.pad(items.page_ids, ((0, 0), (0, pages_per_row_p - pages_per_row)))
    meta = jnp.stack(
        [items.context_len, items.first_pos, items.n_valid, jnp.zeros_like(items.n_valid)], axis=1
    ).astype(jnp.int32)
    kernel = functools.partial(
        ragged_paged_attention_kernel, sm_scale=sm_scale, group_p=group_p, pages_per_block=pages_per_block
    )
    # Layer `layer` of the stacked pages, selected by the block index (no slice outside).
    pages_spec = pl.BlockSpec(
        (None, None, total_pages, page_size, head_dim), lambda i, h: (layer, h, 0, 0, 0)
    )
    tile_spec = pl.BlockSpec((None, None, rows, head_dim), lambda i, h: (i, h, 0, 0))
    return pl.pallas_call(
        kernel,
        grid=(num_items, num_kv_heads),
        in_specs=[
            pl.BlockSpec((None, 4), lambda i, h: (i, 0)),
            pl.BlockSpec((None, pages_per_row_p), lambda i, h: (i, 0)),
            tile_spec,
            pages_spec,
            pages_spec,
        ],
        out_specs=tile_spec,
        out_shape=jax.ShapeDtypeStruct((num_items, num_kv_heads, rows, head_dim), q_tiles.dtype),
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
        name="ragged_paged_attention",
    )(meta, page_ids, q_tiles, k_pages, v_pages)
