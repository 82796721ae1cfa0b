"""Device state: the paged KV caches and the per-row request state every program threads through.

Every program is `(params, state, inputs) -> (state, outputs)` with `state` donated, so the caches
and the small per-row arrays are updated in place. The host never feeds back a pending token or a
cursor: decode and speculative programs read them here, which is what lets the executor queue a
second frame before the first completes.

Rows. `state_rows = request_slots + snapshot_rows`: rows 0..request_slots-1 are request slots,
the rest hold snapshots (written by `snapshot`, read by `restore`). A row's KV lives in pages of
one pool shared by the target and the MTP cache (the same page ids index both); the host owns page
allocation and passes page tables per frame.

Invariants of an active row r, with c = cursor[r] (tokens 0..c-1 in the target cache):
  pending[r]      x_c, the last sampled token: already reported to the host, not yet in a cache
                  (valid once the prompt's last chunk has run)
  last_hidden[r]  h_{c-1}, the target's final-normed hidden state at position c-1, from which
                  x_c was sampled: the draft context's newest entry-in-waiting, and the input of
                  the next prompt token's log-probability
  MTP cache       entries 0..c-2: pairs (h_i, x_{i+1}) absorbed (`forward.draft_forward_packed`).
                  The pair (h_{c-1}, x_c) is absorbed by the next program that advances the row,
                  so every program kind keeps the draft context current, width one included.
Positions past the cursor may hold anything (rejected verification rows, provisional proposals):
validity is only ever the cursor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.engine_config import EngineConfig
from helios_jax.model import ModelConfig, PagedKVCache, init_paged_cache
from helios_jax.programs.processors import RowProcessors, init_processors

PRNG_IMPL = "threefry2x32"


@struct.dataclass
class DeviceState:
    """Per-engine device state (shapes with R = state rows, H = hidden size)."""

    target: PagedKVCache  # k, v: [num_layers, kv_heads, kv_pages, page_size, head_dim]
    draft: PagedKVCache | None  # MTP cache [mtp_layers, ...]; None: nothing speculates or no MTP head
    cursor: jax.Array  # i32[R] tokens already in the cache
    pending: jax.Array  # i32[R] last sampled token, not yet in the cache
    last_hidden: jax.Array  # [R, H] model dtype: target hidden state at cursor - 1
    temperature: jax.Array  # f32[R]; 0 means greedy
    top_p: jax.Array  # f32[R]; 1 disables nucleus filtering
    top_k: jax.Array  # i32[R]; 0 disables top-k filtering
    rng: jax.Array  # u32[R, 2] raw threefry key data, advanced by every sampling program
    #                 (a coupled row keeps its seed's key: its draws are keyed by position)
    coupled: jax.Array  # bool[R] seeded rows: coupled, speculation-invariant draws
    logprobs: jax.Array  # bool[R] the row's request wants its tokens' scores (programs/scores.py)
    generated: jax.Array  # i32[R] output tokens emitted since initialize
    processors: RowProcessors  # per-row logits processors and output counts (processors.py)

    @property
    def rows(self) -> int:
        return self.cursor.shape[0]


def init_state(model: ModelConfig, engine: EngineConfig, *, fill: float = 0.0) -> DeviceState:
    """A fresh state; `fill` initialises the KV pools (tests poison them with NaN).

    The MTP cache exists only when the engine speculates with a model that has an MTP head (a
    model without one speculates with copy proposals alone: `proposals.copy_only_proposals`).
    """
    rows = engine.state_rows
    target = init_paged_cache(model, total_pages=engine.kv_pages, page_size=engine.page_size, fill=fill)
    draft = None
    if engine.speculative and model.has_mtp:
        draft = init_paged_cache(
            model,
            total_pages=engine.kv_pages,
            page_size=engine.page_size,
            num_layers=model.mtp_num_layers,
            fill=fill,
        )
    return DeviceState(
        target=target,
        draft=draft,
        cursor=jnp.zeros((rows,), jnp.int32),
        pending=jnp.zeros((rows,), jnp.int32),
        last_hidden=jnp.zeros((rows, model.hidden_size), model.jnp_dtype),
        temperature=jnp.zeros((rows,), jnp.float32),
        top_p=jnp.ones((rows,), jnp.float32),
        top_k=jnp.zeros((rows,), jnp.int32),
        rng=jnp.zeros((rows, 2), jnp.uint32),
        coupled=jnp.zeros((rows,), bool),
        logprobs=jnp.zeros((rows,), bool),
        generated=jnp.zeros((rows,), jnp.int32),
        processors=init_processors(rows, model.vocab_size),
    )


def state_shapes(model: ModelConfig, engine: EngineConfig) -> DeviceState:
    """The state as `jax.ShapeDtypeStruct`s (for lowering), without allocating."""
    return jax.eval_shape(lambda: init_state(model, engine))


def state_bytes(state: DeviceState) -> dict[str, int]:
    """Bytes of the KV pools and of the per-row arrays (concrete or abstract state)."""

    def nbytes(tree) -> int:
        return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree))

    kv = nbytes(state.target) + nbytes(state.draft)
    rows = nbytes(state) - kv
    return {"kv_pool": kv, "row_state": rows}


def key_data(seed: jax.Array) -> jax.Array:
    """u32[..., 2] threefry key data for integer seeds (traceable)."""
    seed = jnp.asarray(seed)
    keys = jax.vmap(lambda s: jax.random.key(s, impl=PRNG_IMPL))(seed.reshape(-1))
    return jax.random.key_data(keys).reshape(seed.shape + (2,))


def wrap_keys(data: jax.Array) -> jax.Array:
    """Typed keys from u32[..., 2] key data."""
    return jax.random.wrap_key_data(data, impl=PRNG_IMPL)
