"""The packed paged forward equals the full-sequence forward, and padding mutates nothing.

Every case runs adversarially: page tables are shuffled, unused page-table entries point at a
page that no row owns, and the whole cache starts as NaN, so a read past a row's context (or
of a page another row owns before it is written) turns the row's logits into NaN. Steps mix
prefill chunks, verification-style multi-token rows, single-token decode rows, inactive rows
and padding tokens in one packed call of fixed token capacity (one compile per config).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention
from helios_jax.model import (
    compute_logits,
    forward_full_logits,
    forward_packed,
    init_paged_cache,
    tiny_config,
)

from .helpers import PagePool, max_abs, pack_step, random_params, widened_pools

CAPACITY = 16  # packed tokens per step
PAGE_SIZE = 4

packed_step = jax.jit(forward_packed, static_argnums=0, static_argnames="attention", donate_argnums=2)
full_logits = jax.jit(forward_full_logits, static_argnums=0)
logits_of = jax.jit(compute_logits, static_argnums=0)

CONFIGS = {
    "gqa2_headdim16": tiny_config(),
    "tied_gqa4": tiny_config(num_heads=4, num_kv_heads=1, head_dim=8, tie_word_embeddings=True),
}

# Per step, new tokens of each of three rows (0 = inactive). Lengths: 13, 4 and 17 tokens.
SCHEDULES = {
    # One token per active row per step; rows finish at different steps.
    "token_by_token": [(1, 1, 1)] * 4 + [(1, 0, 1)] * 9 + [(0, 0, 1)] * 4,
    # A prefill chunk, then verification-style rows of several tokens, then decode steps,
    # with a row that is inactive first and one that finishes early.
    "mixed": [(6, 4, 0), (3, 0, 8), (1, 0, 4), (2, 0, 1), (1, 0, 1), (0, 0, 3)],
}
LENGTHS = (13, 4, 17)


# The Pallas kernel body, run by the interpreter on CPU (the GPU path, checked end to end).
PALLAS_INTERPRET = functools.partial(ragged_paged_attention, impl="pallas", interpret=True)


def _run_schedule(config, params, schedule, seed, attention=None):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, config.vocab_size, size=n).astype(np.int32) for n in LENGTHS]
    pool = PagePool(rows=3, max_len=max(LENGTHS), page_size=PAGE_SIZE, seed=seed)
    cache = init_paged_cache(config, total_pages=pool.total_pages, page_size=PAGE_SIZE, fill=np.nan)
    done = [0, 0, 0]
    errors = []
    for step, feed in enumerate(schedule):
        lengths = [d + f for d, f in zip(done, feed)]
        batch = pack_step(seqs, done, feed, CAPACITY, pool.tables_for(lengths), seed=step)
        hidden, cache = packed_step(config, params, cache, batch, attention=attention)
        logits = np.asarray(logits_of(config, params, hidden))
        starts = np.asarray(batch.query_starts)
        for r, n in enumerate(feed):
            if n:
                want = np.asarray(full_logits(config, params, jnp.asarray(seqs[r])))
                got = logits[starts[r] : starts[r] + n]
                errors.append(max_abs(got, want[done[r] : done[r] + n]))
        done = lengths
    assert done == list(LENGTHS)
    return errors


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_paged_steps_equal_full_forward(config_name, schedule):
    config = CONFIGS[config_name]
    params = random_params(config, seed=1)
    errors = _run_schedule(config, params, SCHEDULES[schedule], seed=2)
    assert max(errors) <= 1e-4, errors


def test_paged_steps_through_the_pallas_kernel_in_interpret_mode():
    config = tiny_config()
    params = random_params(config, seed=1)
    errors = _run_schedule(config, params, SCHEDULES["mixed"], seed=2, attention=PALLAS_INTERPRET)
    assert max(errors) <= 1e-4, errors


@pytest.mark.spec("mixed-execution/inactive-no-mutation")
def test_padding_and_inactive_rows_change_no_cache_page():
    """Row 0 feeds 3 tokens, row 1 is inactive (valid page table), row 2 feeds 1; the other
    12 packed tokens are padding with junk ids and positions. Exactly the four (page, slot)
    pairs of the valid tokens change; everything else stays bitwise equal. The cache starts
    at a finite sentinel (the rows' earlier context is not needed to see where writes land).
    A step with every row inactive changes nothing at all."""
    config = tiny_config()
    params = random_params(config, seed=3)
    seqs = [np.arange(8, dtype=np.int32) + 10 * r for r in range(3)]
    pool = PagePool(rows=3, max_len=8, page_size=PAGE_SIZE, seed=4)
    tables = pool.tables_for([8, 8, 8])
    cache = init_paged_cache(config, total_pages=pool.total_pages, page_size=PAGE_SIZE, fill=7.0)
    done, feed = [2, 5, 6], [3, 0, 1]
    batch = pack_step(seqs, done, feed, CAPACITY, tables, seed=5)
    before_k, before_v = np.asarray(cache.k), np.asarray(cache.v)
    _, cache = packed_step(config, params, cache, batch)
    after_k, after_v = np.asarray(cache.k), np.asarray(cache.v)

    written = np.zeros(before_k.shape[2:4], bool)  # [total_pages, page_size]
    for r, n in enumerate(feed):
        for p in range(done[r], done[r] + n):
            written[tables[r, p // PAGE_SIZE], p % PAGE_SIZE] = True
    for before, after in ((before_k, after_k), (before_v, after_v)):
        assert np.array_equal(before[:, :, ~written], after[:, :, ~written])
        assert np.all(before[:, :, written] != after[:, :, written])

    idle = pack_step(seqs, done, [0, 0, 0], CAPACITY, tables, seed=6)
    _, cache = packed_step(config, params, cache, idle)
    assert np.array_equal(np.asarray(cache.k), after_k)
    assert np.array_equal(np.asarray(cache.v), after_v)


def test_aot_compiled_packed_forward_donates_the_cache():
    """`jit(...).lower(...).compile()` of the packed step; the compiled executable consumes the
    donated cache buffers and returns the same hidden states as the traced call."""
    config = tiny_config()
    params = random_params(config, seed=7)
    seqs = [np.arange(5, dtype=np.int32) + 3 * r for r in range(3)]
    pool = PagePool(rows=3, max_len=8, page_size=PAGE_SIZE, seed=8)
    batch = pack_step(seqs, [0, 0, 0], [5, 2, 1], CAPACITY, pool.tables_for([5, 2, 1]))
    fresh = lambda: init_paged_cache(config, total_pages=pool.total_pages, page_size=PAGE_SIZE)  # noqa: E731

    cache = fresh()
    compiled = packed_step.lower(config, params, cache, batch).compile()
    hidden, new_cache = compiled(params, cache, batch)
    assert cache.k.is_deleted() and cache.v.is_deleted()
    reference_hidden, reference_cache = packed_step(config, params, fresh(), batch)
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(reference_hidden))
    np.testing.assert_array_equal(np.asarray(new_cache.k), np.asarray(reference_cache.k))


def test_bfloat16_paged_steps_track_float32():
    """bf16 parameters and compute: the paged steps equal the bf16 full forward closely, and
    both stay near the float32 model (loose: bf16 keeps 8 bits of mantissa)."""
    config32 = tiny_config()
    config16 = config32.replace(dtype="bfloat16")
    params32 = random_params(config32, seed=9)
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params32)
    errors = _run_schedule(config16, params16, SCHEDULES["mixed"], seed=10)
    assert max(errors) <= 0.05, errors

    tokens = jnp.asarray(np.random.default_rng(11).integers(0, config32.vocab_size, 17), jnp.int32)
    want = np.asarray(full_logits(config32, params32, tokens))
    got = np.asarray(full_logits(config16, params16, tokens))
    assert got.dtype == np.float32
    assert max_abs(got, want) <= 0.05 * max(1.0, float(np.abs(want).max()))


def test_bfloat16_step_never_widens_the_cache():
    """A bf16 paged step writes and reads its KV pool in bf16: the CPU compiler has no bf16
    scatter or gather and, given one, converts the whole pool (every layer) to float32 and back
    around each write and hoists a float32 copy of it out of the attention's key loop, several
    times the cost of the step (kernels/raw_bits.py). No float32 or bf16 copy of the pool may
    appear."""
    config = tiny_config().replace(dtype="bfloat16")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), random_params(tiny_config(), seed=12))
    seqs = [np.arange(8, dtype=np.int32) + 3 * r for r in range(3)]
    pool = PagePool(rows=3, max_len=8, page_size=PAGE_SIZE, seed=13)
    cache = init_paged_cache(config, total_pages=pool.total_pages, page_size=PAGE_SIZE)
    batch = pack_step(seqs, [2, 0, 5], [3, 1, 1], CAPACITY, pool.tables_for([5, 1, 6]))
    hlo = packed_step.lower(config, params, cache, batch).compile().as_text()
    assert cache.k.dtype == jnp.uint16  # a CPU stores a bf16 cache as its bits
    assert widened_pools(hlo, cache.k.shape) == []
