"""The spec's shape contracts for one descriptor: `validate` raises naming the graph and the field.

A catalog validates every descriptor it holds when it is built (``Catalog.__post_init__``), against
the catalog's token envelope R (``speculative_token_capacity``) and completion token capacity.
"""

from __future__ import annotations

import math

from helios_jax.catalog_descriptor import (
    DEFAULT_COMPLETION_TOKEN_CAPACITY,
    MAX_REQUEST_SLOTS,
    MIXED_BATCH_MAX,
    MIXED_BATCH_MIN,
    PROMPT_ALIGNMENT,
    Allocation,
    GraphDescriptor,
    GraphKind,
    field_error,
)


def _is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def validate(
    g: GraphDescriptor,
    *,
    speculative_token_capacity: int,
    completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY,
) -> None:
    """Enforce the spec's shape contracts for one descriptor: the fields every family shares, then
    its own family's.

    Raises:
      ValueError: naming the graph and the field that breaks a contract.
    """
    _validate_shared_fields(g)
    name = g.name
    if g.kind.is_prefill:
        if g.kind is GraphKind.SCORED_PREFILL and g.batch_capacity != 1:
            raise field_error(name, "batch_capacity", "a scored prefill consumes one request's chunk (B = 1)")
        if not _is_pow2(g.batch_capacity):
            raise field_error(name, "batch_capacity", "a multi-prompt prefill's rows are a power of two")
        if g.token_capacity < 1:
            raise field_error(name, "token_capacity", "a prefill graph needs a positive chunk size")
        if g.proposal_depth or g.target_capacity:
            raise field_error(name, "proposal_depth", "prefill graphs draw no proposals")
    elif g.kind is GraphKind.DECODE:
        if g.token_capacity != 1:
            raise field_error(name, "token_capacity", "ordinary decode has width one")
        if g.proposal_depth or g.target_capacity not in (0, g.batch_capacity):
            raise field_error(name, "proposal_depth", "ordinary decode draws no proposals")
        if not _is_pow2(g.batch_capacity):
            raise field_error(name, "batch_capacity", "request buckets are powers of two")
    elif g.kind is GraphKind.SPECULATIVE:
        _validate_speculative(g, speculative_token_capacity)
    elif g.kind is GraphKind.MIXED:
        _validate_mixed(g, speculative_token_capacity, completion_token_capacity)
    elif g.kind is GraphKind.VISION:
        if g.image_capacity < 1:
            raise field_error(name, "image_capacity", "a vision graph needs a positive image capacity")
    else:  # initialize, snapshot, restore
        if g.token_capacity or g.proposal_depth or g.target_capacity:
            raise field_error(name, "token_capacity", "state operations carry only a batch capacity")


