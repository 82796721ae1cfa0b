"""Conformance: the spec's rule catalog, its traceability to tests, and the conformance command.

``python -m helios_jax.conformance`` runs the scheduler conformance checks (and, where a model is
available, the numerical ones) against a measured catalog; ``python -m
helios_jax.conformance.trace`` regenerates docs/conformance.md from the tests' rule markers.
"""
