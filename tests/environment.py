"""The environment the suite's subprocesses start with.

They keep the suite's XLA flags (`conftest.py`: the optimisation level its compiles use) but not
a forced host device count: each subprocess that needs several CPU devices (tensor-parallel and
multi-process checks) sets its own count before JAX starts, and the others run on one.
"""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def xla_flags(devices: int = 1) -> str:
    """This process's XLA_FLAGS without any forced device count, plus `devices` CPU devices when
    above one."""
    flags = " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)
    )
    return f"{flags} {DEVICE_COUNT_FLAG}={devices}".strip() if devices > 1 else flags


def subprocess_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """os.environ with `xla_flags(devices)`, and `extra`."""
    return dict(os.environ, **extra, XLA_FLAGS=xla_flags(devices))
