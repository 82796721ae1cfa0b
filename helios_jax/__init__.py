"""helios_jax: prepared-graph LLM serving in JAX.

A host scheduler (``helios_jax.scheduler``, pure Python and numpy) selects among ahead-of-time
compiled programs (``helios_jax.programs``) by expected useful value per execution time. The
normative design is ``docs/spec/scheduling-runtime-design.md``.
"""

__version__ = "0.1.0"
