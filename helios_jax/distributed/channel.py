"""Frames and digests through the coordination service's key-value store.

Process 0 publishes each frame (an `init` of the device state, a `run` of one prepared program
with its packed host inputs, or `stop`) under `helios/frame/<seq>`; every follower reads the
frames in sequence order with a blocking get, executes them and answers under
`helios/digest/<seq>/<process>` with a digest of what it committed. The leader reads those
answers when the frame completes, then deletes the frame's keys.

Why the key-value store and not `multihost_utils.broadcast_one_to_all`: a broadcast is a
device collective that every process must enter with arrays of a shape it already knows, and
it compiles a program per shape. A follower does not know the next frame's program (hence its
input shapes) until it has the plan; the store carries a few kilobytes of bytes per frame over
the coordinator's gRPC channel, needs no compilation, and never occupies the devices, which
are busy with the previous frame. It is JAX's own runtime (`jax.distributed`'s client), the
same service that exchanged the device topology at start-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

# A follower waits this long for the next frame (an idle server publishes none) and the leader
# this long for a follower's digest (a follower executes the same program at the same time).
IDLE_TIMEOUT_MS = 7 * 24 * 3600 * 1000
DIGEST_TIMEOUT_MS = 300 * 1000


@dataclasses.dataclass
class FrameChannel:
    client: Any  # jax._src.distributed.global_state.client (a DistributedRuntimeClient)
    process_id: int
    num_processes: int

    @classmethod
    def connect(cls, process_id: int, num_processes: int) -> FrameChannel:
        from jax._src import distributed

        if distributed.global_state.client is None:
            raise RuntimeError("jax.distributed is not initialized")
        return cls(distributed.global_state.client, process_id, num_processes)

    def publish(self, seq: int, payload: bytes) -> None:
        self.client.key_value_set_bytes(f"helios/frame/{seq}", payload)

    def receive(self, seq: int, timeout_ms: int = IDLE_TIMEOUT_MS) -> bytes:
        return self.client.blocking_key_value_get_bytes(f"helios/frame/{seq}", timeout_ms)

    def answer(self, seq: int, digest: str) -> None:
        self.client.key_value_set(f"helios/digest/{seq}/{self.process_id}", digest)

    def answers(self, seq: int, timeout_ms: int = DIGEST_TIMEOUT_MS) -> dict[int, str]:
        """Every follower's digest of frame `seq`, by process id (blocks until all answered)."""
        return {
            p: self.client.blocking_key_value_get(f"helios/digest/{seq}/{p}", timeout_ms)
            for p in range(1, self.num_processes)
        }

    def forget(self, seq: int) -> None:
        self.client.key_value_delete(f"helios/frame/{seq}")
        for p in range(1, self.num_processes):
            self.client.key_value_delete(f"helios/digest/{seq}/{p}")


def committed_digest(outputs) -> str:
    """SHA-256 of what a frame commits: per lane its emitted tokens (`tokens[b, :counts[b]]`),
    the counts and, where the program has them, the query lengths (its consumption). Programs
    that emit nothing (state copies, `init`) digest to the same constant on every rank."""
    h = hashlib.sha256()
    tokens = getattr(outputs, "tokens", None)
    if tokens is None:
        return "nothing"
    counts = np.asarray(outputs.counts).astype(np.int64)
    rows = np.asarray(tokens).reshape(counts.shape[0], -1).astype(np.int64)
    h.update(counts.tobytes())
    for row, n in zip(rows, counts):
        h.update(row[:n].tobytes())
    query = getattr(outputs, "query_lengths", None)
    if query is not None:
        h.update(np.asarray(query).astype(np.int64).tobytes())
    return h.hexdigest()
