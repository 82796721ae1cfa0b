"""Host input packing: plain host data -> the arrays a program takes, with role validation.

Pure numpy, no jax: the runtime calls these per frame with the scheduler's frozen plan (slots,
page reservations, query lengths, the prompt row and its tokens). Each function validates before
building anything and raises `InputError` (a ValueError) naming the lane and the field.

Contract highlights (spec "Mixed execution contract", "Speculative graph coverage"):
- lanes are given densely, in order: lane i of the lists is lane i of the program; lanes past the
  lists are inactive padding (slot 0, zero lengths, all page entries out of range);
- one length upload: a single i32[B] `query_lengths` from which the device derives packed
  offsets (exclusive prefix sums), positions and context lengths;
- the prompt row (`prefill_row`, an index into the dense lane list, -1 for none) gets its tokens
  at its packed offset in the packed token array;
- page tables are padded with `total_pages`, an out-of-range id: a write outside the row's
  reservation is dropped on the device instead of landing in another request's page;
- token masks (`token_masks`: lane -> i32[ceil(V/32)] words in xgrammar's layout, None or
  absent: unmasked; `token_mask.py`) restrict a lane's sample; every program that samples takes
  them except K-step decode, and a masked lane must verify exactly one target row (its query
  length, or its ceiling under device allocation, is 1).

Worked example (mixed, B = 4, W = 2, C = 64, T = 70): lanes [decode, prompt(5 tokens), decode],
query_lengths [2, 5, 1] -> offsets [0, 2, 7]; the prompt occupies tokens[2:7]; lane 3 is padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.programs.inputs import (
    STOP_CAPACITY,
    DecodeInputs,
    MixedInputs,
    MultiStepInputs,
    PrefillInputs,
    ProgramShape,
    SpeculativeInputs,
)
from helios_jax.programs.token_mask import TokenMasks, pack_token_masks


class InputError(ValueError):
    """Host data that breaks a program's input contract."""


def packed_offsets(query_lengths: Sequence[int]) -> np.ndarray:
    """Exclusive prefix sums: lane i's packed tokens start at offsets[i]."""
    lengths = np.asarray(query_lengths, np.int64)
    return (np.cumsum(lengths) - lengths).astype(np.int32)


