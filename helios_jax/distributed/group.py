"""The process group: `jax.distributed.initialize` from absl flags.

One process (`--num_processes=1`, the default) initializes nothing: the single-process engine
runs exactly as without these flags. With N > 1 processes every process calls
`jax.distributed.initialize(coordinator_address, N, process_id)` before JAX starts a backend;
on a CPU the cross-process collectives are gloo's (`jax_cpu_collectives_implementation`), so
the multi-process path runs (and is tested) without accelerators. Afterwards `jax.devices()`
lists every process's devices, and the `tp` mesh (`model.sharding.tensor_parallel_mesh`) spans
them: process 0's first device is rank zero.
"""

from __future__ import annotations

import dataclasses

import jax
from absl import flags

from helios_jax.distributed.channel import FrameChannel

_GROUP: Group | None = None
HEARTBEAT_TIMEOUT_SECONDS = 100  # jax.distributed.initialize's default


@dataclasses.dataclass(frozen=True)
class Group:
    process_id: int
    num_processes: int
    channel: FrameChannel

    @property
    def leader(self) -> bool:
        return self.process_id == 0


def define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string(
        "coordinator_address",
        None,
        "host:port of process 0's coordination service (several processes only)",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "num_processes", 1, "processes serving one model together", lower_bound=1, flag_values=fv
    )
    flags.DEFINE_integer(
        "process_id", 0, "this process's rank: 0 serves HTTP and schedules", lower_bound=0, flag_values=fv
    )
    flags.DEFINE_integer(
        "heartbeat_timeout_seconds",
        HEARTBEAT_TIMEOUT_SECONDS,
        "seconds without a member's heartbeat after which JAX's coordination service ends the whole "
        "group (several processes only)",
        lower_bound=1,
        flag_values=fv,
    )


def initialize(
    coordinator_address: str | None,
    num_processes: int,
    process_id: int,
    heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_SECONDS,
) -> Group | None:
    """Joins the group (`jax.distributed.initialize`); None, and nothing done, for one process.

    A member that dies (or hangs without heartbeats) for `heartbeat_timeout_seconds` makes JAX's
    coordination service terminate every other member, process 0 included: the group ends as a
    whole and restarts as a whole, instead of process 0 waiting out frames a follower never runs.

    Raises:
      ValueError: several processes without a coordinator, or a process id out of range.
    """
    global _GROUP
    if num_processes == 1:
        return None
    if not coordinator_address:
        raise ValueError("--num_processes > 1 needs --coordinator_address (host:port of process 0)")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"--process_id={process_id} is not in [0, {num_processes})")
    # The CPU backend's cross-process collectives; accelerators use their own (NCCL on GPUs).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds
    )
    _GROUP = Group(process_id, num_processes, FrameChannel.connect(process_id, num_processes))
    return _GROUP


def initialize_from_flags(fv: flags.FlagValues) -> Group | None:
    return initialize(fv.coordinator_address, fv.num_processes, fv.process_id, fv.heartbeat_timeout_seconds)


def current() -> Group | None:
    """The group this process joined; None in a single process."""
    return _GROUP


def lead_if_leader(programs):
    """On process 0 of a group, `programs` driving the followers (`leader.lead`); else as is."""
    if _GROUP is None or not _GROUP.leader:
        return programs
    from helios_jax.distributed.leader import lead

    return lead(programs, _GROUP.channel)
