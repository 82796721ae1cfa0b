"""The XLA path's groups of work items (`ragged_attention_xla._in_item_groups`): exact against the
naive reference, and each group steps through only the key blocks its own items need."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.kernels import ragged_attention_xla
from helios_jax.kernels.ragged_paged_attention import RaggedAttentionTiles, ragged_paged_attention
from helios_jax.kernels.ragged_work_items import work_items

from .test_ragged_paged_attention import (
    SCENARIOS,
    Scenario,
    check_against_reference,
    make_case,
    random_packings,
)


@pytest.mark.parametrize("group", [2, 3])
def test_grouped_items_match_the_reference(group):
    """Two-token tiles in groups of two or three items: every packing splits into many groups
    (rows spanning groups, groups of padding items only), and every output is the reference's."""
    tiles = RaggedAttentionTiles(xla_block_q=2, xla_block_k=8, xla_prompt_block_k=8, xla_item_group=group)
    run = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.25, impl="xla", tiles=tiles))
    for i, scenario in enumerate(random_packings(12, seed=41 + group)):
        args = make_case(scenario, 2, jnp.float32, seed=300 + i)
        check_against_reference(run(*args), args, jnp.float32)
    for i in (4, 5, 7):  # max_context, prefill_with_decodes, inactive_rows_between
        args = make_case(SCENARIOS[i], 2, jnp.float32, seed=i)
        out = ragged_paged_attention(*args, sm_scale=0.25, impl="xla", tiles=tiles)
        check_against_reference(out, args, jnp.float32)


def test_each_group_reads_only_the_key_blocks_its_items_need(monkeypatch):
    """A 64-token prompt chunk beside a decode row, run eagerly: the key gathers, summed over
    items, are what the groups' own last tokens need (a group of the chunk's first tiles reads
    one key block, the padding group none), not every item through the chunk's last key."""
    scenario = Scenario("chunk_and_decode", ((64, 64), (10, 1)), pages_per_row=16, spare_tokens=7)
    args = make_case(scenario, 2, jnp.float32, seed=3)
    tiles = RaggedAttentionTiles(xla_block_q=2, xla_prompt_block_k=8, xla_item_group=4)
    gathered = []
    take = ragged_attention_xla.take

    def counting_take(flat, ids, dtype):
        gathered.append(ids.shape[0])  # work items in this key block's gather
        return take(flat, ids, dtype)

    monkeypatch.setattr(ragged_attention_xla, "take", counting_take)
    with jax.disable_jit():
        out = ragged_paged_attention(*args, sm_scale=0.25, impl="xla", tiles=tiles)
    check_against_reference(out, args, jnp.float32)

    q, _, _, tables, context_lens, query_starts, query_lens = args
    items = work_items(
        tables,
        context_lens,
        query_starts,
        query_lens,
        num_tokens=q.shape[0],
        block_q=2,
        total_pages=args[1].shape[-3],
        page_size=4,
    )
    n_valid, first, context = (np.asarray(x) for x in (items.n_valid, items.first_pos, items.context_len))
    keys = np.where(n_valid > 0, np.minimum(context, first + n_valid), 0)
    keys = np.pad(keys, (0, -len(keys) % 4)).reshape(-1, 4).max(axis=1)
    blocks = -(-keys // 8)
    assert sum(gathered) == 2 * 4 * blocks.sum()  # keys and values, four items a group
    assert blocks[0] == 1 and blocks.max() == 8 and blocks.min() == 0
    assert sum(gathered) < 2 * len(n_valid) * blocks.max()  # all items in lockstep: the code before
