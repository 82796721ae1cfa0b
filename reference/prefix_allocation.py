"""Numpy oracles for the speculative prefix allocation (the SpeculativePrefixLimit binding).

The semantics are stated once, with a worked example, in `helios_jax.kernels.prefix_allocation`;
this module restates them twice more, independently of jax:

- `prefix_allocation_naive` walks the rule literally with Python loops and tuples: every step
  lists each lane's open frontier as `(-value, length, slot)` and admits the smallest tuple.
  It is the oracle that golden files and the exhaustive grid trust.
- `prefix_allocation_batched` is the same rule vectorised over a leading batch of independent
  problems, so that the exhaustive small-case grid (hundreds of thousands of problems) runs in
  seconds. It is checked against the naive oracle on that grid.

Both rank in float32, the kernel's precision: a host caller holding float64 probabilities
rounds them to float32 first, or two values equal in float32 could be ranked apart.
"""

from __future__ import annotations

import numpy as np


def prefix_allocation_naive(joint_prob, ceilings, active, capacity: int) -> np.ndarray:
    """Allocates target rows by the greedy causal frontier, one admission at a time.

    Args:
      joint_prob: f32[B, D] (nested lists allowed); entry [b, d] is the probability that
        proposals 0..d of lane b all survive.
      ceilings: i32[B] target rows of each lane including its pending token.
      active: bool[B] lanes of the cohort.
      capacity: the program's aggregate target capacity P.

    Returns:
      i32[B] query lengths: 1..ceiling for an active lane, 0 for an inactive one.

    Raises:
      ValueError: a NaN probability, or a capacity below the number of active lanes.
    """
    probs = np.asarray(joint_prob, dtype=np.float32).reshape(len(ceilings), -1)
    depth = probs.shape[1]
    if np.isnan(probs).any():
        raise ValueError("joint_prob holds NaN")
    lengths = [1 if bool(a) else 0 for a in active]
    remaining = int(capacity) - sum(lengths)
    if remaining < 0:
        raise ValueError(f"capacity {capacity} is below the {sum(lengths)} active lanes")
    while remaining > 0:
        frontiers = []
        for slot, length in enumerate(lengths):
            if active[slot] and length < ceilings[slot] and length - 1 < depth:
                # Lane `slot` holds rows 0..length-1; its next row verifies proposal length-1.
                frontiers.append((-float(probs[slot, length - 1]), length, slot))
        if not frontiers:
            break
        _, _, slot = min(frontiers)  # highest value, then shorter prefix, then lower slot
        lengths[slot] += 1
        remaining -= 1
    return np.asarray(lengths, dtype=np.int32)


def prefix_allocation_batched(joint_prob, ceilings, active, capacity) -> np.ndarray:
    """`prefix_allocation_naive` over a batch of N independent problems, vectorised.

    Args:
      joint_prob: f32[N, B, D].
      ceilings: i32[N, B].
      active: bool[N, B].
      capacity: i32[N] (or a scalar shared by every problem).

    Returns:
      i32[N, B] query lengths. Inputs are assumed valid (no NaN, capacity >= active count).
    """
    probs = np.asarray(joint_prob, dtype=np.float32)
    n, b, depth = probs.shape
    active = np.asarray(active, dtype=bool)
    ceilings = np.asarray(ceilings, dtype=np.int64)
    lengths = active.astype(np.int64)
    if depth == 0:
        return lengths.astype(np.int32)
    # Each lane grows to min(ceiling, D + 1) rows; the admissions left are bounded by both the
    # aggregate capacity and the room under those limits, so the loop below runs at most B*D times.
    limit = np.where(active, np.minimum(ceilings, depth + 1), 0)
    remaining = np.broadcast_to(np.asarray(capacity, dtype=np.int64), (n,)) - lengths.sum(axis=1)
    todo = np.minimum(np.maximum(remaining, 0), np.maximum(limit - lengths, 0).sum(axis=1))
    rows = np.arange(n)
    # Tie order inside one value: shorter prefix first, then lower slot, as one integer key.
    slot = np.arange(b)
    for step in range(int(todo.max(initial=0))):
        going = todo > step
        frontier = np.take_along_axis(probs, np.clip(lengths - 1, 0, depth - 1)[..., None], 2)[..., 0]
        is_open = (lengths < limit) & going[:, None]
        value = np.where(is_open, frontier, -np.inf)
        best = value.max(axis=1, keepdims=True)
        tie_key = np.where(is_open & (value == best), lengths * b + slot, np.iinfo(np.int64).max)
        chosen = tie_key.argmin(axis=1)
        lengths[rows[going], chosen[going]] += 1
    return lengths.astype(np.int32)
