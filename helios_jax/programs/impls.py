"""The one place that picks kernel implementations for the programs.

- Ragged paged attention: `helios_jax.kernels.ragged_paged_attention` with impl="auto" (its own
  `select_impl` resolves Pallas on a GPU when the shapes allow, XLA otherwise). The model's
  packed forwards use it when given `attention=None`; programs pass `attention_kernel()`.
- Speculative prefix allocation: the Pallas kernel on a GPU, its pure-jnp reference
  (`prefix_allocation_reference`, the XLA path) elsewhere. Both follow the same rule and agree
  on the shared golden cases (tests/kernels).

`Impl` is frozen and hashable; builders take it so tests can force a path.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from helios_jax.kernels.prefix_allocation import prefix_allocation, prefix_allocation_reference
from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention

ATTENTION_IMPLS = ("auto", "xla", "pallas")
ALLOCATION_IMPLS = ("auto", "reference", "pallas")


@dataclasses.dataclass(frozen=True)
class Impl:
    attention: str = "auto"
    allocation: str = "auto"

    def __post_init__(self):
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.allocation not in ALLOCATION_IMPLS:
            raise ValueError(f"allocation impl must be one of {ALLOCATION_IMPLS}, got {self.allocation!r}")

    def attention_kernel(self):
        return functools.partial(ragged_paged_attention, impl=self.attention)

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
