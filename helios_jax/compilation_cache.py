"""The persistent compilation cache: the one set-up every program that compiles shares
(``python -m helios_jax.prepare``, ``python -m helios_jax.serve``'s real engine, the benchmarks).

Restarts reuse compiled programs: XLA executables are kept on disk keyed by the computation, so a
second start of the same catalog skips compilation. Every executable is cached, however quickly it
compiled (the minimum compile time is zero): most of a small catalog's programs compile in under
the default second and would otherwise be rebuilt on every start.
"""

from __future__ import annotations

import os

DEFAULT_COMPILATION_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "helios_jax", "xla")


def enable_compilation_cache(directory: str | None = None) -> str | None:
    """Use `directory` as the persistent compilation cache and return it.

    Args:
      directory: the cache folder; ``None`` means ``$JAX_COMPILATION_CACHE_DIR`` or
        `DEFAULT_COMPILATION_CACHE_DIR`; an empty string disables the cache (cold compiles).

    Returns:
      The folder in use, or ``None`` when the cache is disabled.
    """
    import jax  # here, so that importing the default folder (benchmark flags) stays cheap

    if directory == "":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    directory = directory or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_COMPILATION_CACHE_DIR
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory
