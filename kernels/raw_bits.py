"""16-bit float KV pools moved, and on a CPU stored, as their raw bits.

XLA's CPU compiler has no bfloat16 (or float16) gather or scatter: it converts the whole operand
to float32 and back around the operation. For a KV pool that is every layer's cache, several times
per step; in a loop over key blocks the conversion is loop-invariant and hoisted, so a step that
reads three pages converts all of them. Gathers and scatters only move elements, so doing them on
the same-width unsigned integers gives identical results.

A bit cast of a whole pool is not free on that compiler either (it emits a copy), so on a CPU
backend a narrow-float pool is *stored* as its bits (`stores_bits`, `storage`): the cache's
arrays are uint16 and the readers name the float dtype they want (`take(pool, index, dtype)`, the
model's dtype). Elsewhere (a GPU) pools keep their float dtype and these functions are the plain
gather and scatter: nothing there is cast. Every function accepts either form of a pool.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def narrow_float(dtype) -> bool:
    """Whether `dtype` is a float narrower than 32 bits (moved as bits)."""
    dtype = jnp.dtype(dtype)
    return bool(jnp.issubdtype(dtype, jnp.floating)) and dtype.itemsize < 4


def stores_bits(dtype) -> bool:
    """Whether a KV pool of float `dtype` is stored (and moved) as its bits: narrow floats on a
    CPU backend."""
    return narrow_float(dtype) and jax.default_backend() == "cpu"


def bits_dtype(dtype):
    """The unsigned integer dtype of `dtype`'s width (a narrow float's storage)."""
    return jnp.dtype(f"uint{8 * jnp.dtype(dtype).itemsize}")


def _is_bits(x: jax.Array) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.unsignedinteger))


def to_bits(x: jax.Array) -> jax.Array:
    """`x` as unsigned integers of its width when it is a narrow float, else `x`."""
    if not narrow_float(x.dtype):
        return x
    return jax.lax.bitcast_convert_type(x, bits_dtype(x.dtype))


def from_bits(x: jax.Array, dtype) -> jax.Array:
    """The inverse of :func:`to_bits`: `x` read as `dtype` (unchanged when already `dtype`)."""
    return x if x.dtype == jnp.dtype(dtype) else jax.lax.bitcast_convert_type(x, dtype)


def storage(pool: jax.Array) -> jax.Array:
    """A float pool in the form this backend stores it (`stores_bits`)."""
    return to_bits(pool) if stores_bits(pool.dtype) else pool


def as_float(pool: jax.Array, dtype) -> jax.Array:
    """The pool as floats: a stored-bits pool read as `dtype`, a float pool unchanged."""
    return from_bits(pool, dtype) if _is_bits(pool) else pool


def take(pool: jax.Array, index, dtype=None) -> jax.Array:
    """`pool[index]` as floats; a CPU gathers a narrow-float pool as bits.

    `dtype` is the float dtype of a stored-bits pool (a float pool keeps its own)."""
    if not _is_bits(pool):
        # A float pool: on a CPU a narrow one is gathered as bits, elsewhere natively.
        return from_bits(to_bits(pool)[index], pool.dtype) if stores_bits(pool.dtype) else pool[index]
    if dtype is None:
        raise ValueError(f"a pool stored as bits ({pool.dtype}) needs the float dtype to read")
    return from_bits(pool[index], dtype)


def scatter_set(pool: jax.Array, index, values: jax.Array) -> jax.Array:
    """`pool.at[index].set(values, mode="drop")`, as bits on a CPU; in place when `pool` is donated.

    A float pool casts `values` to its dtype; a stored-bits pool takes narrow-float `values` of
    its width (the model's dtype), or bits read from a pool like it, bit for bit."""
    if _is_bits(pool):
        if values.dtype != pool.dtype and (
            not narrow_float(values.dtype) or values.dtype.itemsize != pool.dtype.itemsize
        ):
            width = 8 * pool.dtype.itemsize
            raise ValueError(f"a {pool.dtype} pool stores {width}-bit floats, got {values.dtype}")
        return pool.at[index].set(to_bits(values), mode="drop")
    values = values.astype(pool.dtype)
    if not stores_bits(pool.dtype):  # float32, or a GPU, which scatters 16-bit floats natively
        return pool.at[index].set(values, mode="drop")
    raw = to_bits(pool).at[index].set(to_bits(values), mode="drop")  # a float pool on a CPU
    return from_bits(raw, pool.dtype)
