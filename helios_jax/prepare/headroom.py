"""Capture headroom: what a prepared engine occupies on the device (step 4 of `prepare`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from helios_jax.programs import Program, ProgramSet, state_bytes


@dataclasses.dataclass(frozen=True)
class Headroom:
    """What the prepared engine occupies on the device."""

    params_bytes: int
    kv_pool_bytes: int
    row_state_bytes: int
    workspace_bytes: int  # the largest compiled program's temporary buffers (0 when unknown)
    max_packed_extent: int  # the most target tokens one program packs
    largest_workspace_program: str

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.kv_pool_bytes + self.row_state_bytes + self.workspace_bytes

    def lines(self) -> list[str]:
        mib = 1 / 2**20
        return [
            f"params        {self.params_bytes * mib:10.2f} MiB",
            f"kv pool       {self.kv_pool_bytes * mib:10.2f} MiB",
            f"row state     {self.row_state_bytes * mib:10.2f} MiB",
            f"workspace     {self.workspace_bytes * mib:10.2f} MiB  ({self.largest_workspace_program})",
            f"total         {self.total_bytes * mib:10.2f} MiB",
            f"max packed token extent {self.max_packed_extent}",
        ]


def _workspace_bytes(program: Program) -> int:
    try:
        analysis = program.compiled.memory_analysis()
        return int(getattr(analysis, "temp_size_in_bytes", 0) or 0)
    except Exception:  # noqa: BLE001 - some backends do not report memory analysis
        return 0


def capture_headroom(programs: ProgramSet, params) -> Headroom:
    """Bytes and extents of a compiled program set (workspace needs compiled programs)."""
    sizes = state_bytes(programs.state_spec)
    params_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(params))
    workspaces = {p.name: _workspace_bytes(p) for p in programs.values() if p.compiled is not None}
    largest = max(workspaces, key=workspaces.get, default="none")
    return Headroom(
        params_bytes=int(params_bytes),
        kv_pool_bytes=sizes["kv_pool"],
        row_state_bytes=sizes["row_state"],
        workspace_bytes=workspaces.get(largest, 0),
        max_packed_extent=programs.catalog.max_packed_extent,
        largest_workspace_program=largest,
    )
