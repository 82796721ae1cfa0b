"""Pallas kernels, each beside its jitted entry and a pure-jnp reference (helios_jax.kernels)."""
