"""Speculative round candidates and confidence forecasts.

Confidence forecasts
--------------------
A confidence-producing program writes, per lane, the joint prefix probabilities of its produced
proposals (the f32 sidecar ``[2, request_slots, draft_capacity]``; rank zero's drives host
decisions). A request's forecast averages its completed joint-prefix probabilities, starting from
a population prior that begins at 0.5**d and moves 1/64 toward each completed prefix probability.
Observations stop at the lane's frozen ceiling min(D + 1, W): a lane with ceiling c yields
forecast observations for depths 1..c-1. Forecasts and verified acceptance are separate
estimates (``speculation.py``); only completed rounds update either.

Device allocation, host side
----------------------------
Under a ``prefix_limit`` binding the program allocates target rows itself: every active lane
keeps its pending-token row; the remaining rows go, one at a time, to the best immediate causal
frontier by joint prefix probability, ties to the shorter prefix and then the lower original
slot, never beyond a lane's ceiling. :func:`allocate_prefix_rows` is the host (numpy) statement
of that rule; the Pallas kernel in ``helios_jax.kernels.prefix_allocation`` must agree with it on
the shared golden cases. The host uses it with forecast probabilities to price ragged cohorts.

Example: joint_prob = [[0.9, 0.5], [0.6, 0.6]], ceilings = [3, 3], capacity 4. Both lanes get
their pending row (2 used). Frontiers: lane 0 depth 1 (0.9), lane 1 depth 1 (0.6): admit lane 0.
Frontiers now 0.5 (lane 0 depth 2) and 0.6: admit lane 1. Capacity reached: lengths [2, 2].
"""

from __future__ import annotations

import heapq

import numpy as np


def allocate_prefix_rows(joint_prob, ceilings, active, capacity: int) -> np.ndarray:
    """Host statement of the device allocation; returns i32[B] query lengths.

    Args:
      joint_prob: f[B, D]; entry d is the probability that proposals 0..d all survive.
      ceilings: i[B] immutable lane ceilings (rows including the pending token).
      active: bool[B] active-lane mask.
      capacity: aggregate target rows P (at least the number of active lanes).
    """
    # Rank in float32, the device's precision, so host and kernel break the same ties.
    prob = np.asarray(joint_prob, dtype=np.float32).astype(np.float64)
    ceil = np.asarray(ceilings, dtype=np.int64)
    act = np.asarray(active, dtype=bool)
    if prob.ndim != 2 or ceil.shape != (prob.shape[0],) or act.shape != (prob.shape[0],):
        raise ValueError(f"shapes: joint_prob {prob.shape}, ceilings {ceil.shape}, active {act.shape}")
    b, d = prob.shape
    n_active = int(act.sum())
    if capacity < n_active:
        raise ValueError(f"capacity {capacity} is below the {n_active} active lanes")
    if np.any(act & ((ceil < 1) | (ceil > d + 1))):
        raise ValueError(f"active ceilings must lie in 1..D+1={d + 1}, got {ceil}")
    if np.any(np.isnan(prob)):
        raise ValueError("joint probabilities contain NaN")
    lengths = act.astype(np.int64)
    remaining = capacity - n_active
    if remaining <= 0:
        return lengths.astype(np.int32)
    return _greedy(prob.tolist(), lengths.tolist(), np.where(act, ceil, 0).tolist(), remaining)


def allocate_cohort_rows(joint_prob: np.ndarray, ceilings: np.ndarray, capacity: int) -> np.ndarray:
    """:func:`allocate_prefix_rows` with every lane active, for a caller whose inputs hold its
    checks by construction (the selector's cohorts: f[B, D] forecasts, ceilings within 1..D+1,
    at most `capacity` lanes); NaN probabilities still raise."""
    prob = np.asarray(joint_prob, dtype=np.float32).astype(np.float64)
    if np.isnan(prob).any():
        raise ValueError("joint probabilities contain NaN")
    b = prob.shape[0]
    remaining = capacity - b
    if remaining <= 0:
        return np.ones(b, dtype=np.int32)
    limit = np.asarray(ceilings)
    if int(limit.sum()) <= capacity:  # room for every lane up to its ceiling: the greedy's end
        return limit.astype(np.int32)
    return _greedy(prob.tolist(), [1] * b, limit.tolist(), remaining)


def _greedy(rows: list[list[float]], length: list[int], limit: list[int], remaining: int) -> np.ndarray:
    """The greedy frontier over lanes with `length` rows each, up to `limit`, for `remaining` more
    rows: a heap of (-frontier, length, lane) whose minimum is the best frontier, ties to the
    shorter prefix, then the lower slot; one entry per open lane."""
    heap = [(-rows[i][length[i] - 1], length[i], i) for i in range(len(length)) if length[i] < limit[i]]
    heapq.heapify(heap)
    while remaining > 0 and heap:
        _, n, lane = heapq.heappop(heap)
        length[lane] = n + 1
        remaining -= 1
        if n + 1 < limit[lane]:
            heapq.heappush(heap, (-rows[lane][n], n + 1, lane))
    return np.array(length, dtype=np.int32)


def prefix_allocation_order(joint_prob: np.ndarray, ceilings: np.ndarray):
    """Extension rows of monotone inputs in the device's admission order.

    For joint probabilities that do not increase with depth the greedy frontier admits
    extension rows exactly in the order (probability desc, depth asc, lane asc); this returns
    that order as (lane, depth) arrays so that many cohorts of one population can be priced with
    one sort (``utility.adaptive_ragged``).
    """
    prob = np.asarray(joint_prob, dtype=np.float32).astype(np.float64)
    b, d = prob.shape
    depth_idx = np.broadcast_to(np.arange(1, d + 1), (b, d))
    lane_idx = np.broadcast_to(np.arange(b)[:, None], (b, d))
    valid = depth_idx < np.asarray(ceilings)[:, None]
    lanes, depths, probs = lane_idx[valid], depth_idx[valid], prob[valid]
    order = np.lexsort((lanes, depths, -probs))
    return lanes[order], depths[order]


def forecast_observations(joint_prob, ceiling: int, depth: int) -> np.ndarray:
    """A completed lane's forecast observations: its sidecar row up to the frozen ceiling.

    A lane with ceiling c (rows including the pending token) observes depths 1..c-1; deeper
    depths are NaN (unobserved). Peer ranks' rows need only be valid probabilities; the caller
    passes rank zero's.
    """
    obs = np.full(depth, np.nan)
    probs = np.asarray(joint_prob, dtype=np.float64).reshape(-1)
    n = max(0, min(ceiling - 1, probs.size, depth))
    head = probs[:n]
    if np.any(~np.isfinite(head)) or np.any((head < 0) | (head > 1)):
        raise ValueError(f"confidence values must be valid probabilities, got {head}")
    obs[:n] = head
    return obs
