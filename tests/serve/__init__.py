"""Tests of the HTTP layer (helios_jax.serve) against the deterministic fake engine."""
