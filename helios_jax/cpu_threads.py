"""How many cores the CPU backend's compute threads take (``--cpu_compute_threads``).

On a CPU backend the "device" is the same cores the engine's host loop runs on. XLA's CPU
client sizes its intra-op thread pool (the threads named ``tf_XLAEigen``) from the process's CPU
affinity when the backend is first initialised, one thread per allowed core, and JAX offers no
option for it (jax-ml/jax#1539: the affinity mask is the way). With every core in the pool, a
program's threads and the host loop that plans, packs and completes the next frames contend for
the same cores: the host's work slows the program beside it and the program's threads slow the
host. Serving engines on CPUs reserve cores for the serving loop for this reason (vLLM's CPU
backend binds its compute threads with ``VLLM_CPU_OMP_THREADS_BIND``).

:func:`limit_compute_threads` initialises the CPU backend with the calling thread's affinity
narrowed to the first `n` allowed cores, then widens every thread of the process back to the
allowed set: the pool keeps `n` threads, and the scheduler's loop, the readers and the pool all
run on any core. It must run before anything initialises a JAX backend. Zero (the default
everywhere) leaves the pool at one thread per core.
"""

from __future__ import annotations

import os

POOL_THREAD_NAME = "tf_XLAEigen"  # XLA's CPU intra-op pool (tsl's Eigen thread pool)


def compute_pool_threads() -> int:
    """Threads of the CPU backend's intra-op pool now running in this process (Linux)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == POOL_THREAD_NAME
        except OSError:  # the thread ended while listed
            continue
    return count


def limit_compute_threads(n: int) -> int:
    """Initialise the CPU backend with `n` compute threads (0: one per allowed core, unchanged).

    Returns the pool's threads after initialisation. Raises ValueError for a negative `n` or one
    above the allowed cores, and RuntimeError when a JAX backend is already initialised (its pool
    is sized already) or the platform has no CPU affinity calls.
    """
    if n < 0:
        raise ValueError(f"--cpu_compute_threads must be >= 0, got {n}")
    if n == 0:
        return 0
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError("--cpu_compute_threads needs os.sched_setaffinity (Linux)")
    allowed = sorted(os.sched_getaffinity(0))
    if n > len(allowed):
        raise ValueError(f"--cpu_compute_threads={n}, but this process may use {len(allowed)} cores")
    from jax._src import xla_bridge  # JAX's own check; no public one exists

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("--cpu_compute_threads must be applied before any JAX backend is initialised")
    import jax

    os.sched_setaffinity(0, allowed[:n])
    try:
        jax.devices("cpu")  # the CPU client and its pool, sized from the narrowed mask
    finally:
        for tid in os.listdir("/proc/self/task"):  # every thread, the pool's included
            try:
                os.sched_setaffinity(int(tid), allowed)
            except OSError:  # the thread ended while listed
                continue
    return compute_pool_threads()
