"""The one place that picks kernel implementations for the programs.

- Ragged paged attention: `helios_jax.kernels.ragged_paged_attention` with impl="auto" (its own
  `select_impl` resolves Pallas on a GPU when the shapes allow, XLA otherwise). The model's
  packed forwards use it when given `attention=None`; programs pass `attention_kernel()`.
- Speculative prefix allocation: the Pallas kernel on a GPU, its pure-jnp reference
  (`prefix_allocation_reference`, the XLA path) elsewhere. Both follow the same rule and agree
  on the shared golden cases (tests/kernels).

`Impl` is frozen and hashable; builders take it so tests can force a path. Its `mesh` (None on
one device) is the tensor-parallel mesh: the attention kernel then runs under `shard_map` on each
shard's heads (`helios_jax.model.sharding` documents the layout).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import Mesh, PartitionSpec

from helios_jax.kernels.prefix_allocation import prefix_allocation, prefix_allocation_reference
from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention
from helios_jax.model.sharding import AXIS, KV_PAGES, REPLICATED

ATTENTION_IMPLS = ("auto", "xla", "pallas")
ALLOCATION_IMPLS = ("auto", "reference", "pallas")


@dataclasses.dataclass(frozen=True)
class Impl:
    attention: str = "auto"
    allocation: str = "auto"
    mesh: Mesh | None = None

    def __post_init__(self):
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.allocation not in ALLOCATION_IMPLS:
            raise ValueError(f"allocation impl must be one of {ALLOCATION_IMPLS}, got {self.allocation!r}")

    def attention_kernel(self):
        kernel = functools.partial(ragged_paged_attention, impl=self.attention)
        return kernel if self.mesh is None else shard_attention_kernel(kernel, self.mesh)

    def resolved_allocation(self) -> str:
        if self.allocation != "auto":
            return self.allocation
        return "pallas" if jax.default_backend() == "gpu" else "reference"

    def allocate(self, joint_prob, ceilings, active, capacity):
        """i32[B] query lengths by the device prefix allocation rule."""
        if self.resolved_allocation() == "pallas":
            return prefix_allocation(joint_prob, ceilings, active, capacity)
        return prefix_allocation_reference(joint_prob, ceilings, active, capacity)


DEFAULT_IMPL = Impl()


_HEADS = PartitionSpec(None, AXIS)  # q and the output: [T, heads, head_dim]


def shard_attention_kernel(kernel, mesh: Mesh):
    """The ragged paged attention kernel on each tensor-parallel shard's own heads.

    Query heads and KV pages are split by head along the mesh's `tp` axis and the row metadata
    is replicated, so each device runs the unchanged kernel on [T, heads/N, head_dim] queries
    over [layers, kv_heads/N, ...] pages; no collective is needed, since shard i's query heads
    read only its KV heads. `layer` is a Python int closed over, as on one device.
    """

    def sharded(q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens, *, sm_scale, layer):
        def local(q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens):
            return kernel(
                q,
                k_pages,
                v_pages,
                page_tables,
                context_lens,
                query_starts,
                query_lens,
                sm_scale=sm_scale,
                layer=layer,
            )

        rows = (REPLICATED,) * 4
        # check_vma=False: the Pallas call has no replication rule; outputs are per-shard heads.
        return jax.shard_map(
            local, mesh=mesh, in_specs=(_HEADS, KV_PAGES, KV_PAGES, *rows), out_specs=_HEADS, check_vma=False
        )(q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens)

    return sharded
