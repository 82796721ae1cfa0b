"""Two changes to every program's arithmetic on a CPU, against what they replaced, interleaved.

    python scripts/bench/decode_layout.py [--batch=16] [--steps=1,8] [--runs=40] [--json_out=FILE]

Compiles the decode program of the embedded default model (float32) at B = --batch, for each K
in --steps, twice: as shipped, and with both changes undone while tracing (`before`):

  - the XLA attention's key and value blocks gathered head-major ([kv head, item, pages], then
    transposed by the compiler into the products' (item, kv head) order) instead of item-major;
  - the vocabulary-wide argmax (a greedy step's token) as `jnp.argmax`, one reduction over
    (value, index) pairs, instead of `sampling.first_argmax`'s three plain reductions.

The variants run in rotated order from the same cursors (`program_variants.interleave`), and
must emit the same tokens. Prints the medians and after / before per program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import flags
from jax import lax
from program_variants import bench_engine, compile_variant, define_flags, paired_medians, run_main

from helios_jax.kernels.ragged_attention_tiles import EXACT, MASK_VALUE
from helios_jax.kernels.raw_bits import take
from helios_jax.prepare import load_engine_model

define_flags()
flags.DEFINE_list("steps", ["1", "8"], "step counts K of the decode programs compared")
FLAGS = flags.FLAGS


def pair_argmax(x):
    """The argmax as it was: `jnp.argmax`."""
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def head_major_softmax(qg, k_flat, v_flat, head_base, items, *, sm_scale, pages_per_block):
    """`ragged_attention_xla._xla_online_softmax` as it was: ids [K, N, pages] (head-major)."""
    num_items, block_q, num_kv_heads, group, head_dim = qg.shape
    page_size = k_flat.shape[1]
    pages_per_row = items.page_ids.shape[1]
    block_k = pages_per_block * page_size
    num_blocks = -(-pages_per_row // pages_per_block)
    page_ids = jnp.pad(items.page_ids, ((0, 0), (0, num_blocks * pages_per_block - pages_per_row)))
    q_pos = items.first_pos[:, None] + jnp.arange(block_q, dtype=jnp.int32)[None, :]
    n_keys = jnp.where(items.n_valid > 0, jnp.minimum(items.context_len, items.first_pos + items.n_valid), 0)
    blocks_needed = (jnp.max(n_keys) + block_k - 1) // block_k

    def key_block(j, carry):
        acc, row_max, row_sum = carry
        ids = lax.dynamic_slice_in_dim(page_ids, j * pages_per_block, pages_per_block, axis=1)
        flat_ids = head_base[:, None, None] + ids[None]  # [K, N, ppb]
        key_pos = j * block_k + jnp.arange(block_k, dtype=jnp.int32)
        key_ok = key_pos[None, :] < items.context_len[:, None]
        k = take(k_flat, flat_ids, qg.dtype).reshape(num_kv_heads, num_items, block_k, head_dim)
        v = take(v_flat, flat_ids, qg.dtype).reshape(num_kv_heads, num_items, block_k, head_dim)
        k = jnp.where(key_ok[None, :, :, None], k, 0)
        v = jnp.where(key_ok[None, :, :, None], v, 0)
        logits = jnp.einsum("nqkgd,knsd->nkgqs", qg, k, precision=EXACT, preferred_element_type=jnp.float32)
        causal = (key_pos[None, None, :] <= q_pos[:, :, None]) & key_ok[:, None, :]
        logits = jnp.where(causal[:, None, None], logits * sm_scale, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))
        rescale = jnp.exp(row_max - new_max)
        weights = jnp.where(causal[:, None, None], jnp.exp(logits - new_max[..., None]), 0.0)
        row_sum = rescale * row_sum + jnp.sum(weights, axis=-1)
        acc = rescale[..., None] * acc + jnp.einsum(
            "nkgqs,knsd->nkgqd", weights, v.astype(jnp.float32), precision=EXACT
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


BEFORE = {
    "helios_jax.kernels.ragged_attention_xla._xla_online_softmax": head_major_softmax,
    "helios_jax.programs.sampling.first_argmax": pair_argmax,
    "helios_jax.programs.acceptance.first_argmax": pair_argmax,
}


def run() -> dict:
    model = load_engine_model(None, dtype="float32")
    steps = tuple(int(k) for k in FLAGS.steps)
    engine = bench_engine(FLAGS.batch, False, decode_steps=steps)
    out = dict(batch=FLAGS.batch, runs=FLAGS.runs, backend=jax.default_backend(), programs={})
    for k in steps:
        compile_ = dict(engine=engine, config=model.config, params=model.params, speculative=False, steps=k)
        before = compile_variant(**compile_, patches=BEFORE)
        variants = {"before": before, "after": compile_variant(**compile_)}
        out["programs"][variants["after"][1].name] = paired_medians(
            variants, model.params, engine, runs=FLAGS.runs, context=FLAGS.context
        )
    return out


if __name__ == "__main__":
    run_main(run)
