"""Process 0 of a group: plans, commits, and runs every program over the global mesh.

`lead(programs, group)` turns a `ProgramSet` built over the global `tp` mesh into one whose
every call first publishes the frame (`channel.py`) and then runs it, so that each follower
executes the same prepared program on the same packed inputs at the same time (the collectives
of a program over several processes complete only when every process has entered it):

- `init_state()` publishes `init`: every process allocates its share of a fresh state (the
  engine's start, its warm-up, and the fresh state after a failed program);
- a program call publishes `run` with the program's key and its inputs as host arrays, makes
  each input a replicated global array from this process's copy
  (`jax.make_array_from_callback`: no cross-process transfer, every process holds the same
  bytes) and calls the compiled program; the replicated outputs come back as this process's
  first shard, the mesh's first device: rank zero's outputs, which drive every host decision;
- `check(outputs)`, which the executor calls once the frame is observed complete, compares
  the digest of rank zero's committed tokens with every follower's and raises
  `RanksDisagree` on any difference (the engine then fails the frame's requests and serves on
  a fresh state, which `init` gives every process).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helios_jax.distributed.channel import FrameChannel, committed_digest
from helios_jax.programs.program_set import Program, ProgramSet

log = logging.getLogger(__name__)
_LEADER: Leader | None = None  # the last `lead`'s, which `stop_followers` stops


class RanksDisagree(RuntimeError):
    """A follower committed different tokens than rank zero (or failed to run the frame)."""


def global_inputs(mesh: Mesh, host):
    """Host arrays -> replicated arrays over the whole (multi-process) mesh, each process
    supplying its own devices' copies."""
    sharding = NamedSharding(mesh, PartitionSpec())

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree_util.tree_map(one, host)


def local_outputs(outputs):
    """Replicated global outputs -> this process's first copy (on process 0: rank zero's)."""

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_shards[0].data
        return x

    return jax.tree_util.tree_map(one, outputs)


@dataclasses.dataclass
class Leader:
    channel: FrameChannel
    mesh: Mesh
    seq: int = 0
    pending: dict = dataclasses.field(default_factory=dict)  # id(local outputs) -> frame seq

    def send(self, message: tuple) -> int:
        seq, self.seq = self.seq, self.seq + 1
        self.channel.publish(seq, pickle.dumps(message))
        return seq

    def run(self, program: Program, params, state, inputs):
        host = jax.tree_util.tree_map(np.asarray, inputs)
        seq = self.send(("run", program.key, host))
        state, outputs = Program.__call__(program, params, state, global_inputs(self.mesh, host))
        outputs = local_outputs(outputs)
        self.pending[id(outputs)] = seq
        return state, outputs

    def check(self, outputs) -> None:
        """Raises RanksDisagree unless every follower committed what rank zero did."""
        seq = self.pending.pop(id(outputs), None)
        if seq is not None:
            self.verify(seq, committed_digest(outputs))

    def verify(self, seq: int, want: str) -> None:
        answers = self.channel.answers(seq)
        self.channel.forget(seq)
        wrong = {p: have for p, have in answers.items() if have != want}
        if wrong:
            log.error("frame %d: ranks disagree: rank zero %s, others %s", seq, want, wrong)
            errors = "".join(f"; process {p}: {a}" for p, a in wrong.items() if a.startswith("error"))
            raise RanksDisagree(
                f"frame {seq}: processes {sorted(wrong)} committed other tokens than rank zero{errors}"
            )

    def stop(self) -> None:
        self.send(("stop",))


@dataclasses.dataclass
class LeaderProgram(Program):
    leader: Any = None

    def __call__(self, params, state, inputs):
        return self.leader.run(self, params, state, inputs)

    def check(self, outputs) -> None:
        self.leader.check(outputs)


@dataclasses.dataclass
class LeaderProgramSet(ProgramSet):
    leader: Any = None

    def init_state(self, *, fill: float = 0.0):
        """A fresh state on every process: returns once every follower has allocated its own."""
        seq = self.leader.send(("init", fill))
        state = super().init_state(fill=fill)
        self.leader.verify(seq, "init")
        return state


def lead(programs: ProgramSet, channel: FrameChannel) -> LeaderProgramSet:
    """`programs` (built over the group's global mesh) driving the followers (module docs)."""
    if programs.mesh is None:
        raise ValueError("several processes need --tensor_parallel over every process's devices")
    global _LEADER
    leader = _LEADER = Leader(channel, programs.mesh)
    wrapped = {
        key: LeaderProgram(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, leader=leader)
        for key, p in programs.items()
    }
    fields = {f.name: getattr(programs, f.name) for f in dataclasses.fields(programs)}
    return LeaderProgramSet(**{**fields, "programs": wrapped}, leader=leader)


def stop_followers() -> None:
    """Publishes `stop`: every follower returns from `follow` (process 0's server has ended)."""
    if _LEADER is not None:
        _LEADER.stop()
