"""A snapshot of the scheduler's counters as plain numbers (``Scheduler.stats()``).

The scheduler counts; it does not format. The server renders a snapshot as Prometheus text
(``helios_jax.serve.metrics.render_scheduler_stats``: the spec's ``flare_*`` series as
``helios_*``); benchmarks and the simulator read the same numbers.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SchedulerStats:
    """Counters and ledger balances at one moment; label/value pairs in exposition order."""

    executions: tuple[tuple[str, int], ...]  # (accounting class, executions), every class
    execution_ns: tuple[tuple[str, int], ...]  # (accounting class, raw execution time), every class
    selections: tuple[tuple[str, int], ...]  # (program kind, committed plans), sorted by kind
    speculative_programs: int  # complete speculative programs (not producer or target calls)
    drafts_offered: int
    learned_draws: int  # drafts offered by learned proposals (copy proposals draw nothing)
    drafts_accepted: int
    accepted_by_position: tuple[tuple[int, int], ...]  # (draft depth, accepted), depths offered
    offered_by_position: tuple[tuple[int, int], ...]  # (draft depth, offered), sorted by depth
    refresh_credit_ms: float  # the timing-refresh ledger balance
    learning_credit_ms: float  # the acceptance-learning ledger balance