def _lanes(
    shape: ProgramShape, slots: Sequence[int], *, allow_snapshot_rows: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    slots = [int(s) for s in slots]
    if len(slots) > shape.lanes:
        raise InputError(f"{len(slots)} lanes exceed the program's batch capacity {shape.lanes}")
    limit = shape.state_rows if allow_snapshot_rows else shape.request_slots
    for i, s in enumerate(slots):
        if not 0 <= s < limit:
            raise InputError(f"lane {i}: slot {s} outside 0..{limit - 1}")
    if len(set(slots)) != len(slots):
        raise InputError(f"slots repeat: {slots}")
    out = np.zeros((shape.lanes,), np.int32)
    out[: len(slots)] = slots
    active = np.zeros((shape.lanes,), bool)
    active[: len(slots)] = True
    return out, active


def _lanes_and_tables(
    shape: ProgramShape, slots: Sequence[int], page_tables: Sequence[Sequence[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slots, active, page tables) of generation lanes: one page table per slot."""
    if len(page_tables) != len(slots):
        raise InputError(f"{len(page_tables)} page tables for {len(slots)} lanes")
    lane_slots, active = _lanes(shape, slots)
    return lane_slots, active, page_table_array(shape, page_tables)


def page_table_array(
    shape: ProgramShape, tables: Sequence[Sequence[int]], rows: int | None = None
) -> np.ndarray:
    """i32[rows, N] page tables padded with total_pages (out of range: writes are dropped)."""
    rows = shape.lanes if rows is None else rows
    out = np.full((rows, shape.pages_per_row), shape.total_pages, np.int32)
    if len(tables) > rows:
        raise InputError(f"{len(tables)} page tables for {rows} lanes")
    for i, pages in enumerate(tables):
        pages = [int(p) for p in pages]
        if len(pages) > shape.pages_per_row:
            raise InputError(f"lane {i}: {len(pages)} pages exceed pages_per_row {shape.pages_per_row}")
        if any(not 0 <= p < shape.total_pages for p in pages):
            raise InputError(f"lane {i}: page ids outside 0..{shape.total_pages - 1}: {pages}")
        out[i, : len(pages)] = pages
    return out


def _copy_arrays(shape: ProgramShape, depth: int, copies, lanes: int):
    tokens = np.zeros((shape.lanes, depth), np.int32)
    lengths = np.full((shape.lanes,), -1, np.int32)
    if copies is None:
        return tokens, lengths
    if len(copies) != lanes:
        raise InputError(f"copy_proposals has {len(copies)} entries for {lanes} lanes")
    for i, prefix in enumerate(copies):
        if prefix is None:
            continue
        prefix = [int(t) for t in prefix]
        if len(prefix) > depth:
            raise InputError(f"lane {i}: {len(prefix)} copy proposals exceed D={depth}")
        tokens[i, : len(prefix)] = prefix
        lengths[i] = len(prefix)
    return tokens, lengths


def _masks(shape: ProgramShape, token_masks: TokenMasks | None, lanes: int, rows=None) -> dict:
    """{token_mask, masked} for a program's inputs; `rows` (i32[B], None: one row per lane): each
    lane's target rows (query length or ceiling), which must be 1 for a masked lane."""
    try:
        mask, masked = pack_token_masks(shape.lanes, shape.mask_words, shape.vocab, token_masks, lanes)
    except ValueError as error:
        raise InputError(str(error)) from None
    if rows is not None:
        for i in np.flatnonzero(masked & (np.asarray(rows) != 1)):
            raise InputError(f"lane {i}: a masked lane verifies one target row, got {int(rows[i])}")
    return dict(token_mask=mask, masked=masked)


def _check_kind(shape: ProgramShape, *kinds: GraphKind) -> None:
    if shape.kind not in kinds:
        raise InputError(f"a {shape.kind.value} program cannot take these inputs")


def pack_prefill(
    shape: ProgramShape,
    *,
    slot: int | None = None,
    tokens: Sequence[int] | None = None,
    page_table: Sequence[int] | None = None,
    prompt_ends: bool | Sequence[bool] = False,
    slots: Sequence[int] | None = None,
    chunks: Sequence[Sequence[int]] | None = None,
    page_tables: Sequence[Sequence[int]] | None = None,
    token_masks: TokenMasks | None = None,
) -> PrefillInputs:
    """One chunk of 1..C prompt tokens for request slot `slot`; or, on a B-row prefill, one chunk
    per row (`slots`, `chunks`, `page_tables`, `prompt_ends` per row), packed by prefix sums.
    `token_masks` (row -> words) restrict the first output token a prompt-ending row samples."""
    _check_kind(shape, GraphKind.PREFILL, GraphKind.SCORED_PREFILL)
    if slots is None:
        if slot is None or tokens is None or page_table is None:
            raise InputError("a prefill takes slot, tokens and page_table (or slots, chunks, page_tables)")
        slots, chunks, page_tables, prompt_ends = [slot], [tokens], [page_table], [bool(prompt_ends)]
    chunks = [np.asarray(c, np.int32).reshape(-1) for c in chunks or ()]
    ends = [bool(e) for e in prompt_ends] if isinstance(prompt_ends, Sequence) else []
    if not len(chunks) == len(ends) == len(page_tables or ()) == len(slots):
        raise InputError(f"{len(slots)} rows need as many chunks, page tables and prompt_ends")
    for i, c in enumerate(chunks):
        if not 1 <= c.size <= shape.prefill_capacity:
            raise InputError(f"row {i}: chunk of {c.size} tokens outside 1..{shape.prefill_capacity}")
    lane_slots, _ = _lanes(shape, slots)
    packed = np.zeros((shape.lanes * shape.prefill_capacity,), np.int32)
    lengths = np.zeros((shape.lanes,), np.int32)
    lengths[: len(chunks)] = [c.size for c in chunks]
    for c, offset in zip(chunks, packed_offsets(lengths)):
        packed[offset : offset + c.size] = c
    row_ends = np.zeros((shape.lanes,), bool)
    row_ends[: len(ends)] = ends
    return PrefillInputs(
        slot=lane_slots,
        tokens=packed,
        length=lengths,
        prompt_ends=row_ends,
        page_table=page_table_array(shape, page_tables),
        **_masks(shape, token_masks, len(slots)),
    )


def pack_decode(
    shape: ProgramShape,
    *,
    slots: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    steps: Sequence[int] | None = None,
    stop_tokens: Sequence[Sequence[int]] | None = None,
    token_masks: TokenMasks | None = None,
) -> DecodeInputs | MultiStepInputs:
    """Decode lanes; a multi-step program (K > 1) also takes each lane's step limit (1..K,
    default K) and its stop tokens (at most STOP_CAPACITY each, default none), and no token
    masks (a masked lane needs one step per frame)."""
    _check_kind(shape, GraphKind.DECODE)
    if shape.steps > 1:
        return pack_multistep(
            shape,
            slots=slots,
            page_tables=page_tables,
            steps=steps,
            stop_tokens=stop_tokens,
            token_masks=token_masks,
        )
    lane_slots, active, tables = _lanes_and_tables(shape, slots, page_tables)
    if steps is not None and any(int(k) != 1 for k in steps) or stop_tokens:
        raise InputError("a single-step decode program takes no step limits or stop tokens")
    return DecodeInputs(
        slots=lane_slots, active=active, page_tables=tables, **_masks(shape, token_masks, len(slots))
    )


def pack_multistep(
    shape: ProgramShape,
    *,
    slots: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    steps: Sequence[int] | None = None,
    stop_tokens: Sequence[Sequence[int]] | None = None,
    token_masks: TokenMasks | None = None,
) -> MultiStepInputs:
    """A K-step program's lanes (decode, or width-one speculative: `multistep.py`): each lane's
    step limit (1..K, default K) and its stop tokens (at most STOP_CAPACITY each, default none);
    no token masks (a masked lane needs one step per frame)."""
    _check_kind(shape, GraphKind.DECODE, GraphKind.SPECULATIVE)
    if shape.steps == 1:
        raise InputError(f"a single-step {shape.kind.value} program takes no step limits")
    lane_slots, active, tables = _lanes_and_tables(shape, slots, page_tables)
    if any(m is not None for m in (token_masks or {}).values()):
        raise InputError("a multi-step program takes no token masks")
    return MultiStepInputs(
        slots=lane_slots,
        active=active,
        page_tables=tables,
        **_step_arrays(shape, len(slots), steps, stop_tokens),
    )


def _step_arrays(shape: ProgramShape, lanes: int, steps, stop_tokens) -> dict:
    if steps is not None and len(steps) != lanes:
        raise InputError(f"{len(steps)} step limits for {lanes} lanes")
    if stop_tokens is not None and len(stop_tokens) != lanes:
        raise InputError(f"{len(stop_tokens)} stop-token lists for {lanes} lanes")
    limits = np.ones((shape.lanes,), np.int32)
    limits[:lanes] = shape.steps if steps is None else [int(k) for k in steps]
    for i, k in enumerate(limits[:lanes]):
        if not 1 <= k <= shape.steps:
            raise InputError(f"lane {i}: step limit {k} outside 1..{shape.steps}")
    stops = np.full((shape.lanes, STOP_CAPACITY), -1, np.int32)
    for i, ids in enumerate(stop_tokens or ()):
        ids = [int(t) for t in ids]
        if len(ids) > STOP_CAPACITY or any(t < 0 for t in ids):
            raise InputError(f"lane {i}: at most {STOP_CAPACITY} nonnegative stop tokens, got {ids}")
        stops[i, : len(ids)] = ids
    return {"steps": limits, "stop_tokens": stops}


def _speculative_rows(shape: ProgramShape, n: int, query_lengths, ceilings, copy_lengths) -> np.ndarray:
    """i32[B] the binding's values: query lengths (within P, copy prefixes) or lane ceilings."""
    rows = np.zeros((shape.lanes,), np.int32)
    if shape.allocation is Allocation.PREFIX_LIMIT:
        if ceilings is None or query_lengths is not None:
            raise InputError("a prefix_limit program takes ceilings, not query lengths")
        values, top = ceilings, min(shape.depth + 1, shape.width)
        field = "ceiling"
    else:
        if query_lengths is None or ceilings is not None:
            raise InputError("a query_length program takes query lengths, not ceilings")
        values, top = query_lengths, shape.width
        field = "query length"
    if len(values) != n:
        raise InputError(f"{len(values)} {field}s for {n} lanes")
    for i, v in enumerate(values):
        if not 1 <= int(v) <= top:
            raise InputError(f"lane {i}: {field} {int(v)} outside 1..{top}")
        rows[i] = int(v)
    if shape.allocation is not Allocation.PREFIX_LIMIT:
        if rows.sum() > shape.target_capacity:
            raise InputError(f"query lengths sum to {int(rows.sum())} > P={shape.target_capacity}")
        for i in range(n):
            if copy_lengths[i] >= 0 and rows[i] > copy_lengths[i] + 1:
                raise InputError(
                    f"lane {i}: query length {rows[i]} needs {rows[i] - 1} proposals; "
                    f"the copy prefix has {copy_lengths[i]}"
                )
    return rows


def pack_speculative(
    shape: ProgramShape,
    *,
    slots: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    query_lengths: Sequence[int] | None = None,
    ceilings: Sequence[int] | None = None,
    copy_proposals: Sequence[Sequence[int] | None] | None = None,
    token_masks: TokenMasks | None = None,
) -> SpeculativeInputs:
    """A complete speculative round.

    Args:
      query_lengths: QueryLength binding: each lane's exact target rows, 1..W, summing within P;
        a copy lane also needs rows <= its supplied prefix + 1.
      ceilings: SpeculativePrefixLimit binding: immutable lane ceilings, 1..min(D + 1, W); they
        may sum above P (the device allocates within P).
      copy_proposals: per lane None (learned proposals) or a supplied prefix of <= D tokens.
      token_masks: lane -> token mask words (`token_mask.py`); a masked lane's query length or
        ceiling must be 1.
    """
    _check_kind(shape, GraphKind.SPECULATIVE)
    n = len(slots)
    lane_slots, active, tables = _lanes_and_tables(shape, slots, page_tables)
    copy_tokens, copy_lengths = _copy_arrays(shape, shape.depth, copy_proposals, n)
    rows = _speculative_rows(shape, n, query_lengths, ceilings, copy_lengths)
    return SpeculativeInputs(
        slots=lane_slots,
        active=active,
        page_tables=tables,
        lane_rows=rows,
        copy_tokens=copy_tokens,
        copy_lengths=copy_lengths,
        **_masks(shape, token_masks, n, rows),
    )


def validate_mixed_roles(
    shape: ProgramShape, query_lengths: Sequence[int], prefill_row: int | None, prompt_length: int
) -> None:
    """Role validation of a mixed frame: at most one prompt row (a single index), inside the
    dense lane list; the prompt row's length equals its uploaded tokens and fits C; every decode
    row verifies 1..W rows; the lengths sum within the packed extent C + (B - 1) * W."""
    n = len(query_lengths)
    if n > shape.lanes:
        raise InputError(f"{n} lanes exceed the program's batch capacity {shape.lanes}")
    if prefill_row is not None and not 0 <= prefill_row < n:
        raise InputError(f"prefill_row {prefill_row} outside the dense lane list 0..{n - 1}")
    for i, q in enumerate(query_lengths):
        q = int(q)
        if i == prefill_row:
            if q != prompt_length or not 1 <= q <= shape.prefill_capacity:
                raise InputError(
                    f"prompt row {i}: query length {q} must equal its {prompt_length} "
                    f"prompt tokens, within 1..{shape.prefill_capacity}"
                )
        elif not 1 <= q <= shape.width:
            raise InputError(f"decode row {i}: query length {q} outside 1..{shape.width}")
    total = sum(int(q) for q in query_lengths)
    if total > shape.target_capacity:
        raise InputError(f"query lengths sum to {total} > packed extent {shape.target_capacity}")


def pack_mixed(
    shape: ProgramShape,
    *,
    slots: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    query_lengths: Sequence[int],
    prefill_row: int | None = None,
    prompt_tokens: Sequence[int] = (),
    prompt_ends: bool = False,
    copy_proposals: Sequence[Sequence[int] | None] | None = None,
    token_masks: TokenMasks | None = None,
) -> MixedInputs:
    """A mixed frame: `slots` is the dense active lane list; `prefill_row` indexes it (None: a
    decode-only population); `prompt_tokens` are the prompt row's chunk; `token_masks` (lane ->
    words) restrict samples (a masked decode lane verifies one row)."""
    _check_kind(shape, GraphKind.MIXED)
    n = len(slots)
    if len(page_tables) != n or len(query_lengths) != n:
        raise InputError(
            f"{len(page_tables)} page tables and {len(query_lengths)} query lengths for {n} lanes"
        )
    prompt = np.asarray(prompt_tokens, np.int32).reshape(-1)
    if prefill_row is None and prompt.size:
        raise InputError("prompt tokens without a prompt row")
    validate_mixed_roles(shape, query_lengths, prefill_row, prompt.size)
    lane_slots, active = _lanes(shape, slots)
    lengths = np.zeros((shape.lanes,), np.int32)
    lengths[:n] = [int(q) for q in query_lengths]
    copy_tokens, copy_lengths = _copy_arrays(shape, shape.width - 1, copy_proposals, n)
    for i in range(n):
        if i != prefill_row and copy_lengths[i] >= 0 and lengths[i] > copy_lengths[i] + 1:
            raise InputError(f"lane {i}: query length {lengths[i]} exceeds its copy prefix + 1")
    tokens = np.zeros((shape.target_capacity,), np.int32)
    if prefill_row is not None:
        offset = int(packed_offsets(lengths)[prefill_row])
        tokens[offset : offset + prompt.size] = prompt
    return MixedInputs(
        slots=lane_slots,
        active=active,
        page_tables=page_table_array(shape, page_tables),
        prefill_row=np.array([-1 if prefill_row is None else prefill_row], np.int32),
        query_lengths=lengths,
        tokens=tokens,
        prompt_ends=np.array([bool(prompt_ends)]),
        copy_tokens=copy_tokens,
        copy_lengths=copy_lengths,
        **_masks(shape, token_masks, n, np.where(np.arange(shape.lanes) == prefill_row, 1, lengths)),
    )


def sampling_mask(
    shape: ProgramShape, lanes: int, *, prefill_row: int | None = None, prompt_ends: bool = False
) -> np.ndarray:
    """bool[B]: which lanes emit output tokens in this frame. Decode rows always do; the prompt
    row only when its chunk ends the prompt (its first output token); padding lanes never."""
    mask = np.zeros((shape.lanes,), bool)
    mask[:lanes] = True
    if shape.kind.is_prefill:
        mask[:lanes] = prompt_ends
    elif prefill_row is not None:
        mask[prefill_row] = prompt_ends
    return mask
