"""Shared builders of the model tests: seeded parameters, page tables and packed batches.

Everything here is plain host code; the packed batch builder mirrors what the runtime will do:
rows get pages from a shuffled pool, unused page-table entries point at a NaN-poisoned page,
and tokens that no row covers (padding up to the token capacity) carry junk ids and positions.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from helios_jax.model import PackedBatch, init_params
from helios_jax.model.weights import flax_path_to_hf_name


def random_params(config, seed: int, scale: float = 0.1):
    """Seeded parameters large enough that layout mistakes show: matrices ~ N(0, scale),
    norm weights ~ 1 + N(0, 0.3). Generated in float32, then cast to the config's dtype."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
    flat = {}
    for path, leaf in traverse_util.flatten_dict(shapes).items():
        if path[-1] == "weight":  # RMSNorm scales
            value = 1.0 + 0.3 * rng.standard_normal(leaf.shape)
        else:
            value = scale * rng.standard_normal(leaf.shape)
        flat[path] = jnp.asarray(value, jnp.float32).astype(config.jnp_dtype)
    return traverse_util.unflatten_dict(flat)


def hf_weights(params) -> dict[str, np.ndarray]:
    """{transformers name: float64 ndarray} for the numpy references."""
    out = {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        name, transposed = flax_path_to_hf_name(path)
        array = np.asarray(jnp.asarray(leaf, jnp.float32), np.float64)
        out[name] = array.T if transposed else array
    return out


@dataclasses.dataclass
class PagePool:
    """Shuffled page assignment for `rows` rows of up to `max_len` tokens each.

    Page `poison_page` is never assigned; unused page-table entries point at it, and the
    cache is filled with NaN, so any read beyond a row's context poisons the output.
    """

    rows: int
    max_len: int
    page_size: int
    seed: int

    def __post_init__(self):
        self.pages_per_row = -(-self.max_len // self.page_size)
        self.total_pages = self.rows * self.pages_per_row + 3  # spare pages stay NaN
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(self.total_pages)
        self.poison_page = int(order[-1])
        used = order[: self.rows * self.pages_per_row].reshape(self.rows, self.pages_per_row)
        self.page_tables = used.astype(np.int32)

    def tables_for(self, lengths) -> np.ndarray:
        """Page tables where entries past each row's last needed page point at the poison page."""
        tables = np.full_like(self.page_tables, self.poison_page)
        for r, n in enumerate(lengths):
            needed = -(-n // self.page_size)
            tables[r, :needed] = self.page_tables[r, :needed]
        return tables


def pack_step(seqs, done, feed, capacity: int, tables, seed: int = 0) -> PackedBatch:
    """Packs one step: row r feeds seqs[r][done[r] : done[r] + feed[r]].

    Args:
      seqs: per-row full token sequences.
      done: tokens of each row already in the cache.
      feed: new tokens per row this step (0 = inactive).
      capacity: T; the tail is padding with junk token ids and positions.
      tables: page tables i32[R, pages_per_row].
    """
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 7, size=capacity).astype(np.int32)  # junk padding
    positions = rng.integers(0, 50, size=capacity).astype(np.int32)
    feed = np.asarray(feed, np.int32)
    starts = (np.cumsum(feed) - feed).astype(np.int32)
    assert feed.sum() <= capacity
    for r, n in enumerate(feed):
        s = starts[r]
        tokens[s : s + n] = seqs[r][done[r] : done[r] + n]
        positions[s : s + n] = np.arange(done[r], done[r] + n)
    context = np.where(feed > 0, np.asarray(done) + feed, 0).astype(np.int32)
    return PackedBatch(
        tokens=jnp.asarray(tokens),
        positions=jnp.asarray(positions),
        page_tables=jnp.asarray(tables, jnp.int32),
        context_lens=jnp.asarray(context),
        query_starts=jnp.asarray(starts),
        query_lens=jnp.asarray(feed),
    )


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def widened_pools(hlo: str, pool_shape: tuple[int, ...], dtypes=("f32", "bf16")) -> list[str]:
    """Arrays of `dtypes` in a compiled program's HLO text shaped like the KV pool `pool_shape`
    ([L, K, pages, page_size, D]), whole or with its pages flattened as the attention reads them:
    a bf16 pool stored as bits (kernels/raw_bits.py) must never appear widened or cast back."""
    layers, heads, pages, size, dim = pool_shape
    shapes = {",".join(map(str, pool_shape)), f"{layers * heads * pages},{size},{dim}"}
    pattern = r"\b((?:" + "|".join(dtypes) + r")\[([0-9,]*)\])"
    return [m for m, dims in re.findall(pattern, hlo) if dims in shapes]