def _validate_shared_fields(g: GraphDescriptor) -> None:
    """The contracts on fields every graph family carries: nonnegative integer capacities, a batch
    capacity within the request-slot bound, a positive measured duration, and the fields that only
    one family may set (prefill capacity and the draft-state flag: mixed; allocation: speculative;
    image capacity: vision) left unset elsewhere."""
    name = g.name
    for field in (
        "batch_capacity",
        "token_capacity",
        "proposal_depth",
        "target_capacity",
        "prefill_capacity",
        "image_capacity",
        "steps",
    ):
        value = getattr(g, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise field_error(name, field, f"must be a nonnegative integer, got {value!r}")
    if g.batch_capacity < 1:
        raise field_error(name, "batch_capacity", "must be at least 1")
    if g.batch_capacity > MAX_REQUEST_SLOTS:
        raise field_error(name, "batch_capacity", f"exceeds the {MAX_REQUEST_SLOTS} request-slot bound")
    if g.duration_ms is not None and not (math.isfinite(g.duration_ms) and g.duration_ms > 0):
        raise field_error(name, "duration_ms", f"must be finite and positive, got {g.duration_ms!r}")
    if g.kind is not GraphKind.MIXED and g.prefill_capacity != 0:
        raise field_error(name, "prefill_capacity", "is zero for every graph family except mixed")
    if g.kind is not GraphKind.MIXED and g.speculative:
        raise field_error(name, "speculative", "draft-state maintenance is a mixed-graph variant flag")
    if g.kind is not GraphKind.SPECULATIVE and g.allocation is not None:
        raise field_error(name, "allocation", "only speculative programs bind an allocation")
    if g.kind is not GraphKind.VISION and g.image_capacity != 0:
        raise field_error(name, "image_capacity", "only vision graphs carry an image capacity")
    if g.steps < 1:
        raise field_error(name, "steps", "a program runs at least one step")
    width_one = g.kind is GraphKind.SPECULATIVE and g.token_capacity == 1 and g.proposal_depth == 0
    if g.steps > 1 and g.kind is not GraphKind.DECODE and not width_one:
        raise field_error(
            name, "steps", "only ordinary decode and width-one speculative programs run several steps"
        )


def _validate_speculative(g: GraphDescriptor, r: int) -> None:
    name = g.name
    b, d, w, p = g.batch_capacity, g.proposal_depth, g.token_capacity, g.target_capacity
    if g.allocation is None:
        raise field_error(name, "allocation", "a speculative program binds query_length or prefix_limit")
    if not _is_pow2(b):
        raise field_error(name, "batch_capacity", "request buckets are powers of two")
    if w < 1:
        raise field_error(name, "token_capacity", "W counts the pending token and is at least 1")
    if w == 1 and d != 0:
        raise field_error(name, "proposal_depth", "width-one programs have D = 0")
    if w > d + 1:
        raise field_error(name, "token_capacity", f"W={w} needs at least {w - 1} proposals, D={d}")
    if p < b or p > b * w:
        raise field_error(name, "target_capacity", f"P={p} must lie in [B, B*W] = [{b}, {b * w}]")
    if w > 1:
        if p == b * w:
            if b * w > r:
                raise field_error(
                    name, "target_capacity", f"rectangular B*W={b * w} exceeds the token envelope R={r}"
                )
        elif p > r:
            raise field_error(name, "target_capacity", f"ragged P={p} exceeds the token envelope R={r}")
    if g.allocation is Allocation.PREFIX_LIMIT and d == 0:
        raise field_error(name, "allocation", "device allocation needs proposals to rank (D > 0)")


def _validate_mixed(g: GraphDescriptor, r: int, completion_capacity: int) -> None:
    name = g.name
    b, w, c = g.batch_capacity, g.token_capacity, g.prefill_capacity
    if not (_is_pow2(b) and MIXED_BATCH_MIN <= b <= MIXED_BATCH_MAX):
        raise field_error(name, "batch_capacity", "mixed batch capacity is a power of two from 2 through 64")
    if not 1 <= w <= completion_capacity:
        raise field_error(
            name,
            "token_capacity",
            f"mixed decode width is 1 through the completion token capacity {completion_capacity}",
        )
    if c <= 0 or c % PROMPT_ALIGNMENT:
        raise field_error(name, "prefill_capacity", f"must be positive and aligned to {PROMPT_ALIGNMENT}")
    if c < w:
        raise field_error(name, "prefill_capacity", "prompt capacity is at least the decode width")
    if w == 1 and g.proposal_depth != 0:
        raise field_error(name, "proposal_depth", "width-one graphs have D = 0")
    if w > 1:
        if not g.speculative:
            raise field_error(name, "speculative", "wider mixed widths verify proposals")
        if w > g.proposal_depth + 1:
            raise field_error(name, "token_capacity", f"W={w} needs at least {w - 1} proposals")
        if b * w > r:
            raise field_error(name, "token_capacity", f"B*W={b * w} exceeds the token envelope R={r}")
    if g.target_capacity != g.max_packed_extent:
        raise field_error(
            name, "target_capacity", f"the maximum packed extent is C + (B-1)*W = {g.max_packed_extent}"
        )
