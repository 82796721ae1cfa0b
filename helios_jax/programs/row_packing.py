"""Host packing of the row programs: `initialize`, snapshot, restore and copy (pure numpy).

A row's sampling settings are loaded by `initialize` for a new request, and by a copy whose lane
loads settings (a restore into another request reuses the prefix, not its owner's sampling).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from helios_jax.catalog import GraphKind
from helios_jax.programs.inputs import CopyInputs, InitializeInputs, ProgramShape
from helios_jax.programs.packing import InputError, _check_kind, _lanes, page_table_array
from helios_jax.programs.processor_packing import ProcessorSettings, pack_processors


def pack_initialize(
    shape: ProgramShape,
    *,
    slots: Sequence[int],
    temperature: Sequence[float],
    top_p: Sequence[float],
    top_k: Sequence[int],
    seeds: Sequence[int],
    coupled: Sequence[bool] | None = None,
    logprobs: Sequence[bool] | None = None,
    processors: Sequence[ProcessorSettings | None] | None = None,
) -> InitializeInputs:
    """Rows for new requests. `coupled[i]`: lane i's draws are keyed by its seed and position
    (requests that set a seed; RESOLUTIONS.md 30); `logprobs[i]`: lane i's programs score the
    tokens they emit (`scores.py`); None: no lane is / does. `processors[i]`: lane i's logits
    processors (`processor_packing.ProcessorSettings`; None: none)."""
    _check_kind(shape, GraphKind.INITIALIZE)
    n = len(slots)
    coupled = [False] * n if coupled is None else list(coupled)
    logprobs = [False] * n if logprobs is None else list(logprobs)
    if not len(temperature) == len(top_p) == len(top_k) == len(seeds) == len(coupled) == len(logprobs) == n:
        raise InputError("one temperature, top_p, top_k, seed, coupled and logprobs flag per lane")
    for i in range(n):
        _check_sampling(i, temperature[i], top_p[i], top_k[i])
    lane_slots, active = _lanes(shape, slots)

    def column(values, dtype, fill):
        out = np.full((shape.lanes,), fill, dtype)
        out[:n] = values
        return out

    return InitializeInputs(
        slots=lane_slots,
        active=active,
        temperature=column(temperature, np.float32, 0),
        top_p=column(top_p, np.float32, 1),
        top_k=column(top_k, np.int32, 0),
        seed=column(np.asarray(seeds, np.int64) % (1 << 32), np.uint32, 0),
        coupled=column(np.asarray(coupled, bool), bool, False),
        logprobs=column(np.asarray(logprobs, bool), bool, False),
        processors=_processors(shape, processors, n),
    )


def _processors(shape: ProgramShape, processors, n: int):
    if processors is not None and len(processors) != n:
        raise InputError(f"{len(processors)} processor settings for {n} lanes")
    try:
        return pack_processors(shape.lanes, shape.vocab, processors)
    except ValueError as error:
        raise InputError(str(error)) from None


def pack_copy(
    shape: ProgramShape,
    *,
    src_rows: Sequence[int],
    dst_rows: Sequence[int],
    src_pages: Sequence[Sequence[int]],
    dst_pages: Sequence[Sequence[int]],
    role: str = "copy",
    cursors: Sequence[int] | None = None,
    settings: Sequence[Settings | None] | None = None,
) -> CopyInputs:
    """Row-and-page copies. Roles: "snapshot" (request slot -> snapshot row), "restore"
    (snapshot row -> request slot), "copy" (any rows). Each lane copies whole pages, the
    partial last page included; destination pages must be distinct and not read by any lane.

    `cursors` (per lane, None: copy the source's) sets the destination cursor; `settings` (per
    lane, None: copy the source's) loads (temperature, top_p, top_k, seed, coupled, logprobs[,
    processors]) like `initialize`: a restore into another request reuses the prefix, not the
    sampling of its owner."""
    _check_kind(shape, GraphKind.SNAPSHOT, GraphKind.RESTORE)
    n = len(src_rows)
    if not len(dst_rows) == len(src_pages) == len(dst_pages) == n:
        raise InputError("one destination row and one page list pair per lane")
    request = range(shape.request_slots)
    snapshot = range(shape.request_slots, shape.state_rows)
    for i, (s, d) in enumerate(zip(src_rows, dst_rows)):
        if role == "snapshot" and (s not in request or d not in snapshot):
            raise InputError(
                f"lane {i}: a snapshot copies a request slot into a snapshot row, got {s} -> {d}"
            )
        if role == "restore" and (s not in snapshot or d not in request):
            raise InputError(f"lane {i}: a restore copies a snapshot row into a request slot, got {s} -> {d}")
        if role not in ("snapshot", "restore", "copy"):
            raise InputError(f"unknown copy role {role!r}")
        if len(src_pages[i]) != len(dst_pages[i]):
            raise InputError(
                f"lane {i}: {len(src_pages[i])} source pages for {len(dst_pages[i])} destinations"
            )
    _, active = _lanes(shape, dst_rows, allow_snapshot_rows=True)
    sources, _ = _lanes(shape, src_rows, allow_snapshot_rows=True)
    written = [int(p) for pages in dst_pages for p in pages]
    read = {int(p) for pages in src_pages for p in pages}
    if len(set(written)) != len(written) or read & set(written):
        raise InputError("destination pages must be distinct and disjoint from the source pages")
    dst = np.zeros((shape.lanes,), np.int32)
    dst[:n] = dst_rows
    return CopyInputs(
        src_rows=sources,
        dst_rows=dst,
        active=active,
        src_pages=page_table_array(shape, src_pages),
        dst_pages=page_table_array(shape, dst_pages),
        page_counts=np.array([len(p) for p in src_pages] + [0] * (shape.lanes - n), np.int32),
        **_copy_overrides(shape, n, cursors, settings),
    )


# temperature, top_p, top_k, seed, coupled, logprobs[, processors: ProcessorSettings | None]
Settings = tuple


def _copy_overrides(shape: ProgramShape, n: int, cursors, settings) -> dict[str, np.ndarray]:
    """CopyInputs' per-lane cursor and settings overrides (-1 and unloaded: copy the source)."""
    b = shape.lanes
    cursor = np.full((b,), -1, np.int32)
    if cursors is not None:
        if len(cursors) != n:
            raise InputError("one cursor (or None) per lane")
        for i, c in ((i, c) for i, c in enumerate(cursors) if c is not None):
            if int(c) < 0:
                raise InputError(f"lane {i}: cursor {c} must be >= 0")
            cursor[i] = int(c)
    out = dict(
        cursor=cursor,
        load_settings=np.zeros((b,), bool),
        temperature=np.zeros((b,), np.float32),
        top_p=np.ones((b,), np.float32),
        top_k=np.zeros((b,), np.int32),
        seed=np.zeros((b,), np.uint32),
        coupled=np.zeros((b,), bool),
        logprobs=np.zeros((b,), bool),
    )
    if settings is None:
        out["processors"] = _processors(shape, None, n)
        return out
    if len(settings) != n:
        raise InputError("one settings tuple (or None) per lane")
    out["processors"] = _processors(shape, [None if e is None or len(e) < 7 else e[6] for e in settings], n)
    for i, each in enumerate(settings):
        if each is None:
            continue
        temperature, top_p, top_k, seed, coupled, logprobs = each[:6]
        _check_sampling(i, temperature, top_p, top_k)
        out["load_settings"][i] = True
        out["temperature"][i], out["top_p"][i], out["top_k"][i] = temperature, top_p, top_k
        out["seed"][i] = int(seed) % (1 << 32)
        out["coupled"][i] = bool(coupled)
        out["logprobs"][i] = bool(logprobs)
    return out


def _check_sampling(i: int, temperature: float, top_p: float, top_k: int) -> None:
    if not (np.isfinite(temperature) and temperature >= 0):
        raise InputError(f"lane {i}: temperature {temperature} must be finite and >= 0")
    if not 0 < top_p <= 1:
        raise InputError(f"lane {i}: top_p {top_p} outside (0, 1]")
    if top_k < 0:
        raise InputError(f"lane {i}: top_k {top_k} must be >= 0")


def pack_snapshot(shape: ProgramShape, **kwargs) -> CopyInputs:
    return pack_copy(shape, role="snapshot", **kwargs)


def pack_restore(shape: ProgramShape, **kwargs) -> CopyInputs:
    return pack_copy(shape, role="restore", **kwargs)
