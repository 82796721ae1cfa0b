"""OpenAI-compatible HTTP server (``python -m helios_jax.serve``)."""
