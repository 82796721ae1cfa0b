"""What callers read of a Scheduler: per-request pages and output, the frames in flight, the
owned resources, the counters and their ``stats()`` snapshot, under the names the engine, the
simulator, the benchmarks and the tests use.

Nothing here changes state. The state lives with the scheduler's collaborators
(``residents.Residents``: requests, request slots, KV pages; ``captures.Captures``: checkpoint
rows; ``stats.Counters``: executions, selections, drafts and the trace); :class:`SchedulerReads`
names it, and ``core.Scheduler`` (the lifecycle) inherits these reads.
"""

from __future__ import annotations

import collections

from helios_jax.scheduler.captures import Captures
from helios_jax.scheduler.checkpoints import CheckpointStore
from helios_jax.scheduler.plan import Frame, Handle, TraceRecord
from helios_jax.scheduler.refresh import Ledger
from helios_jax.scheduler.requests import Pool, Request, pages_for
from helios_jax.scheduler.residents import Residents
from helios_jax.scheduler.stats import Counters, SchedulerStats


class SchedulerReads:
    """Read-only views of a scheduler's state; ``core.Scheduler`` sets the attributes below."""

    residents: Residents
    captures: Captures
    counters: Counters
    frames: collections.deque[Frame]
    timing_ledger: Ledger
    acceptance_ledger: Ledger
    draft_storage: int
    max_model_len: int
    page_size: int

    def pages_needed(self, prompt_len: int, max_output: int) -> int:
        ceiling = min(prompt_len + max_output + self.draft_storage, self.max_model_len + self.draft_storage)
        return pages_for(ceiling, self.page_size)

    def can_admit(self, prompt_len: int, max_output: int) -> bool:
        needed = self.pages_needed(prompt_len, max_output)
        return self.slots.can_allocate() and self.pages.can_allocate(needed)

    def page_table(self, handle: Handle) -> list[int]:
        """The request's reserved KV page ids, in position order."""
        return list(self.residents.lookup(handle).pages)

    def output(self, handle: Handle) -> list[int]:
        return list(self.residents.lookup(handle).output)

    def stats(self) -> SchedulerStats:
        """The counters and ledger balances now (``helios_jax.serve.metrics`` renders them)."""
        return self.counters.snapshot(self.timing_ledger.balance_ms, self.acceptance_ledger.balance_ms)

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(f.fence for f in self.frames)

    def owned_pages(self) -> dict[int, int]:
        return self.pages.owned()

    def owned_slots(self) -> dict[int, int]:
        return self.slots.owned()

    @property
    def requests(self) -> dict[int, Request]:
        return self.residents.requests

    @property
    def slots(self) -> Pool:
        return self.residents.slots

    @property
    def pages(self) -> Pool:
        return self.residents.pages

    @property
    def checkpoints(self) -> CheckpointStore:
        return self.captures.checkpoints

    @property
    def executions(self) -> collections.Counter[str]:
        return self.counters.executions

    @property
    def execution_ns(self) -> collections.Counter[str]:
        return self.counters.execution_ns

    @property
    def speculative(self) -> collections.Counter[str]:
        return self.counters.speculative

    @property
    def accepted_by_position(self) -> collections.Counter[int]:
        return self.counters.accepted_by_position

    @property
    def offered_by_position(self) -> collections.Counter[int]:
        return self.counters.offered_by_position

    @property
    def selections(self) -> collections.Counter[str]:
        return self.counters.selections

    @property
    def trace(self) -> collections.deque[TraceRecord]:
        return self.counters.trace
