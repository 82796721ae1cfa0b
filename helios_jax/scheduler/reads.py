"""What callers read of a Scheduler: per-request pages and output, the frames in flight, the
owned resources, the counters and their ``stats()`` snapshot, and the priced request views a
decision reads, under the names the engine, the simulator, the benchmarks and the tests use.

Nothing here changes state (the views keep the normalizers per cost version: a cache). The
state lives with the scheduler's collaborators (``residents.Residents``: requests, request
slots, KV pages; ``captures.Captures``: checkpoint rows; ``stats.Counters``: executions,
selections, drafts and the trace); :class:`SchedulerReads` names it, and ``core.Scheduler``
(the lifecycle) inherits these reads.
"""

from __future__ import annotations

import collections

from helios_jax.scheduler import learning, policy, pricing, service
from helios_jax.scheduler.captures import Captures
from helios_jax.scheduler.checkpoints import CheckpointStore
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.frames import planning_start_ns
from helios_jax.scheduler.plan import Frame, Handle, TraceRecord
from helios_jax.scheduler.refresh import Ledger
from helios_jax.scheduler.requests import Pool, Request, pages_for
from helios_jax.scheduler.residents import Residents
from helios_jax.scheduler.stats import Counters, SchedulerStats
from helios_jax.scheduler.view_columns import ResidentViews


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
    graphs: policy.PreparedGraphs
    costs: CostModel
    policy: PolicyConfig
    population: learning.Population
    now_ns: int
    _normalizer_cache: tuple[int, service.Normalizers] | None

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

    # == priced views (what plan() reads) =======================================================
    def _normalizers(self) -> service.Normalizers:
        """The loaded catalog's measured generation programs, recomputed when an estimate changes."""
        version = self.costs.version
        if self._normalizer_cache is None or self._normalizer_cache[0] != version:
            durations = self.graphs.durations(self.costs)  # the estimates, read once per version
            self._normalizer_cache = (version, service.Normalizers.of(self.graphs.delivery, durations))
        return self._normalizer_cache[1]

    def views(self, start_ns: int | None = None, optimistic: bool = True) -> ResidentViews:
        """Request views with prices and ages projected to the planning start (``pricing.views``;
        `optimistic` false: the decoders' optimistic estimates, read only by a probe, left empty)."""
        start = planning_start_ns(self.frames, self.now_ns) if start_ns is None else start_ns
        return pricing.views(self._pricing_inputs(optimistic), start)

    def _pricing_inputs(self, optimistic: bool) -> pricing.PricingInputs:
        proposes = self.graphs.max_depth > 0  # else no decision reads an acceptance estimate
        return pricing.PricingInputs(
            self.requests,
            tuple(self.frames),
            self.policy,
            self._normalizers(),
            self.population.acceptance_pools,
            self.max_model_len,
            optimistic and proposes,
            survival=proposes,
        )

    def _probe_views(self, views: ResidentViews) -> ResidentViews:
        """What an acceptance probe scores: `views` (priced without optimistic estimates) with
        each decoder's survival replaced by its optimistic estimate (``learning.probe_views``)."""
        decoders = views.decoders.rid.tolist()
        return learning.probe_views(views, pricing.optimistic_estimates(self._pricing_inputs(True), decoders))
