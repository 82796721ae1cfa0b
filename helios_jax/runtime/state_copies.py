"""Snapshot and restore frames in serving: checkpoint lanes -> the copy program's inputs.

The scheduler's checkpoint store (``scheduler/checkpoints.py``) numbers its rows 0..S-1; row j is
device state row ``request_slots + j`` and owns the fixed pages ``EngineConfig.snapshot_pages(j)``
(`pages_per_row` of them, so a checkpoint of any length up to the context fits). A checkpoint of
L tokens occupies the first ceil(L / page_size) of them; the copy moves whole pages, so the
partial last page travels intact.

- **snapshot** (a capture at a prompt endpoint, or a terminal capture): the request slot's first
  ceil(L / page_size) pages -> the row's pages, and the slot's per-row state -> the snapshot row,
  with the cursor set to exactly L (the checkpoint holds the prefix of L tokens; a queued frame
  may have advanced the slot past it, and positions past the cursor never count);
- **restore** (a prompt that extends a stored checkpoint): the row's pages -> the first pages of
  the request's own reservation, cursor L, and the request's own sampling settings and seed
  (`load_settings`): the prefix is shared, the owner's sampling is not. The rest of the prompt
  is then prefilled from position L.

Worked example (page_size 16, L = 37): three pages; snapshot row 2 of a 4-slot engine is state
row 6 with pages ``request_pages + 2 * pages_per_row + (0, 1, 2)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.scheduler.checkpoints import CheckpointStore
from helios_jax.scheduler.plan import ScheduledPlan
from helios_jax.scheduler.view import LaneRole


@dataclasses.dataclass(frozen=True)
class CopyLane:
    """One lane of a snapshot or restore, in device terms."""

    src_row: int
    dst_row: int
    src_pages: tuple[int, ...]
    dst_pages: tuple[int, ...]
    tokens: int  # the checkpoint's length L: the destination's cursor
    settings: tuple | None = None  # restore: the request's own sampling (packing's Settings)


class StateCopies:
    """Packs a plan's snapshot and restore lanes for one engine's device geometry.

    Args:
      config: the engine's capacities (request slots, page geometry, snapshot rows).
      store: the scheduler's checkpoint rows (an armed or stored row's prefix gives its length).
    """

    def __init__(self, config: EngineConfig, store: CheckpointStore):
        self.config = config
        self.store = store

    def lanes(self, plan: ScheduledPlan, info: Mapping) -> list[CopyLane]:
        """The device copies of `plan`'s lanes (``info``: request id -> ``RequestInputs``)."""
        restore = plan.graph.kind is GraphKind.RESTORE
        out = []
        for lane in plan.lanes:
            if lane.snapshot_row is None or lane.role not in (LaneRole.PREREQUISITE, LaneRole.TERMINAL):
                raise ValueError(f"{plan.graph.name}: lane {lane.handle} names no checkpoint row")
            row = lane.snapshot_row
            tokens = self.store.entries[row].length
            n = -(-tokens // self.config.page_size)
            held = tuple(self.config.snapshot_pages(row)[:n])
            request = info[lane.handle.rid]
            own = tuple(request.page_table[:n])
            if len(own) < n:
                raise ValueError(f"{lane.handle} reserves {len(own)} pages, the checkpoint needs {n}")
            state_row = self.config.request_slots + row
            if restore:
                settings = (
                    request.temperature,
                    request.top_p,
                    request.top_k,
                    request.seed,
                    request.coupled,
                    request.logprobs,
                    request.processors,
                )
                out.append(CopyLane(state_row, lane.slot, held, own, tokens, settings))
            else:
                out.append(CopyLane(lane.slot, state_row, own, held, tokens))
        return out

    def pack(self, program, plan: ScheduledPlan, info: Mapping):
        """The copy program's inputs for `plan` (``programs.packing.pack_copy`` validates)."""
        lanes = self.lanes(plan, info)
        return program.pack(
            src_rows=[c.src_row for c in lanes],
            dst_rows=[c.dst_row for c in lanes],
            src_pages=[c.src_pages for c in lanes],
            dst_pages=[c.dst_pages for c in lanes],
            cursors=[c.tokens for c in lanes],
            settings=[c.settings for c in lanes],
        )


@dataclasses.dataclass
class CheckpointStats:
    """Counters of checkpoint work the engine completed (rendered by ``serve.metrics``)."""

    snapshots: dict[str, int] = dataclasses.field(default_factory=dict)  # by role: anchor, extra, terminal
    restores: int = 0
    restored_tokens: int = 0  # prompt tokens a restore supplied instead of a prefill
    preemptions: int = 0
    continuations: int = 0  # preempted requests resumed (restoring their state or recomputing it)

    def observe(self, plan: ScheduledPlan, store: CheckpointStore) -> None:
        """A completed frame, before the scheduler's completion changes `store`: its restores and
        snapshots (other programs change nothing)."""
        kind = plan.graph.kind
        if kind not in (GraphKind.SNAPSHOT, GraphKind.RESTORE):
            return
        for lane in plan.lanes:
            checkpoint = store.entries.get(lane.snapshot_row) if lane.snapshot_row is not None else None
            if checkpoint is None:
                continue
            if kind is GraphKind.RESTORE:
                self.restores += 1
                self.restored_tokens += checkpoint.length
            else:
                role = checkpoint.role.name.lower()
                self.snapshots[role] = self.snapshots.get(role, 0) + 1


def forget_stored(store: CheckpointStore) -> int:
    """A rebuilt device state holds no checkpoint: drop every stored row no request still pins
    (the failed requests' armed and restoring rows return when their frames complete empty).
    Returns how many rows were dropped."""
    stale = [row for row, cp in store.entries.items() if cp.ready and cp.pins <= 0]
    for row in stale:
        store.drop(row)
    return len(stale)
