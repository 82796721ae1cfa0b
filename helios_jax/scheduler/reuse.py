"""Plan reuse: ``Scheduler.plan()`` returns its last plan while nothing the plan reads changed.

``plan()`` is pure, so a second call with no state change in between must return an equal plan;
this returns the same (frozen) one without recomputing it. What a plan reads is the scheduler's
state: requests, frames in flight, cost estimates (and their staleness at ``now_ns``), ledgers,
the learned population, the policy and the clock. Every public method that changes any of them
(:data:`MUTATORS`) drops the memo, and the memo also carries a key of the clock, the cost
version, the request and frame counts, the ledgers and the pooled estimates' revisions, so that a
change made through a collaborator (``costs.observe``, a ledger) still misses.

Proof mode: with ``HELIOS_PLAN_REUSE_CHECK=1`` in the environment (or ``CHECK`` set true), every
reuse also computes the fresh plan and raises :class:`StalePlan` unless the two are equal.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

CHECK = os.environ.get("HELIOS_PLAN_REUSE_CHECK", "") not in ("", "0")

# Every Scheduler method that changes what plan() reads (``_complete`` serves the four
# completion entry points).
MUTATORS = (
    "configure_policy",
    "seed_costs",
    "admit",
    "restrict_width",
    "offer_copy",
    "cancel",
    "preempt",
    "finish",
    "advance_to",
    "commit",
    "_complete",
    "published_output",
)


class StalePlan(AssertionError):
    """A reused plan differs from a fresh one: an invalidation misses a dependency."""


def key(sched: Any) -> tuple:
    """What a mutation through a collaborator would change, cheaply (see the module docstring)."""
    pools = sched.population.acceptance_pools
    return (
        sched.now_ns,
        sched.costs.version,
        len(sched.requests),
        tuple(f.fence for f in sched.frames),
        _ledger(sched.timing_ledger),
        _ledger(sched.acceptance_ledger),
        tuple(pools[s].revision for s in sorted(pools)),
        id(sched.policy),
    )


def _ledger(ledger: Any) -> tuple:
    return (ledger.balance_ms, ledger.episode_active)


def memoized(sched: Any, compute: Callable[[], Any]) -> Any:
    """The memoized plan when its key still holds, else a fresh one (memoized)."""
    memo = sched._plan_memo
    k = key(sched)
    if memo is not None and memo[0] == k and not CHECK:
        return memo[1]
    fresh = compute()
    if memo is not None and memo[0] == k and not (memo[1] == fresh or repr(memo[1]) == repr(fresh)):
        raise StalePlan(f"reused plan {memo[1]!r} != fresh plan {fresh!r}")
    sched._plan_memo = (k, fresh)
    return fresh


def _invalidating(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self._plan_memo = None
        try:
            return method(self, *args, **kwargs)
        finally:
            self._plan_memo = None

    return wrapper


def install(cls: T) -> T:
    """Wrap every mutator of `cls` so that it drops the memoized plan (before and after)."""
    for name in MUTATORS:
        setattr(cls, name, _invalidating(getattr(cls, name)))
    cls._plan_memo = None  # type: ignore[attr-defined]
    return cls
