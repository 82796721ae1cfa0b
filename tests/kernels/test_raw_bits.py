"""Gathers and scatters of narrow floats as raw bits equal the plain ones, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.kernels.raw_bits import narrow_float, scatter_set, take


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_take_and_scatter_set_equal_the_plain_operations(dtype):
    rng = np.random.default_rng(0)
    pool = jnp.asarray(rng.normal(size=(2, 6, 4, 3)), dtype)
    pool = pool.at[0, 1, 2, 0].set(jnp.nan).at[1, 5, 0, 1].set(-0.0)  # NaN and -0 survive as bits
    rows = jnp.asarray([4, 1, 6, 0])  # 6 is past the end: dropped by the scatter
    values = jnp.asarray(rng.normal(size=(2, 4, 4, 3)), jnp.float32)  # cast to the pool's dtype

    def bits(x):
        return np.asarray(x).view(np.uint8)

    index = (slice(None), rows)
    want = pool.at[index].set(values.astype(dtype), mode="drop")
    got = jax.jit(lambda p, v: scatter_set(p, index, v))(pool, values)
    assert got.dtype == pool.dtype
    np.testing.assert_array_equal(bits(got), bits(want))

    gather = jnp.asarray([[3, 0], [5, 5]])
    np.testing.assert_array_equal(bits(jax.jit(lambda p: take(p, gather))(pool[0])), bits(pool[0][gather]))
    assert narrow_float(dtype) == (jnp.dtype(dtype).itemsize < 4)
    assert not narrow_float(jnp.int16)


def test_off_a_cpu_pools_keep_their_dtype_and_the_plain_operations(monkeypatch):
    """A GPU scatters and gathers bf16 natively: no pool is stored as bits there and the moves
    are the plain operations (a bit cast of a whole pool could cost a copy there too)."""
    import helios_jax.kernels.raw_bits as raw_bits

    monkeypatch.setattr(raw_bits.jax, "default_backend", lambda: "gpu")
    pool = jnp.zeros((3, 4), jnp.bfloat16)
    assert raw_bits.storage(pool).dtype == jnp.bfloat16
    text = (
        jax.jit(lambda p: raw_bits.scatter_set(p, (jnp.asarray([1]),), jnp.ones((1, 4))))
        .lower(pool)
        .as_text()
    )
    assert "bitcast" not in text
    text = jax.jit(lambda p: raw_bits.take(p, jnp.asarray([2, 0]))).lower(pool).as_text()
    assert "bitcast" not in text
