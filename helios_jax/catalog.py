"""Prepared-graph catalog: descriptors, shape contracts, JSON format and capacity planning.

A *prepared program* (graph) is identified by its physical shape. The scheduler never invents a
shape: it chooses among the descriptors of a loaded catalog. Each descriptor carries the fields
of the spec's "Speculative graph coverage" and "Mixed execution contract":

========================  ==============================================================
kind                      prefill, scored_prefill, decode, speculative, mixed, vision,
                          initialize, snapshot, restore
batch_capacity   (B)      physical request rows
token_capacity   (W)      decode/speculative: target rows per request including the pending
                          token; prefill family: the chunk size; mixed: verification width
proposal_depth   (D)      produced proposal positions (explicit, never inferred from W or P)
target_capacity  (P)      aggregate target rows (speculative), maximum packed extent (mixed)
prefill_capacity          mixed prompt capacity; zero for every other kind
allocation                speculative row binding: ``query_length`` (host) or ``prefix_limit``
                          (device)
speculative               mixed only: draft-state maintenance (speculative catalog variant)
image_capacity            vision only: images per execution
========================  ==============================================================

Estimates are *not* part of a descriptor's identity. The spec's single ``estimated_duration_ns``
field lives in the scheduler's cost model and starts indeterminate whatever a file says; the
file's ``duration_ms`` is kept only so that simulators and tests can feed it through the
ordinary observation path (see ``helios_jax.scheduler.cost``).

Shape contracts are enforced when a descriptor is built; a violation raises ``ValueError``
naming the graph and the field.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.resources
import json
import math
import pathlib
from typing import Iterable, NamedTuple, Sequence

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


def _is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


class CostKey(NamedTuple):
    """Identity of a cost entry: physical kind and capacities (never the active row count)."""

    kind: GraphKind
    batch_capacity: int
    token_capacity: int
    proposal_depth: int
    prefill_capacity: int
    target_capacity: int

    def __str__(self) -> str:
        return (
            f"{self.kind.value}[B={self.batch_capacity},W={self.token_capacity},"
            f"D={self.proposal_depth},C={self.prefill_capacity},P={self.target_capacity}]"
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


def _err(name: str, field: str, message: str) -> ValueError:
    return ValueError(f"graph {name}: field {field!r}: {message}")


def validate(
    g: GraphDescriptor,
    *,
    speculative_token_capacity: int,
    completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY,
) -> None:
    """Enforce the spec's shape contracts for one descriptor.

    Raises:
      ValueError: naming the graph and the field that breaks a contract.
    """
    name = g.name
    for field in ("batch_capacity", "token_capacity", "proposal_depth", "target_capacity",
                  "prefill_capacity", "image_capacity"):
        value = getattr(g, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _err(name, field, f"must be a nonnegative integer, got {value!r}")
    if g.batch_capacity < 1:
        raise _err(name, "batch_capacity", "must be at least 1")
    if g.batch_capacity > MAX_REQUEST_SLOTS:
        raise _err(name, "batch_capacity", f"exceeds the {MAX_REQUEST_SLOTS} request-slot bound")
    if g.duration_ms is not None and not (math.isfinite(g.duration_ms) and g.duration_ms > 0):
        raise _err(name, "duration_ms", f"must be finite and positive, got {g.duration_ms!r}")
    if g.kind is not GraphKind.MIXED and g.prefill_capacity != 0:
        raise _err(name, "prefill_capacity", "is zero for every graph family except mixed")
    if g.kind is not GraphKind.MIXED and g.speculative:
        raise _err(name, "speculative", "draft-state maintenance is a mixed-graph variant flag")
    if g.kind is not GraphKind.SPECULATIVE and g.allocation is not None:
        raise _err(name, "allocation", "only speculative programs bind an allocation")
    if g.kind is not GraphKind.VISION and g.image_capacity != 0:
        raise _err(name, "image_capacity", "only vision graphs carry an image capacity")

    if g.kind.is_prefill:
        if g.batch_capacity != 1:
            raise _err(name, "batch_capacity", "a prefill graph consumes one request's chunk (B = 1)")
        if g.token_capacity < 1:
            raise _err(name, "token_capacity", "a prefill graph needs a positive chunk size")
        if g.proposal_depth or g.target_capacity:
            raise _err(name, "proposal_depth", "prefill graphs draw no proposals")
    elif g.kind is GraphKind.DECODE:
        if g.token_capacity != 1:
            raise _err(name, "token_capacity", "ordinary decode has width one")
        if g.proposal_depth or g.target_capacity not in (0, g.batch_capacity):
            raise _err(name, "proposal_depth", "ordinary decode draws no proposals")
        if not _is_pow2(g.batch_capacity):
            raise _err(name, "batch_capacity", "request buckets are powers of two")
    elif g.kind is GraphKind.SPECULATIVE:
        _validate_speculative(g, speculative_token_capacity)
    elif g.kind is GraphKind.MIXED:
        _validate_mixed(g, speculative_token_capacity, completion_token_capacity)
    elif g.kind is GraphKind.VISION:
        if g.image_capacity < 1:
            raise _err(name, "image_capacity", "a vision graph needs a positive image capacity")
    else:  # initialize, snapshot, restore
        if g.token_capacity or g.proposal_depth or g.target_capacity:
            raise _err(name, "token_capacity", "state operations carry only a batch capacity")


def _validate_speculative(g: GraphDescriptor, r: int) -> None:
    name = g.name
    b, d, w, p = g.batch_capacity, g.proposal_depth, g.token_capacity, g.target_capacity
    if g.allocation is None:
        raise _err(name, "allocation", "a speculative program binds query_length or prefix_limit")
    if not _is_pow2(b):
        raise _err(name, "batch_capacity", "request buckets are powers of two")
    if w < 1:
        raise _err(name, "token_capacity", "W counts the pending token and is at least 1")
    if w == 1 and d != 0:
        raise _err(name, "proposal_depth", "width-one programs have D = 0")
    if w > d + 1:
        raise _err(name, "token_capacity", f"W={w} needs at least {w - 1} proposals, D={d}")
    if p < b or p > b * w:
        raise _err(name, "target_capacity", f"P={p} must lie in [B, B*W] = [{b}, {b * w}]")
    if w > 1:
        if p == b * w:
            if b * w > r:
                raise _err(name, "target_capacity",
                           f"rectangular B*W={b * w} exceeds the token envelope R={r}")
        elif p > r:
            raise _err(name, "target_capacity", f"ragged P={p} exceeds the token envelope R={r}")
    if g.allocation is Allocation.PREFIX_LIMIT and d == 0:
        raise _err(name, "allocation", "device allocation needs proposals to rank (D > 0)")


def _validate_mixed(g: GraphDescriptor, r: int, completion_capacity: int) -> None:
    name = g.name
    b, w, c = g.batch_capacity, g.token_capacity, g.prefill_capacity
    if not (_is_pow2(b) and MIXED_BATCH_MIN <= b <= MIXED_BATCH_MAX):
        raise _err(name, "batch_capacity", "mixed batch capacity is a power of two from 2 through 64")
    if not 1 <= w <= completion_capacity:
        raise _err(name, "token_capacity",
                   f"mixed decode width is 1 through the completion token capacity {completion_capacity}")
    if c <= 0 or c % PROMPT_ALIGNMENT:
        raise _err(name, "prefill_capacity", f"must be positive and aligned to {PROMPT_ALIGNMENT}")
    if c < w:
        raise _err(name, "prefill_capacity", "prompt capacity is at least the decode width")
    if w == 1 and g.proposal_depth != 0:
        raise _err(name, "proposal_depth", "width-one graphs have D = 0")
    if w > 1:
        if not g.speculative:
            raise _err(name, "speculative", "wider mixed widths verify proposals")
        if w > g.proposal_depth + 1:
            raise _err(name, "token_capacity", f"W={w} needs at least {w - 1} proposals")
        if b * w > r:
            raise _err(name, "token_capacity", f"B*W={b * w} exceeds the token envelope R={r}")
    if g.target_capacity != g.max_packed_extent:
        raise _err(name, "target_capacity",
                   f"the maximum packed extent is C + (B-1)*W = {g.max_packed_extent}")


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
            name = (f"speculative[B={extents['batch_capacity']},W={extents['token_capacity']},"
                    f"D={extents['proposal_depth']},C=0,P={extents['target_capacity']}]")
            raise _err(name, missing[0], "a speculative program declares all four extents B, D, W and P; "
                       f"missing {missing}")
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
    if g.kind is GraphKind.MIXED:
        out["speculative"] = g.speculative
        out["proposal_depth"] = g.proposal_depth
    if g.duration_ms is not None:
        out["duration_ms"] = g.duration_ms
    return out


@dataclasses.dataclass(frozen=True)
class Catalog:
    """A loaded, validated set of prepared graphs.

    ``mode`` is the catalog's capture variant (``speculative`` or ``ordinary``);
    ``speculative_token_capacity`` is the R envelope; ``request_slots`` bounds residency.
    """

    name: str
    mode: str
    speculative_token_capacity: int
    request_slots: int
    graphs: tuple[GraphDescriptor, ...]
    completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY
    description: str = ""

    def __post_init__(self):
        if self.mode not in ("speculative", "ordinary"):
            raise ValueError(f"catalog {self.name!r}: field 'mode' must be speculative or ordinary")
        if not 1 <= self.request_slots <= MAX_REQUEST_SLOTS:
            raise ValueError(f"catalog {self.name!r}: field 'request_slots' must be 1..{MAX_REQUEST_SLOTS}")
        if self.speculative_token_capacity < 0:
            raise ValueError(f"catalog {self.name!r}: field 'speculative_token_capacity' must be >= 0")
        seen = set()
        for g in self.graphs:
            validate(g, speculative_token_capacity=self.speculative_token_capacity,
                     completion_token_capacity=self.completion_token_capacity)
            if g.key in seen:
                raise ValueError(f"catalog {self.name!r}: graph {g.name} is listed twice")
            if g.batch_capacity > self.request_slots:
                raise ValueError(f"catalog {self.name!r}: graph {g.name}: field 'batch_capacity' "
                                 f"exceeds request_slots={self.request_slots}")
            if self.mode == "ordinary" and (g.kind is GraphKind.SPECULATIVE or g.speculative):
                raise ValueError(f"catalog {self.name!r}: graph {g.name}: an ordinary catalog "
                                 "holds no speculative programs")
            seen.add(g.key)

    # -- views -------------------------------------------------------------------------
    def of_kind(self, *kinds: GraphKind) -> tuple[GraphDescriptor, ...]:
        return tuple(g for g in self.graphs if g.kind in kinds)

    @property
    def max_verification_width(self) -> int:
        """State-row reservation covers the widest verification across separate and mixed graphs."""
        widths = [g.token_capacity for g in self.graphs if g.kind.is_generation]
        return max(widths, default=1)

    @property
    def max_packed_extent(self) -> int:
        """The most target tokens any program of the catalog packs (capture headroom covers it)."""
        return max((g.packed_extent for g in self.graphs), default=0)

    @property
    def max_proposal_depth(self) -> int:
        return max((g.proposal_depth for g in self.graphs if g.kind.is_generation), default=0)

    def eligible(self, mode: DecodeMode, *, fixed_width: int | None = None) -> tuple[GraphDescriptor, ...]:
        """The graphs a loaded decode mode may select.

        - ordinary: decode and non-speculative mixed graphs (plus every non-generation kind);
        - fixed: host-allocated (query_length) speculative programs of the fixed width, width
          one included only when the fixed width is one, and speculative mixed graphs of that
          width; device allocation requires adaptive selection;
        - adaptive: every speculative program and speculative mixed graph.

        A mixed graph is eligible only in the variant matching the mode (its ``speculative``
        flag: draft-state maintenance), so a speculative mode never runs a mixed graph that
        would lose the draft context, and ordinary decoding never pays for one.
        """
        mode = DecodeMode(mode)
        if mode is not DecodeMode.ORDINARY and self.mode != "speculative":
            raise ValueError(f"catalog {self.name!r} holds no speculative programs for mode {mode.value}")
        if mode is DecodeMode.ORDINARY and self.mode != "ordinary":
            raise ValueError(
                f"catalog {self.name!r} is a speculative capture; loading with zero drafts selects "
                "the ordinary catalog")
        if mode is DecodeMode.FIXED:
            widths = {g.token_capacity for g in self.of_kind(GraphKind.SPECULATIVE)
                      if g.allocation is Allocation.QUERY_LENGTH}
            if fixed_width is None:
                fixed_width = max(widths, default=1)
            if fixed_width not in widths:
                raise ValueError(f"catalog {self.name!r}: no host-allocated speculative program of "
                                 f"fixed width {fixed_width}; captured widths {sorted(widths)}")
        out = []
        for g in self.graphs:
            if g.kind is GraphKind.SPECULATIVE:
                if mode is DecodeMode.FIXED and (g.allocation is not Allocation.QUERY_LENGTH
                                                 or g.token_capacity != fixed_width):
                    continue
            elif g.kind is GraphKind.MIXED:
                # The variant matching the loaded mode: draft-state maintenance in fixed and
                # adaptive speculation (width one included), none in ordinary decoding.
                if g.speculative != (mode is not DecodeMode.ORDINARY):
                    continue
                if mode is DecodeMode.FIXED and g.token_capacity != fixed_width:
                    continue
            out.append(g)
        return tuple(out)

    # -- JSON ----------------------------------------------------------------------------
    @classmethod
    def from_json(cls, obj: dict) -> "Catalog":
        if not isinstance(obj, dict):
            raise ValueError("a catalog file is a JSON object")
        for field in ("name", "mode", "speculative_token_capacity", "request_slots", "graphs"):
            if field not in obj:
                raise ValueError(f"catalog: missing field {field!r}")
        if not isinstance(obj["graphs"], list):
            raise ValueError("catalog: field 'graphs' must be a list")
        return cls(
            name=str(obj["name"]),
            mode=obj["mode"],
            speculative_token_capacity=int(obj["speculative_token_capacity"]),
            request_slots=int(obj["request_slots"]),
            graphs=tuple(descriptor_from_json(g) for g in obj["graphs"]),
            completion_token_capacity=int(obj.get("completion_token_capacity",
                                                  DEFAULT_COMPLETION_TOKEN_CAPACITY)),
            description=str(obj.get("description", "")),
        )

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "mode": self.mode,
            "speculative_token_capacity": self.speculative_token_capacity,
            "request_slots": self.request_slots,
        }
        if self.description:
            out["description"] = self.description
        if self.completion_token_capacity != DEFAULT_COMPLETION_TOKEN_CAPACITY:
            out["completion_token_capacity"] = self.completion_token_capacity
        out["graphs"] = [descriptor_to_json(g) for g in self.graphs]
        return out

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "Catalog":
        path = pathlib.Path(path)
        try:
            obj = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"catalog {path}: not valid JSON: {e}") from None
        return cls.from_json(obj)

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def shipped_catalog(name: str = "synthetic-h200") -> Catalog:
    """A measured synthetic catalog shipped with the package."""
    ref = importlib.resources.files("helios_jax.catalogs").joinpath(f"{name}.json")
    return Catalog.from_json(json.loads(ref.read_text()))


# -- capacity planning ---------------------------------------------------------------------

def batch_buckets(concurrency: int, *, minimum: int = 1) -> list[int]:
    """Power-of-two request buckets through padded concurrency (next power of two)."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    top = 1 << (concurrency - 1).bit_length()
    return [b for b in (1 << i for i in range(top.bit_length())) if minimum <= b <= top]


