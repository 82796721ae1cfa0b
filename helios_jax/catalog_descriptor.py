"""A prepared program's descriptor: its kind, its extents, its cost identity and its JSON entry.

A *prepared program* (graph) is identified by its physical shape. Each descriptor carries the fields
of the spec's "Speculative graph coverage" and "Mixed execution contract" (the table in
``helios_jax.catalog``). ``descriptor_from_json`` reads one entry of a catalog file without checking
its shape contracts (``helios_jax.catalog_contracts`` does); ``descriptor_to_json`` writes it back.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

# The core's completion token capacity when it declares none (spec, "Mixed execution contract").
DEFAULT_COMPLETION_TOKEN_CAPACITY = 8
MIXED_BATCH_MIN, MIXED_BATCH_MAX = 2, 64
PROMPT_ALIGNMENT = 64
MAX_REQUEST_SLOTS = 64
# A speculative program's identity (B, W, D, P): a catalog entry must declare all four.
SPECULATIVE_EXTENTS = ("batch_capacity", "token_capacity", "proposal_depth", "target_capacity")


class GraphKind(str, enum.Enum):
    PREFILL = "prefill"
    SCORED_PREFILL = "scored_prefill"
    DECODE = "decode"
    SPECULATIVE = "speculative"
    MIXED = "mixed"
    VISION = "vision"
    INITIALIZE = "initialize"
    SNAPSHOT = "snapshot"
    RESTORE = "restore"

    @property
    def is_prefill(self) -> bool:
        return self in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL)

    @property
    def is_generation(self) -> bool:
        """Programs that commit output tokens for decoding requests."""
        return self in (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED)

    @property
    def is_state_operation(self) -> bool:
        return self in (GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE, GraphKind.VISION)

    @property
    def may_share_window(self) -> bool:
        """Only ordinary decode and complete speculative generation may occupy both frame slots."""
        return self in (GraphKind.DECODE, GraphKind.SPECULATIVE)


class Allocation(str, enum.Enum):
    QUERY_LENGTH = "query_length"  # host-selected per-lane lengths (exact QueryLength binding)
    PREFIX_LIMIT = "prefix_limit"  # device allocation within immutable lane ceilings


class DecodeMode(str, enum.Enum):
    ORDINARY = "ordinary"  # no speculation: decode graphs, non-speculative mixed graphs
    FIXED = "fixed"  # fixed-width speculation, host-allocated programs only
    ADAPTIVE = "adaptive"  # width chosen per round by value; device allocation allowed


class CostKey(NamedTuple):
    """Identity of a cost entry: physical kind and capacities (never the active row count)."""

    kind: GraphKind
    batch_capacity: int
    token_capacity: int
    proposal_depth: int
    prefill_capacity: int
    target_capacity: int
    steps: int = 1  # decode steps per execution (multi-step decode); named only when > 1

    def __str__(self) -> str:
        steps = f",S={self.steps}" if self.steps != 1 else ""
        return (
            f"{self.kind.value}[B={self.batch_capacity},W={self.token_capacity},"
            f"D={self.proposal_depth},C={self.prefill_capacity},P={self.target_capacity}{steps}]"
        )


@dataclasses.dataclass(frozen=True)
class GraphDescriptor:
    kind: GraphKind
    batch_capacity: int
    token_capacity: int = 0
    proposal_depth: int = 0
    target_capacity: int = 0
    prefill_capacity: int = 0
    allocation: Allocation | None = None
    speculative: bool = False
    image_capacity: int = 0
    # Decode steps one execution runs (a `lax.scan` of K single steps); 1 for every other kind.
    steps: int = 1
    # The file's measurement, if any. Never an estimate: the cost model starts indeterminate.
    duration_ms: float | None = None

    @functools.cached_property
    def key(self) -> CostKey:
        return CostKey(
            self.kind,
            self.batch_capacity,
            self.token_capacity,
            self.proposal_depth,
            self.prefill_capacity,
            self.target_capacity,
            self.steps,
        )

    @property
    def name(self) -> str:
        return str(self.key)

    @property
    def is_rectangular(self) -> bool:
        """Speculative programs with P = B x W (every lane may use its full width)."""
        return self.target_capacity == self.batch_capacity * self.token_capacity

    @property
    def width(self) -> int:
        """Target rows per request including the pending token (1 for plain decode)."""
        return self.token_capacity

    @property
    def max_packed_extent(self) -> int:
        """Mixed: prefill_capacity + (B - 1) * W, the largest packed token count."""
        return self.prefill_capacity + (self.batch_capacity - 1) * self.token_capacity

    @property
    def packed_extent(self) -> int:
        """Target tokens the program packs into one forward: the chunk (prefill family), B
        (decode), P (speculative), C + (B - 1) * W (mixed); state operations and vision pack none."""
        if self.kind.is_prefill:
            return self.batch_capacity * self.token_capacity
        if self.kind is GraphKind.DECODE:
            return self.batch_capacity
        if self.kind is GraphKind.SPECULATIVE:
            return self.target_capacity
        if self.kind is GraphKind.MIXED:
            return self.max_packed_extent
        return 0


def field_error(name: str, field: str, message: str) -> ValueError:
    """The one form of a contract violation: the graph, the field, the reason."""
    return ValueError(f"graph {name}: field {field!r}: {message}")


def descriptor_from_json(obj: dict) -> GraphDescriptor:
    """Build a descriptor from one entry of a catalog file (shape contracts unchecked).

    A speculative entry must declare all four extents B, W, D and P (``batch_capacity``,
    ``token_capacity``, ``proposal_depth``, ``target_capacity``), even a width-one program's
    D = 0: a missing extent is an error naming the graph and the field, never a default.
    """
    known = {f.name for f in dataclasses.fields(GraphDescriptor)}
    unknown = set(obj) - known
    if unknown:
        raise ValueError(f"graph entry {obj!r}: unknown fields {sorted(unknown)}")
    if "kind" not in obj:
        raise ValueError(f"graph entry {obj!r}: 'kind' and 'batch_capacity' are required")
    try:
        kind = GraphKind(obj["kind"])
    except ValueError:
        raise ValueError(f"graph entry {obj!r}: unknown kind {obj['kind']!r}") from None
    if kind is GraphKind.SPECULATIVE:
        # All four extents are explicit: none is inferred from the others or defaulted.
        missing = [f for f in SPECULATIVE_EXTENTS if f not in obj]
        if missing:
            extents = {f: obj.get(f, "?") for f in SPECULATIVE_EXTENTS}
            name = (
                f"speculative[B={extents['batch_capacity']},W={extents['token_capacity']},"
                f"D={extents['proposal_depth']},C=0,P={extents['target_capacity']}]"
            )
            raise field_error(
                name,
                missing[0],
                f"a speculative program declares all four extents B, D, W and P; missing {missing}",
            )
    if "batch_capacity" not in obj:
        raise ValueError(f"graph entry {obj!r}: 'kind' and 'batch_capacity' are required")
    fields = dict(obj, kind=kind)
    if fields.get("allocation") is not None:
        try:
            fields["allocation"] = Allocation(fields["allocation"])
        except ValueError:
            raise ValueError(f"graph entry {obj!r}: unknown allocation {obj['allocation']!r}") from None
    if kind is GraphKind.MIXED and "target_capacity" not in fields:
        b, w = fields["batch_capacity"], fields.get("token_capacity", 0)
        fields["target_capacity"] = fields.get("prefill_capacity", 0) + (b - 1) * w
    if kind is GraphKind.DECODE and "target_capacity" not in fields:
        fields["target_capacity"] = fields["batch_capacity"]
    if kind is GraphKind.SPECULATIVE and fields.get("allocation") is None:
        fields["allocation"] = Allocation.QUERY_LENGTH
    if "duration_ms" in fields and fields["duration_ms"] is not None:
        fields["duration_ms"] = float(fields["duration_ms"])
    return GraphDescriptor(**fields)


def descriptor_to_json(g: GraphDescriptor) -> dict:
    out: dict = {"kind": g.kind.value, "batch_capacity": g.batch_capacity}
    for f in ("token_capacity", "proposal_depth", "target_capacity", "prefill_capacity", "image_capacity"):
        value = getattr(g, f)
        if value or (g.kind is GraphKind.SPECULATIVE and f in SPECULATIVE_EXTENTS):
            out[f] = value
    if g.kind is GraphKind.DECODE and g.target_capacity != g.batch_capacity:
        out["target_capacity"] = g.target_capacity  # the loader reads a missing P as B: keep a declared 0
    if g.allocation is not None:
        out["allocation"] = g.allocation.value
    if g.steps != 1:
        out["steps"] = g.steps  # written only when > 1: single-step entries are unchanged
    if g.kind is GraphKind.MIXED:
        out["speculative"] = g.speculative
        out["proposal_depth"] = g.proposal_depth
    if g.duration_ms is not None:
        out["duration_ms"] = g.duration_ms
    return out
