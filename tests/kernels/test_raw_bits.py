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