def wider_prompt_bucket(prompt_buckets: Sequence[int]) -> int:
    """The single prompt bucket captured for each wider mixed width.

    It minimises max(P / P_min, P_max / P), the worst multiplicative distance to the shortest
    and the longest prompt chunk; ties choose the smaller bucket. For 64..4096 this is 512.
    """
    if not prompt_buckets:
        raise ValueError("no prompt buckets")
    lo, hi = min(prompt_buckets), max(prompt_buckets)
    return min(sorted(prompt_buckets), key=lambda p: max(p / lo, hi / p))


@dataclasses.dataclass(frozen=True)
class MixedShape:
    batch_capacity: int
    token_capacity: int
    prefill_capacity: int
    speculative: bool

    @property
    def proposal_depth(self) -> int:
        return self.token_capacity - 1

    @property
    def max_packed_extent(self) -> int:
        return self.prefill_capacity + (self.batch_capacity - 1) * self.token_capacity

    def descriptor(self) -> GraphDescriptor:
        return GraphDescriptor(
            kind=GraphKind.MIXED,
            batch_capacity=self.batch_capacity,
            token_capacity=self.token_capacity,
            prefill_capacity=self.prefill_capacity,
            proposal_depth=self.proposal_depth,
            target_capacity=self.max_packed_extent,
            speculative=self.speculative,
        )


