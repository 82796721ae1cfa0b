"""Ragged paged attention: one packed batch of prefill, verification and decode rows.

A prepared program packs the new query tokens of every row (one prefill chunk, speculative
verification rows, decode rows) into one array of static capacity T, and reads each row's
keys and values from the paged KV cache through its page table. This module computes the
attention of those packed rows.

Layout (shapes written once here; the entry checks them):
  q             [T, num_q_heads, head_dim]   packed query tokens, float32 or bfloat16
  k_pages       [num_kv_heads, total_pages, page_size, head_dim]
  v_pages       [num_kv_heads, total_pages, page_size, head_dim]
  page_tables   i32[R, pages_per_row]   page ids of each row's context, in order
  context_lens  i32[R]  valid context tokens of the row INCLUDING this step's new tokens
                        (already written into the pages before the call)
  query_starts  i32[R]  packed offset of the row's first query token
  query_lens    i32[R]  new tokens of the row (0: inactive row)
  returns       [T, num_q_heads, head_dim] in q's dtype; packed positions that no row covers are 0

Masking, as index arithmetic: query token i of row r sits at packed index
query_starts[r] + i and absolute position pos = context_lens[r] - query_lens[r] + i; it attends
to the keys at absolute positions 0..pos, key position s living in page
page_tables[r, s // page_size] at offset s % page_size. Worked example (page_size 4):
  row 0: context_lens 6, query_lens 2, query_starts 0, page_tables[0] = [7, 2, junk...]
         token 0 -> packed 0, pos 4: keys 0..4 = page 7 offsets 0..3, page 2 offset 0
         token 1 -> packed 1, pos 5: keys 0..5 (adds page 2 offset 1)
  row 1: context_lens 9, query_lens 1, query_starts 2: a decode token at pos 8, keys 0..8
         over pages page_tables[1, 0..2]
  packed capacity T = 4: packed position 3 belongs to no row and is returned as 0.
Grouped-query attention: q head h reads kv head h // (num_q_heads // num_kv_heads).

Garbage is expected and must not leak: page-table entries past ceil(context_len / page_size)
may be any integer (they are replaced by page 0 before any read), page contents past a row's
context may be NaN (keys and values there are zeroed before the products, scores masked), and
padding query tokens may be NaN (they are never read: query tiles substitute zeros).

Work decomposition (both implementations; `ragged_work_items.py`): each active row is cut into
tiles of `block_q` consecutive query tokens; a tile is one work item (row, first token). With
sum(query_lens) <= T there are at most min(T, ceil(T / block_q) + R) items (every tile holds a
token, every row at most one partial tile), a static bound, so the whole computation has static
shapes. block_q follows the packing density: T / R rounded up to a power of two, capped by the
tile table, so decode-only programs use 1-token tiles and prefill chunks wide ones.
Both paths run an online softmax over key blocks of whole pages and stop at the last key a
tile needs (its last token's position), not at the end of the row's page window: the XLA
path steps every work item together through as many blocks as the longest item needs
(gathers and einsums in a `fori_loop` with a traced trip count), the Pallas path runs one
program per (item, kv head) with its own trip count.
Softmax is float32 throughout; products take their inputs in q's dtype with float32 results.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from helios_jax.kernels.ragged_work_items import (
    WorkItems,
    gather_query_tiles,
    next_power_of_two,
    query_tile_length,
    scatter_tiles,
    token_index,
    work_items,
)

# Finite, so that a fully masked row never produces inf - inf = NaN.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
IMPLS = ("auto", "xla", "pallas")
# float32 products stay float32 on GPUs too (their default would be TF32); no effect on
# bfloat16 inputs or on CPU.
_EXACT = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class RaggedAttentionTiles:
    """Tile sizes. Untuned defaults: no GPU measured them (see docs/kernels.md)."""

    xla_block_q: int = 32  # most query tokens per XLA work item
    xla_block_k: int = 128  # keys per XLA online-softmax step (rounded down to whole pages)
    pallas_block_rows: int = 64  # most (query token x q head) rows per Pallas program
    pallas_min_rows: int = 16  # tl.dot needs >= 16 rows
    pallas_block_k: int = 64  # keys per inner step, a whole number of pages
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_TILES = RaggedAttentionTiles()


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


def select_impl(impl: str, *, head_dim: int, page_size: int, pages_per_row: int) -> str:
    """The one place that resolves impl="auto": Pallas on a GPU (shapes permitting), else XLA."""
    if impl != "auto":
        return impl
    if jax.default_backend() == "gpu" and pallas_shape_problem(head_dim, page_size, pages_per_row) is None:
        return "pallas"
    return "xla"


# ---------------------------------------------------------------------------------------------
# XLA implementation (the CPU path).


def _xla_attention(
    q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens, *, sm_scale, tiles, layer
):
    """All work items at once, an online softmax over key blocks of whole pages.

    The loop runs only as many key blocks as the longest item needs (its last token's
    position, not the row's page window), so a decode step over short contexts reads a few
    pages however long the prepared window is. `k_pages` and `v_pages` hold every layer
    ([L, K, pages, page_size, D]); the gathers index layer `layer` of the whole stack, because
    a slice of it would be copied (a whole layer of cache per call) before the gather.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_layers, num_kv_heads, total_pages, page_size, _ = k_pages.shape
    k_flat = k_pages.reshape(num_layers * num_kv_heads * total_pages, page_size, head_dim)
    v_flat = v_pages.reshape(k_flat.shape)
    head_base = (layer * num_kv_heads + jnp.arange(num_kv_heads, dtype=jnp.int32)) * total_pages  # [K]
    num_rows, pages_per_row = page_tables.shape
    group = num_q_heads // num_kv_heads
    block_q = query_tile_length(num_tokens, num_rows, 1, tiles.xla_block_q)
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
    index = token_index(items, block_q, num_tokens)
    num_items = index.shape[0]
    qg = gather_query_tiles(q, index).reshape(num_items, block_q, num_kv_heads, group, head_dim)
    pages_per_block = max(1, min(tiles.xla_block_k // page_size, pages_per_row))
    acc, row_sum = _xla_online_softmax(
        qg, k_flat, v_flat, head_base, items, sm_scale=sm_scale, pages_per_block=pages_per_block
    )
    out = acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]  # padding tokens: 0, dropped below
    out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(num_items, block_q, num_q_heads, head_dim)
    return scatter_tiles(out, index, num_tokens, q.dtype)


def _xla_online_softmax(qg, k_flat, v_flat, head_base, items: WorkItems, *, sm_scale, pages_per_block):
    """The online softmax of every work item's query tile over its keys, one key block of
    `pages_per_block` whole pages per step, as many steps as the longest item needs.

    Args:
      qg: [N, block_q, K, G, D] query tiles, the q heads grouped by their kv head.
      k_flat, v_flat: [layers * K * pages, page_size, D], every layer's pages flattened.
      head_base: i32[K] the flat index of page 0 of each kv head of the layer read.
    Returns:
      (acc f32[N, K, G, block_q, D] unnormalised outputs, row_sum f32[N, K, G, block_q]).
    """
    num_items, block_q, num_kv_heads, group, head_dim = qg.shape
    page_size = k_flat.shape[1]
    pages_per_row = items.page_ids.shape[1]
    block_k = pages_per_block * page_size
    num_blocks = -(-pages_per_row // pages_per_block)
    page_ids = jnp.pad(items.page_ids, ((0, 0), (0, num_blocks * pages_per_block - pages_per_row)))
    q_pos = items.first_pos[:, None] + jnp.arange(block_q, dtype=jnp.int32)[None, :]  # [N, bq]
    # Keys an item needs: up to its last real token (a padding item needs none).
    n_keys = jnp.where(items.n_valid > 0, jnp.minimum(items.context_len, items.first_pos + items.n_valid), 0)
    blocks_needed = (jnp.max(n_keys) + block_k - 1) // block_k

    def key_block(j, carry):
        acc, row_max, row_sum = carry  # f32[N, K, G, bq, D], f32[N, K, G, bq] twice
        ids = lax.dynamic_slice_in_dim(page_ids, j * pages_per_block, pages_per_block, axis=1)  # [N, ppb]
        flat_ids = head_base[:, None, None] + ids[None]  # [K, N, ppb]
        key_pos = j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [bk]
        key_ok = key_pos[None, :] < items.context_len[:, None]  # [N, bk]; past it pages may hold NaN
        k = k_flat[flat_ids].reshape(num_kv_heads, num_items, block_k, head_dim)
        v = v_flat[flat_ids].reshape(num_kv_heads, num_items, block_k, head_dim)
        k = jnp.where(key_ok[None, :, :, None], k, 0)
        v = jnp.where(key_ok[None, :, :, None], v, 0)
        logits = jnp.einsum("nqkgd,knsd->nkgqs", qg, k, precision=_EXACT, preferred_element_type=jnp.float32)
        causal = (key_pos[None, None, :] <= q_pos[:, :, None]) & key_ok[:, None, :]  # [N, bq, bk]
        logits = jnp.where(causal[:, None, None], logits * sm_scale, _MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.where(causal[:, None, None], jnp.exp(logits - new_max[..., None]), 0.0)
        row_sum = rescale * row_sum + jnp.sum(weights, axis=-1)
        acc = rescale[..., None] * acc + jnp.einsum(
            "nkgqs,knsd->nkgqd", weights, v.astype(jnp.float32), precision=_EXACT
        )
        return acc, new_max, row_sum

    shape = (num_items, num_kv_heads, group, block_q)
    init = (
        jnp.zeros(shape + (head_dim,), jnp.float32),
        jnp.full(shape, _MASK_VALUE, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )
    acc, _, row_sum = lax.fori_loop(0, blocks_needed, key_block, init)
    return acc, row_sum


# ---------------------------------------------------------------------------------------------
# Pallas implementation (the GPU path; interpret mode on CPU for tests).


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
        logits = pltriton.dot(q, k, trans_b=True, precision=_EXACT) * sm_scale  # f32[rows, block_k]
        causal = (key_pos[None, :] <= q_pos[:, None]) & key_ok[None, :]
        logits = jnp.where(causal, logits, _MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.exp(logits - new_max[:, None])
        row_sum = rescale * row_sum + jnp.sum(weights, axis=1)
        acc = rescale[:, None] * acc + pltriton.dot(weights.astype(v.dtype), v, precision=_EXACT)
        return acc, new_max, row_sum

    init = (
        jnp.zeros((rows, head_dim), jnp.float32),
        jnp.full((rows,), _MASK_VALUE, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    acc, _, row_sum = lax.fori_loop(0, pl.cdiv(n_keys, block_k), key_block, init)
    row_sum = jnp.where(row_sum == 0, 1.0, row_sum)  # padding items: 0 / 1, dropped later
    o_ref[...] = (acc / row_sum[:, None]).astype(o_ref.dtype)


def _pallas_attention(
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
    num_tokens, num_q_heads, head_dim = q.shape
    _, num_kv_heads, total_pages, page_size, _ = k_pages.shape
    num_rows, pages_per_row = page_tables.shape
    group = num_q_heads // num_kv_heads
    group_p = next_power_of_two(group)
    block_q = query_tile_length(
        num_tokens,
        num_rows,
        max(1, tiles.pallas_min_rows // group_p),
        max(1, tiles.pallas_block_rows // group_p),
    )
    rows = block_q * group_p
    pages_per_row_p = next_power_of_two(pages_per_row)
    pages_per_block = min(max(1, tiles.pallas_block_k // page_size), pages_per_row_p)
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
    # [N, bq, H, D] -> [N, Hkv, bq * Gp, D]: one contiguous row block per (item, kv head).
    q_tiles = gather_query_tiles(q, index).reshape(num_items, block_q, num_kv_heads, group, head_dim)
    q_tiles = jnp.pad(q_tiles, ((0, 0), (0, 0), (0, 0), (0, group_p - group), (0, 0)))
    q_tiles = q_tiles.transpose(0, 2, 1, 3, 4).reshape(num_items, num_kv_heads, rows, head_dim)
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
    out = pl.pallas_call(
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
        out_shape=jax.ShapeDtypeStruct((num_items, num_kv_heads, rows, head_dim), q.dtype),
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
        name="ragged_paged_attention",
    )(meta, page_ids, q_tiles, k_pages, v_pages)
    out = out.reshape(num_items, num_kv_heads, block_q, group_p, head_dim)[:, :, :, :group]
    out = out.transpose(0, 2, 1, 3, 4).reshape(num_items, block_q, num_q_heads, head_dim)
    return scatter_tiles(out, index, num_tokens, q.dtype)


@functools.partial(jax.jit, static_argnames=("sm_scale", "impl", "interpret", "tiles", "layer"))
def _ragged_paged_attention_jit(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale,
    impl,
    interpret,
    tiles,
    layer,
):
    ints = [x.astype(jnp.int32) for x in (page_tables, context_lens, query_starts, query_lens)]
    if layer is None:  # one layer's pages: a stack of one (a free reshape)
        k_pages, v_pages, layer = k_pages[None], v_pages[None], 0
    if impl == "pallas":
        return _pallas_attention(
            q, k_pages, v_pages, *ints, sm_scale=sm_scale, tiles=tiles, interpret=interpret, layer=layer
        )
    return _xla_attention(q, k_pages, v_pages, *ints, sm_scale=sm_scale, tiles=tiles, layer=layer)


# ---------------------------------------------------------------------------------------------
# Entry.


def _check_shapes(q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens, impl):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if q.ndim != 3 or not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"q must be a float [T, num_q_heads, head_dim] array, got {q.dtype}{q.shape}")
    if k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"k_pages and v_pages must share one 4-d shape, got {k_pages.shape} and {v_pages.shape}"
        )
    if k_pages.dtype != v_pages.dtype or not jnp.issubdtype(k_pages.dtype, jnp.floating):
        raise ValueError(
            f"k_pages and v_pages must share a float dtype, got {k_pages.dtype} and {v_pages.dtype}"
        )
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pages.shape[0]
    if k_pages.shape[3] != head_dim:
        raise ValueError(f"head_dim differs: q {head_dim}, pages {k_pages.shape[3]}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if page_tables.ndim != 2 or not jnp.issubdtype(page_tables.dtype, jnp.integer):
        raise ValueError(
            "page_tables must be an integer [R, pages_per_row] array, got "
            f"{page_tables.dtype}{page_tables.shape}"
        )
    num_rows = page_tables.shape[0]
    if num_rows < 1:
        raise ValueError("page_tables must have at least one row")
    for name, x in (
        ("context_lens", context_lens),
        ("query_starts", query_starts),
        ("query_lens", query_lens),
    ):
        if x.shape != (num_rows,) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer [{num_rows}] array, got {x.dtype}{x.shape}")


def _check_values(q, k_pages, page_tables, context_lens, query_starts, query_lens):
    num_tokens = q.shape[0]
    total_pages, page_size = k_pages.shape[1:3]
    tables, ctx, starts, lens = (
        np.asarray(x, np.int64) for x in (page_tables, context_lens, query_starts, query_lens)
    )
    active = lens > 0
    if (lens < 0).any():
        raise ValueError(f"query_lens must be >= 0, got {lens.tolist()}")
    if (active & (lens > ctx)).any():
        raise ValueError("a row's query_lens exceeds its context_lens (context includes the new tokens)")
    if (active & (ctx > tables.shape[1] * page_size)).any():
        raise ValueError(f"a context exceeds pages_per_row * page_size = {tables.shape[1] * page_size}")
    if (active & ((starts < 0) | (starts + lens > num_tokens))).any():
        raise ValueError(f"a row's query tokens fall outside the packed capacity {num_tokens}")
    order = np.argsort(starts[active], kind="stable")
    s, e = starts[active][order], (starts + lens)[active][order]
    if (s[1:] < e[:-1]).any():
        raise ValueError("rows' packed query ranges overlap")
    used = np.arange(tables.shape[1])[None, :] < (-(-ctx // page_size))[:, None]
    if (used & active[:, None] & ((tables < 0) | (tables >= total_pages))).any():
        raise ValueError(f"a used page-table entry is outside 0..{total_pages - 1}")


def ragged_paged_attention(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale: float,
    impl: str = "auto",
    interpret: bool = False,
    tiles: RaggedAttentionTiles = DEFAULT_TILES,
    layer: int | None = None,
) -> jax.Array:
    """Causal attention of packed ragged query rows over a paged KV cache (module docstring).

    Shape checks always run; value checks (lengths, ranges, overlaps, used page ids) run where
    the integer inputs are concrete, i.e. not inside a caller's `jax.jit`. Under tracing the
    caller guarantees them; a violation then yields zeros or garbage rows, never an error.

    Args:
      q: [T, num_q_heads, head_dim] packed queries (float32 or bfloat16).
      k_pages, v_pages: [num_kv_heads, total_pages, page_size, head_dim]; with `layer`, every
        layer's pages, [num_layers, num_kv_heads, total_pages, page_size, head_dim].
      page_tables: i32[R, pages_per_row].
      context_lens, query_starts, query_lens: i32[R].
      sm_scale: logit scale, usually head_dim ** -0.5 (static).
      impl: "pallas", "xla", or "auto" (`select_impl`: Pallas on a GPU, XLA elsewhere).
      interpret: run the Pallas kernel in interpret mode (CPU tests); ignored by "xla".
      tiles: tile sizes (static; each distinct value compiles its own program).
      layer: the layer of stacked pages to read (a Python int). Pass the whole stacked cache
        and the layer rather than `k_pages[layer]`: on the CPU that slice is a copy of the
        layer's whole cache at every call, which dominated decode steps with long windows.

    Returns:
      [T, num_q_heads, head_dim] in q's dtype; positions that no row covers are 0.
    """
    args = tuple(map(jnp.asarray, (q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens)))
    q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens = args
    one_layer = k_pages, v_pages  # what the checks see: one layer's pages (shapes only)
    if layer is not None:
        if k_pages.ndim != 5 or k_pages.shape != v_pages.shape:
            raise ValueError(
                f"with layer, k_pages and v_pages must share one 5-d [num_layers, num_kv_heads, "
                f"total_pages, page_size, head_dim] shape, got {k_pages.shape} and {v_pages.shape}"
            )
        if (
            isinstance(layer, bool)
            or not isinstance(layer, (int, np.integer))
            or not 0 <= layer < k_pages.shape[0]
        ):
            raise ValueError(f"layer must be an int in [0, {k_pages.shape[0]}), got {layer!r}")
        layer = int(layer)
        one_layer = tuple(jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in (k_pages, v_pages))
    _check_shapes(q, *one_layer, page_tables, context_lens, query_starts, query_lens, impl)
    if not any(isinstance(x, jax.core.Tracer) for x in (page_tables, context_lens, query_starts, query_lens)):
        _check_values(q, one_layer[0], page_tables, context_lens, query_starts, query_lens)
    shape = dict(head_dim=q.shape[2], page_size=k_pages.shape[-2], pages_per_row=page_tables.shape[1])
    resolved = select_impl(impl, **shape)
    if resolved == "pallas" and not interpret:
        problem = pallas_shape_problem(**shape)
        if problem:
            raise ValueError(problem)
    return _ragged_paged_attention_jit(
        *args, sm_scale=float(sm_scale), impl=resolved, interpret=interpret, tiles=tiles, layer=layer
    )


def ragged_paged_attention_reference(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale: float,
    layer: int | None = None,
) -> np.ndarray:
    """Deliberately naive: per row, per query token, float64 numpy. Returns float32 [T, H, D]."""
    if layer is not None:
        k_pages, v_pages = k_pages[layer], v_pages[layer]
    q = np.asarray(jnp.asarray(q, jnp.float32), np.float64)
    k_pages = np.asarray(jnp.asarray(k_pages, jnp.float32), np.float64)
    v_pages = np.asarray(jnp.asarray(v_pages, jnp.float32), np.float64)
    page_tables, context_lens, query_starts, query_lens = (
        np.asarray(x) for x in (page_tables, context_lens, query_starts, query_lens)
    )
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    out = np.zeros(q.shape, np.float64)
    for r in range(len(query_lens)):
        q_len, ctx = int(query_lens[r]), int(context_lens[r])
        if q_len == 0:
            continue
        pages = [int(p) for p in page_tables[r][: math.ceil(ctx / page_size)]]
        # [Hkv, ctx, D]: the row's context in order, read only from its used pages.
        k = np.concatenate([k_pages[:, p] for p in pages], axis=1)[:, :ctx]
        v = np.concatenate([v_pages[:, p] for p in pages], axis=1)[:, :ctx]
        for i in range(q_len):
            t = int(query_starts[r]) + i
            pos = ctx - q_len + i
            for h in range(num_q_heads):
                kv = h // group
                logits = k[kv, : pos + 1] @ q[t, h] * sm_scale
                weights = np.exp(logits - logits.max())
                out[t, h] = weights @ v[kv, : pos + 1] / weights.sum()
    return out.astype(np.float32)
