"""Capacity planning: which batch buckets and mixed shapes a capture prepares (``--mixed_prefill``).

These bound the catalog before tuning and compilation; ``helios_jax.engine_config`` calls them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from helios_jax.catalog_descriptor import (
    DEFAULT_COMPLETION_TOKEN_CAPACITY,
    MIXED_BATCH_MAX,
    MIXED_BATCH_MIN,
    GraphDescriptor,
    GraphKind,
)


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
