"""Deliberately naive oracles (helios_jax.reference): exhaustive enumerations and numpy references."""
