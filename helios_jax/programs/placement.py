"""Where the programs' arguments and results live on a tensor-parallel mesh.

Every program is `(params, state, inputs) -> (state, outputs)`. Over a mesh (`Impl.mesh`):

    params    split by `helios_jax.model.sharding.param_spec` (heads, MLP columns, vocabulary)
    state     the KV pools (every `PagedKVCache` leaf) split by KV head; every other leaf, the
              per-row request state whatever it holds, replicated
    inputs    replicated (packed host data, identical on every device)
    outputs   replicated (tokens, counts, confidence, scores: what the host reads)

so each device holds a whole copy of the row state and of the inputs and outputs, and its share
of the weights and the cache. The rule for the state is structural (a cache leaf or not), so a
new per-row array needs no entry here.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from helios_jax.model import PagedKVCache
from helios_jax.model.sharding import KV_PAGES, REPLICATED, param_shardings


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, REPLICATED)


def state_shardings(mesh: Mesh, state):
    """NamedShardings mirroring a DeviceState (arrays or ShapeDtypeStructs): caches by KV head."""
    pages = NamedSharding(mesh, KV_PAGES)

    def one(node):
        if isinstance(node, PagedKVCache):
            return PagedKVCache(k=pages, v=pages)
        return replicated(mesh)

    return jax.tree_util.tree_map(one, state, is_leaf=lambda node: isinstance(node, PagedKVCache))


def jit_program(fn, mesh: Mesh | None, params_spec, state_spec):
    """`fn` jitted with the state donated; over a mesh, with the shardings of the module docs.

    The single-device form (mesh None) is exactly `jax.jit(fn, donate_argnums=1)`.
    """
    if mesh is None:
        return jax.jit(fn, donate_argnums=1)
    state = state_shardings(mesh, state_spec)
    rest = replicated(mesh)  # a prefix: every leaf of the inputs, and of the outputs
    return jax.jit(
        fn,
        donate_argnums=1,
        in_shardings=(param_shardings(mesh, params_spec), state, rest),
        out_shardings=(state, rest),
    )


def init_sharded_state(mesh: Mesh, init, state_spec):
    """`init()` (a fresh DeviceState) computed straight into its shardings: each device allocates
    only its share of the KV pools, never a whole copy first."""
    return jax.jit(init, out_shardings=state_shardings(mesh, state_spec))()
