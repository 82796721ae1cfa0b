"""Moving 16-bit floats as their raw bits, where a CPU compiler would otherwise widen them.

XLA's CPU compiler has no bfloat16 (or float16) gather or scatter: it converts the whole operand
to float32 and back around the operation. For a KV pool that is every layer's cache, several times
per step; in a loop over key blocks the conversion is loop-invariant and hoisted, so a step that
reads three pages converts all of them. Gathers and scatters only move elements, so doing them on
the same-width unsigned integers gives identical results and leaves the pool in its dtype. A GPU
handles either dtype natively; there the bit casts are free.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def narrow_float(dtype) -> bool:
    """Whether `dtype` is a float narrower than 32 bits (moved as bits)."""
    dtype = jnp.dtype(dtype)
    return bool(jnp.issubdtype(dtype, jnp.floating)) and dtype.itemsize < 4


def to_bits(x: jax.Array) -> jax.Array:
    """`x` as unsigned integers of its width when it is a narrow float, else `x`."""
    if not narrow_float(x.dtype):
        return x
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def from_bits(x: jax.Array, dtype) -> jax.Array:
    """The inverse of :func:`to_bits` for an array of `dtype`."""
    return x if x.dtype == jnp.dtype(dtype) else jax.lax.bitcast_convert_type(x, dtype)


def take(pool: jax.Array, index) -> jax.Array:
    """`pool[index]`, gathered as bits when `pool` is a narrow float."""
    return from_bits(to_bits(pool)[index], pool.dtype)


def scatter_set(pool: jax.Array, index, values: jax.Array) -> jax.Array:
    """`pool.at[index].set(values, mode="drop")` (values cast to the pool's dtype), scattered as
    bits when `pool` is a narrow float; in place when `pool` is donated."""
    values = values.astype(pool.dtype)
    raw = to_bits(pool).at[index].set(to_bits(values), mode="drop")
    return from_bits(raw, pool.dtype)