def mixed_shapes(
    *,
    concurrency: int,
    prompt_buckets: Iterable[int],
    speculative: bool,
    wider_widths: Iterable[int] = (),
    speculative_token_capacity: int = 0,
    completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY,
) -> list[MixedShape]:
    """Bound the joint mixed catalog before tuning and compilation (``--mixed_prefill``).

    Each batch bucket of at least two rows (powers of two through padded concurrency) gets every
    prompt bucket at verification width one. A speculative capture additionally gets, per batch
    bucket, one graph for each wider width W (the captured proposal depths plus one) whose
    rectangular target rows B*W fit the envelope R and W fits the completion token capacity, at
    the single prompt bucket chosen by :func:`wider_prompt_bucket`. The prompt bucket limits the
    prompt/depth combinations; the envelope limits the batch/depth combinations.

    Ordinary capture adds only the width-one graphs, without draft-state updates.
    """
    prompts = sorted(set(int(p) for p in prompt_buckets))
    if not prompts:
        raise ValueError("mixed_shapes: at least one prompt bucket is required")
    shapes = []
    wider = sorted(set(int(w) for w in wider_widths if int(w) > 1)) if speculative else []
    wide_prompt = wider_prompt_bucket(prompts)
    for b in batch_buckets(concurrency, minimum=MIXED_BATCH_MIN):
        if b > MIXED_BATCH_MAX:
            continue
        for p in prompts:
            shapes.append(MixedShape(b, 1, p, speculative))
        for w in wider:
            if w <= completion_token_capacity and b * w <= speculative_token_capacity and w <= wide_prompt:
                shapes.append(MixedShape(b, w, wide_prompt, True))
    return shapes
