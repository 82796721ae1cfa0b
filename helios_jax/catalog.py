"""Prepared-graph catalog: a loaded, validated set of descriptors, and the names around it.

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

Shape contracts are enforced when a catalog is built; a violation raises ``ValueError``
naming the graph and the field.

The catalog's rooms, each importable from here as before:

  catalog_descriptor  GraphKind, Allocation, DecodeMode, CostKey, GraphDescriptor, the extent
                      constants, and a descriptor's JSON entry (descriptor_from_json/_to_json)
  catalog_contracts   validate: the spec's shape contracts for one descriptor
  catalog_planning    batch_buckets, wider_prompt_bucket, MixedShape, mixed_shapes
  catalog (here)      Catalog (views, eligibility by decode mode, JSON file) and shipped_catalog
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import pathlib

from helios_jax.catalog_contracts import validate
from helios_jax.catalog_descriptor import (
    DEFAULT_COMPLETION_TOKEN_CAPACITY,
    MAX_REQUEST_SLOTS,
    MIXED_BATCH_MAX,
    MIXED_BATCH_MIN,
    PROMPT_ALIGNMENT,
    SPECULATIVE_EXTENTS,
    Allocation,
    CostKey,
    DecodeMode,
    GraphDescriptor,
    GraphKind,
    descriptor_from_json,
    descriptor_to_json,
)
from helios_jax.catalog_planning import (
    MixedShape,
    batch_buckets,
    mixed_shapes,
    wider_prompt_bucket,
)

__all__ = [
    "DEFAULT_COMPLETION_TOKEN_CAPACITY",
    "MAX_REQUEST_SLOTS",
    "MIXED_BATCH_MAX",
    "MIXED_BATCH_MIN",
    "PROMPT_ALIGNMENT",
    "SPECULATIVE_EXTENTS",
    "Allocation",
    "Catalog",
    "CostKey",
    "DecodeMode",
    "GraphDescriptor",
    "GraphKind",
    "MixedShape",
    "batch_buckets",
    "descriptor_from_json",
    "descriptor_to_json",
    "mixed_shapes",
    "shipped_catalog",
    "validate",
    "wider_prompt_bucket",
]


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
            validate(
                g,
                speculative_token_capacity=self.speculative_token_capacity,
                completion_token_capacity=self.completion_token_capacity,
            )
            if g.key in seen:
                raise ValueError(f"catalog {self.name!r}: graph {g.name} is listed twice")
            if g.batch_capacity > self.request_slots:
                raise ValueError(
                    f"catalog {self.name!r}: graph {g.name}: field 'batch_capacity' "
                    f"exceeds request_slots={self.request_slots}"
                )
            if self.mode == "ordinary" and (g.kind is GraphKind.SPECULATIVE or g.speculative):
                raise ValueError(
                    f"catalog {self.name!r}: graph {g.name}: an ordinary catalog "
                    "holds no speculative programs"
                )
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
                "the ordinary catalog"
            )
        if mode is DecodeMode.FIXED:
            widths = {
                g.token_capacity
                for g in self.of_kind(GraphKind.SPECULATIVE)
                if g.allocation is Allocation.QUERY_LENGTH
            }
            if fixed_width is None:
                fixed_width = max(widths, default=1)
            if fixed_width not in widths:
                raise ValueError(
                    f"catalog {self.name!r}: no host-allocated speculative program of "
                    f"fixed width {fixed_width}; captured widths {sorted(widths)}"
                )
        out = []
        for g in self.graphs:
            if g.kind is GraphKind.SPECULATIVE:
                if mode is DecodeMode.FIXED and (
                    g.allocation is not Allocation.QUERY_LENGTH or g.token_capacity != fixed_width
                ):
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
    def from_json(cls, obj: dict) -> Catalog:
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
            completion_token_capacity=int(
                obj.get("completion_token_capacity", DEFAULT_COMPLETION_TOKEN_CAPACITY)
            ),
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
    def load(cls, path: str | pathlib.Path) -> Catalog:
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
