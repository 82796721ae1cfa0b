"""`cpu_threads.limit_compute_threads`: the CPU backend's pool size, and every thread's cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from helios_jax import cpu_threads
from tests.environment import subprocess_env

# In a fresh interpreter: limit (or not), run a product, report the pool and every thread's cores.
PROBE = """
import json, os, sys
from helios_jax import cpu_threads
limit = int(sys.argv[1])
returned = cpu_threads.limit_compute_threads(limit)
import jax.numpy as jnp
(jnp.ones((256, 256)) @ jnp.ones((256, 256))).block_until_ready()
cores = {sorted(os.sched_getaffinity(int(t))).__repr__() for t in os.listdir("/proc/self/task")}
print(json.dumps(dict(returned=returned, pool=cpu_threads.compute_pool_threads(), cores=sorted(cores))))
"""


def _probe(limit: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity calls")


@needs_affinity
def test_one_compute_thread_and_every_thread_back_on_every_core():
    allowed = repr(sorted(os.sched_getaffinity(0)))
    limited = _probe(1)
    assert limited["returned"] == 1 and limited["pool"] == 1
    assert limited["cores"] == [allowed]  # the narrowing was undone for every thread, the pool's too
    if len(os.sched_getaffinity(0)) > 1:  # without the limit the pool takes every core
        assert _probe(0)["pool"] == len(os.sched_getaffinity(0))


@needs_affinity
def test_bad_counts_and_a_late_call_are_refused():
    assert cpu_threads.limit_compute_threads(0) == 0  # the default: nothing changes
    with pytest.raises(ValueError, match=">= 0"):
        cpu_threads.limit_compute_threads(-1)
    with pytest.raises(ValueError, match="may use"):
        cpu_threads.limit_compute_threads(len(os.sched_getaffinity(0)) + 1)
    jax.devices()  # this process's backend exists: its pool is sized already
    with pytest.raises(RuntimeError, match="before any JAX backend"):
        cpu_threads.limit_compute_threads(1)
