"""The scheduler's counters (:class:`Counters`) and their snapshot as plain numbers
(:class:`SchedulerStats`, ``Scheduler.stats()``).

The scheduler counts; it does not format. The server renders a snapshot as Prometheus text
(``helios_jax.serve.metrics.render_scheduler_stats``: the spec's ``flare_*`` series as
``helios_*``); benchmarks and the simulator read the same numbers.
"""

from __future__ import annotations

import collections
import dataclasses

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.plan import ExecutionClass, ScheduledPlan, TraceRecord


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


class Counters:
    """The scheduler's running counters: executions and raw time by accounting class, committed
    plans by program kind with their trace, and speculative programs and drafts."""

    def __init__(self) -> None:
        self.executions: collections.Counter[str] = collections.Counter()  # class -> count
        self.execution_ns: collections.Counter[str] = collections.Counter()  # class -> ns
        self.speculative: collections.Counter[str] = collections.Counter()  # programs, drafts
        self.accepted_by_position: collections.Counter[int] = collections.Counter()  # depth -> accepted
        self.offered_by_position: collections.Counter[int] = collections.Counter()  # depth -> offered
        self.selections: collections.Counter[str] = collections.Counter()  # graph kind -> committed plans
        self.trace: collections.deque[TraceRecord] = collections.deque(maxlen=4096)

    def committed(self, fence: int, plan: ScheduledPlan, observation_age_ns: int | None) -> None:
        self.selections[plan.graph.kind.value] += 1
        self.trace.append(TraceRecord.of(fence, plan, observation_age_ns))

    def executed(self, plan: ScheduledPlan, credited_ns: int) -> None:
        self.executions[plan.reason.value] += 1
        if plan.graph.kind is GraphKind.SPECULATIVE:
            self.speculative["programs"] += 1  # complete programs, not producer and target calls
        self.execution_ns[plan.reason.value] += credited_ns

    def drafts(self, learned: bool, offered: int, accepted: int) -> None:
        """A round's verified drafts; `learned`: offered by a learned proposal (a sampling draw),
        where copy proposals draw nothing."""
        self.speculative["drafts_offered"] += offered
        self.speculative["drafts_accepted"] += accepted
        if learned:
            self.speculative["learned_drafts"] += offered
            self.speculative["learned_accepted"] += accepted
        else:
            self.speculative["copy_drafts"] += offered
            self.speculative["copy_accepted"] += accepted
        for d in range(offered):
            self.offered_by_position[d + 1] += 1
            if d < accepted:
                self.accepted_by_position[d + 1] += 1

    def snapshot(self, refresh_credit_ms: float, learning_credit_ms: float) -> SchedulerStats:
        classes = [c.value for c in ExecutionClass]
        depths = sorted(self.offered_by_position)
        spec = self.speculative
        return SchedulerStats(
            executions=tuple((c, self.executions[c]) for c in classes),
            execution_ns=tuple((c, self.execution_ns[c]) for c in classes),
            selections=tuple(sorted(self.selections.items())),
            speculative_programs=spec["programs"],
            drafts_offered=spec["drafts_offered"],
            learned_draws=spec["learned_drafts"],
            drafts_accepted=spec["drafts_accepted"],
            accepted_by_position=tuple((d, self.accepted_by_position[d]) for d in depths),
            offered_by_position=tuple((d, self.offered_by_position[d]) for d in depths),
            refresh_credit_ms=refresh_credit_ms,
            learning_credit_ms=learning_credit_ms,
        )
