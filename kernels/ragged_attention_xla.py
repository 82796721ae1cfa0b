"""Ragged paged attention, the XLA path (the CPU path, and any backend without the Triton kernel).

Work items step together, in consecutive groups, through an online softmax over key blocks of
whole pages: gathers and einsums in a `fori_loop` whose traced trip count is the number of
blocks the group's longest item needs (its last token's position), not the row's whole page
window. Layout, masking and the work decomposition are described in
`kernels/ragged_paged_attention.py`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from helios_jax.kernels.ragged_attention_tiles import EXACT, MASK_VALUE
from helios_jax.kernels.ragged_work_items import (
    WorkItems,
    gather_query_tiles,
    query_tile_length,
    scatter_tiles,
    token_index,
    work_items,
)
from helios_jax.kernels.raw_bits import take


def xla_attention(
    q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens, *, sm_scale, tiles, layer
):
    """Every work item, in groups (:func:`_in_item_groups`), an online softmax over key blocks
    of whole pages.

    A group's loop runs only as many key blocks as its longest item needs (its last token's
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
    block_k = tiles.xla_prompt_block_k if block_q == tiles.xla_block_q else tiles.xla_block_k
    pages_per_block = max(1, min(block_k // page_size, pages_per_row))
    acc, row_sum = _in_item_groups(
        qg,
        k_flat,
        v_flat,
        head_base,
        items,
        sm_scale=sm_scale,
        pages_per_block=pages_per_block,
        group=tiles.xla_item_group,
    )
    out = acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]  # padding tokens: 0, dropped below
    out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(num_items, block_q, num_q_heads, head_dim)
    return scatter_tiles(out, index, num_tokens, q.dtype)


def _in_item_groups(qg, k_flat, v_flat, head_base, items: WorkItems, *, sm_scale, pages_per_block, group):
    """:func:`_xla_online_softmax` over consecutive groups of `group` work items, one group
    after another, each stepping through only the key blocks its own longest item needs.

    Items run in lockstep, so one loop over a 4096-token prompt chunk took every query tile
    through every key block of the chunk's last token: twice the causal work, and a short
    tail in a long chunk's program paid for the whole chunk. Items are in row and position
    order, so a group's keys end near its own last token, and a group of padding items needs
    none. Fewer than two groups' items run as one (a decode step's rows: unchanged). The
    blocks a group skips are those its items mask whole, which change no item's softmax.
    """
    num_items = qg.shape[0]
    if num_items < 2 * group:
        return _xla_online_softmax(
            qg, k_flat, v_flat, head_base, items, sm_scale=sm_scale, pages_per_block=pages_per_block
        )
    groups = -(-num_items // group)

    def split(x):  # padding items (zeros: no tokens, no keys), then [groups, group, ...]
        x = jnp.pad(x, [(0, groups * group - num_items)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((groups, group) + x.shape[1:])

    fields = {f.name: split(getattr(items, f.name)) for f in dataclasses.fields(items)}

    def one_group(part):
        q_part, item_fields = part
        return _xla_online_softmax(
            q_part,
            k_flat,
            v_flat,
            head_base,
            WorkItems(**item_fields),
            sm_scale=sm_scale,
            pages_per_block=pages_per_block,
        )

    acc, row_sum = lax.map(one_group, (split(qg), fields))

    def join(x):  # [groups, group, ...] -> the items' own [num_items, ...]
        return x.reshape((-1,) + x.shape[2:])[:num_items]

    return join(acc), join(row_sum)


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
        # Item-major [N, K, ppb] ids gather keys already in the products' batch order (n, k): a
        # head-major gather made the CPU compiler transpose every gathered block.
        flat_ids = ids[:, None, :] + head_base[None, :, None]  # [N, K, ppb]
        key_pos = j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [bk]
        key_ok = key_pos[None, :] < items.context_len[:, None]  # [N, bk]; past it pages may hold NaN
        k = take(k_flat, flat_ids, qg.dtype).reshape(num_items, num_kv_heads, block_k, head_dim)
        v = take(v_flat, flat_ids, qg.dtype).reshape(num_items, num_kv_heads, block_k, head_dim)
        k = jnp.where(key_ok[:, None, :, None], k, 0)
        v = jnp.where(key_ok[:, None, :, None], v, 0)
        logits = jnp.einsum("nqkgd,nksd->nkgqs", qg, k, precision=EXACT, preferred_element_type=jnp.float32)
        causal = (key_pos[None, None, :] <= q_pos[:, :, None]) & key_ok[:, None, :]  # [N, bq, bk]
        logits = jnp.where(causal[:, None, None], logits * sm_scale, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.where(causal[:, None, None], jnp.exp(logits - new_max[..., None]), 0.0)
        row_sum = rescale * row_sum + jnp.sum(weights, axis=-1)
        acc = rescale[..., None] * acc + jnp.einsum(
            "nkgqs,nksd->nkgqd", weights, v.astype(jnp.float32), precision=EXACT
        )
        return acc, new_max, row_sum

    shape = (num_items, num_kv_heads, group, block_q)
    init = (
        jnp.zeros(shape + (head_dim,), jnp.float32),
        jnp.full(shape, MASK_VALUE, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )
    acc, _, row_sum = lax.fori_loop(0, blocks_needed, key_block, init)
    return acc, row_sum
