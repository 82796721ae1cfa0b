"""The environment the suite's subprocesses start with.

They keep the suite's XLA flags (`conftest.py`: the optimisation level its compiles use) but not
a forced host device count: each subprocess that needs several CPU devices (tensor-parallel and
multi-process checks) sets its own count before JAX starts, and the others run on one.
"""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def without_device_count(flags: str) -> str:
    return " ".join(f for f in flags.split() if not f.startswith(DEVICE_COUNT_FLAG))


def subprocess_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """os.environ with XLA_FLAGS stripped of any device count, plus `devices` CPU devices when
    above one, and `extra`."""
    env = dict(os.environ, **extra)
    flags = without_device_count(env.get("XLA_FLAGS", ""))
    if devices > 1:
        flags = f"{flags} {DEVICE_COUNT_FLAG}={devices}".strip()
    env["XLA_FLAGS"] = flags
    return env
