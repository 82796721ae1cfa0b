"""Speculative prefix allocation: the device side of the SpeculativePrefixLimit binding.

A complete speculative program under a SpeculativePrefixLimit binding generates its D
proposals for every lane of a fixed cohort, evaluates their causal confidence, and only then
decides how many target (verification) rows each lane gets, within the program's aggregate
target capacity P. The host fixed the cohort and an immutable ceiling per lane; the device may
not change either (spec: "Speculative graph coverage").

Inputs:
  joint_prob  f32[B, D]  entry [b, d]: probability that proposals 0..d of lane b all survive
  ceilings    i32[B]     target rows of lane b including its pending token; 1..D+1 when active
  active      bool[B]    the cohort's lanes; inactive lanes (padding) get nothing
  capacity    int        P, at least the number of active lanes

Rule, as one greedy loop over admissions:
  1. Every active lane starts with one row (its pending token); inactive lanes get 0 for good.
  2. remaining = P - (number of active lanes).
  3. While remaining > 0: a lane b holding L rows is *open* when L < ceilings[b] and
     L - 1 < D; its frontier is proposal L - 1, worth joint_prob[b, L - 1]. Admit the open
     frontier of highest value; ties go to the shorter prefix (smaller L), then the lower slot.
     That lane now holds L + 1 rows; remaining -= 1. Stop early when no lane is open.
  The result is i32[B] query lengths: sum <= P, 1..ceiling for active lanes, 0 for inactive.

Why these choices:
  - A lane's rows are always a prefix (row L verifies proposal L - 1 only once rows 0..L-1 are
    in), so the allocation is causal by construction: the frontier is the only candidate.
  - The ranking is the joint probability itself, never the host's service prices: frozen host
    prices rank cohorts, not the device's causal frontier. The frontier is greedy even when a
    row is not monotone along d (a confidence model may produce such rows); the lane's later
    entries only count once its earlier ones were admitted.
  - Zero-probability frontiers are still admitted while capacity remains: the whole captured
    program is priced, so an unused physical row costs nothing extra and may still verify.
  - The admission order does not depend on P; P only truncates it. Hence raising P never
    shrinks any lane.

Worked example (B = 3, D = 3, P = 6):
  joint_prob = [[0.9, 0.5, 0.1],     ceilings = [4, 2, 4]
                [0.9, 0.8, 0.7],     active   = [True, True, True]
                [0.5, 0.5, 0.4]]
  start lengths [1, 1, 1], remaining 3; frontiers: lane0 0.9 (L=1), lane1 0.9 (L=1), lane2 0.5
  step 1: 0.9 tie between lanes 0 and 1 at equal L=1 -> lower slot: lane 0 -> [2, 1, 1]
  step 2: frontiers lane0 0.5 (L=2), lane1 0.9, lane2 0.5 -> lane 1 -> [2, 2, 1]; lane 1 is now
          closed by its ceiling 2 (its 0.8 is never offered)
  step 3: lane0 0.5 (L=2) and lane2 0.5 (L=1) tie -> shorter prefix: lane 2 -> [2, 2, 2]
  result [2, 2, 2] (sum 6 = P).

Under `jax.jit` the value checks of the entry (NaN, ceilings, capacity) cannot run; the kernel
then treats a NaN probability as -inf (admitted last) and a capacity below the active count as
"no admissions", and the caller owns those guarantees.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from helios_jax.kernels.jax_compat import is_tracer, triton_compiler_params

_NEG_INF = float("-inf")


def prefix_allocation_kernel(
    joint_prob_ref,  # f32[Bp, Dp]  padded lanes and proposals are inactive / out of depth
    ceilings_ref,  # i32[Bp]
    active_ref,  # i32[Bp]  1 for an active lane (bool refs lower poorly on GPU)
    capacity_ref,  # i32[1]
    lengths_ref,  # out i32[Bp]
    *,
    depth: int,  # the real D before padding
):
    """One program, one cohort: loops over admissions with vector ops over the [Bp, Dp] block."""
    probs = joint_prob_ref[...]
    probs = jnp.where(jnp.isnan(probs), _NEG_INF, probs)  # NaN ranks last, never first
    bp, dp = probs.shape
    active = active_ref[...] != 0
    slot = lax.broadcasted_iota(jnp.int32, (bp,), 0)
    column = lax.broadcasted_iota(jnp.int32, (bp, dp), 1)
    start = active.astype(jnp.int32)
    # A lane may grow to min(ceiling, D + 1) rows; the bound D + 1 keeps padded columns out.
    limit = jnp.where(active, jnp.minimum(ceilings_ref[...], depth + 1), 0)
    room = jnp.sum(jnp.maximum(limit - start, 0))
    # Every admission consumes one unit of room, so the loop runs exactly this many steps and
    # each step finds an open frontier.
    steps = jnp.clip(capacity_ref[0] - jnp.sum(start), 0, room)

    def admit_best_frontier(_, lengths):  # lengths: i32[Bp]
        is_open = lengths < limit
        # Gather joint_prob[b, lengths[b] - 1] as a masked row max (no per-lane gather needed).
        at_frontier = column == (lengths - 1)[:, None]
        frontier = jnp.max(jnp.where(at_frontier, probs, _NEG_INF), axis=1)
        value = jnp.where(is_open, frontier, _NEG_INF)
        tied = is_open & (value == jnp.max(value))
        shortest = jnp.min(jnp.where(tied, lengths, jnp.int32(2**30)))
        tied = tied & (lengths == shortest)
        chosen = jnp.min(jnp.where(tied, slot, jnp.int32(bp)))
        return lengths + (slot == chosen).astype(jnp.int32)

    lengths_ref[...] = lax.fori_loop(0, steps, admit_best_frontier, start)


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.partial(jax.jit, static_argnames=("interpret",))
def _prefix_allocation_device(joint_prob, ceilings, active, capacity, *, interpret: bool):
    b, depth = joint_prob.shape
    # Triton blocks need power-of-two extents: padded lanes are inactive, padded columns lie
    # beyond `depth` and are never a frontier.
    bp, dp = _next_power_of_two(b), _next_power_of_two(max(depth, 1))
    probs = jnp.pad(joint_prob.astype(jnp.float32), ((0, bp - b), (0, dp - depth)))
    ceilings = jnp.pad(ceilings.astype(jnp.int32), (0, bp - b))
    active = jnp.pad(active.astype(jnp.int32), (0, bp - b))
    capacity = jnp.reshape(capacity.astype(jnp.int32), (1,))
    lengths = pl.pallas_call(
        functools.partial(prefix_allocation_kernel, depth=depth),
        out_shape=jax.ShapeDtypeStruct((bp,), jnp.int32),
        interpret=interpret,
        compiler_params=triton_compiler_params(num_warps=1, num_stages=1),
        name="prefix_allocation",
    )(probs, ceilings, active, capacity)
    return lengths[:b]


def _is_concrete(*xs) -> bool:
    return not any(is_tracer(x) for x in xs)


def _check_shapes(joint_prob, ceilings, active, capacity) -> None:
    if joint_prob.ndim != 2 or not jnp.issubdtype(joint_prob.dtype, jnp.floating):
        raise ValueError(f"joint_prob must be a float [B, D] array, got {joint_prob.dtype}{joint_prob.shape}")
    if ceilings.ndim != 1 or not jnp.issubdtype(ceilings.dtype, jnp.integer):
        raise ValueError(f"ceilings must be an integer [B] array, got {ceilings.dtype}{ceilings.shape}")
    if active.ndim != 1 or active.dtype != jnp.bool_:
        raise ValueError(f"active must be a bool [B] array, got {active.dtype}{active.shape}")
    if not joint_prob.shape[0] == ceilings.shape[0] == active.shape[0]:
        raise ValueError(
            f"lane counts differ: joint_prob {joint_prob.shape}, ceilings {ceilings.shape}, "
            f"active {active.shape}"
        )
    if capacity.ndim != 0 or not jnp.issubdtype(capacity.dtype, jnp.integer):
        raise ValueError(f"capacity must be an integer scalar, got {capacity.dtype}{capacity.shape}")


def _check_values(joint_prob, ceilings, active, capacity) -> None:
    probs, ceilings, active = np.asarray(joint_prob), np.asarray(ceilings), np.asarray(active)
    depth = probs.shape[1]
    if np.isnan(probs).any():
        raise ValueError("joint_prob holds NaN")
    if int(capacity) < int(active.sum()):
        raise ValueError(f"capacity {int(capacity)} is below the {int(active.sum())} active lanes")
    bad = active & ((ceilings < 1) | (ceilings > depth + 1))
    if bad.any():
        raise ValueError(f"active lanes {np.flatnonzero(bad).tolist()} have ceilings outside 1..{depth + 1}")


def prefix_allocation(joint_prob, ceilings, active, capacity, *, interpret: bool = False) -> jax.Array:
    """Allocates target rows to the cohort's lanes by the best causal frontier (module docstring).

    Shape and dtype checks always run; value checks run where the inputs are concrete (not
    inside a caller's `jax.jit`). The device work is one jitted Pallas call, compiled once per
    (B, D) shape: a changing capacity does not recompile.

    Args:
      joint_prob: f32[B, D] joint prefix probabilities (any float dtype; ranked in float32).
      ceilings: i32[B] per-lane ceilings including the pending token.
      active: bool[B] active-lane mask.
      capacity: aggregate target capacity P (int or integer scalar array, may be traced).
      interpret: run the Pallas kernel in interpret mode (CPU tests).

    Returns:
      i32[B] query lengths.

    Raises:
      ValueError: bad ranks, dtypes or lane counts; for concrete inputs also a NaN
        probability, a capacity below the active count, or an active ceiling outside 1..D+1.
    """
    joint_prob, ceilings, active, capacity = map(jnp.asarray, (joint_prob, ceilings, active, capacity))
    _check_shapes(joint_prob, ceilings, active, capacity)
    if _is_concrete(joint_prob, ceilings, active, capacity):
        _check_values(joint_prob, ceilings, active, capacity)
    return _prefix_allocation_device(joint_prob, ceilings, active, capacity, interpret=interpret)


@jax.jit
def prefix_allocation_reference(joint_prob, ceilings, active, capacity) -> jax.Array:
    """Pure-jnp restatement of the rule: one `lax.sort` per admission, no Pallas.

    Each step sorts the lanes by (closed, -value, length, slot) and admits the first if it is
    open. Same argument contract as `prefix_allocation`; no value checks (it is jitted).
    """
    b, depth = joint_prob.shape
    start = active.astype(jnp.int32)
    if depth == 0:
        return start
    probs = joint_prob.astype(jnp.float32)
    probs = jnp.where(jnp.isnan(probs), _NEG_INF, probs)
    probs = jnp.where(probs == 0, 0.0, probs)  # -0.0 and 0.0 must tie: lax.sort orders them
    slot = jnp.arange(b, dtype=jnp.int32)
    remaining = jnp.asarray(capacity, jnp.int32) - jnp.sum(start)

    def admit(_, lengths):
        is_open = active & (lengths < ceilings) & (lengths - 1 < depth)
        frontier = jnp.take_along_axis(probs, jnp.clip(lengths - 1, 0, depth - 1)[:, None], axis=1)[:, 0]
        keys = (jnp.where(is_open, 0, 1), -frontier, lengths, slot)
        first = lax.sort(keys, num_keys=4)[3][0]
        return lengths.at[first].add(is_open[first].astype(jnp.int32))

    return lax.fori_loop(0, jnp.clip(remaining, 0, b * depth), admit, start)
