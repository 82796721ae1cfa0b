"""The Scheduler: request resources, planning, commit and completion on the caller's clock.

A request's life through this object (the engine drives it; time is passed in):

1. ``admit`` reserves a request slot and the KV pages of the request's whole execution
   ceiling (prompt, output limit and the declared draft storage) and returns a ``Handle``.
2. ``advance_to(now)``; ``plan()`` (pure) projects prices and ages to the end of queued work
   (``pricing.py``), selects by value per time (the ``policy`` package) or, funded by the ledgers, a
   timing refresh or an acceptance probe, and returns a frozen ``ScheduledPlan``.
3. ``commit(plan, fence)`` rechecks ownership, epochs, freshness, the two-slot window and every
   feedback dependency without rerunning selection, and records the frame.
4. ``complete(fence, records, timing)`` validates every lane before anything changes
   (``plan.validate_completion``), then updates duration estimates, acceptance and forecasts,
   service prices and committed state and returns the generated tokens;
   ``published_output(handle, fence)`` reports each visible burst (one delivery; output age
   resets at the actual publication time).
5. A finished or cancelled request releases its slot and pages after its last submitted fence.

The scheduler decides when; its collaborators hold the state: ``residents.Residents`` (request
slots, KV pages, lane effects, ending and release), ``captures.Captures`` (checkpoint captures and
image windows), ``learning.Population`` (pooled estimates) and ``stats.Counters``, read through
``stats()`` (a ``SchedulerStats`` snapshot the server renders as Prometheus text). What callers
read of that state (requests, pools, counters, frames in flight) is named in ``reads.py``.

The window has two frame slots. Only ordinary decode and complete speculative generation may
occupy both; other kinds, unknown or stale costs, host stops or copies (``sources.py``) and phase
transitions need an empty window (completion feedback); ``frames.py`` holds the window's rules.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from helios_jax.catalog import Catalog, CostKey, DecodeMode, GraphKind
from helios_jax.scheduler import learning, policy, pricing, reuse, service
from helios_jax.scheduler.captures import Captures
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.frames import frame_record, freeze, planning_start_ns, reanchor, window_blocked
from helios_jax.scheduler.plan import (
    Completed,
    CompletionRecord,
    ExecutionClass,
    ExecutionTiming,
    Frame,
    GeneratedToken,
    Handle,
    PlanRejected,
    ScheduledPlan,
    check_commit,
    validate_completion,
)
from helios_jax.scheduler.reads import SchedulerReads
from helios_jax.scheduler.refresh import acceptance_ledger, funding_ledger, settle, timing_ledger
from helios_jax.scheduler.requests import admission_fields, check_width_limit, pages_for
from helios_jax.scheduler.residents import Residents
from helios_jax.scheduler.service import NS_PER_MS
from helios_jax.scheduler.sources import ProposalSources
from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate
from helios_jax.scheduler.stats import Counters
from helios_jax.scheduler.view import Candidate

__all__ = ["NS_PER_MS", "PlanRejected", "Scheduler"]  # PlanRejected and NS_PER_MS: plan.py, service.py


@reuse.install
class Scheduler(SchedulerReads, ProposalSources):
    """Host scheduler over one loaded catalog and decode mode (its reads: ``reads.SchedulerReads``)."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        mode: DecodeMode | str | None = None,
        policy_config: PolicyConfig | None = None,
        fixed_width: int | None = None,
        page_size: int = 16,
        kv_pages: int | None = None,
        max_model_len: int = 1 << 20,
        draft_storage: int | None = None,
        initialize_requests: bool = False,
        snapshot_rows: int | None = None,
        checkpoints: bool = False,
        vision_window_tokens: int | None = None,
    ):
        if mode is None:
            mode = DecodeMode.ORDINARY if catalog.mode == "ordinary" else DecodeMode.ADAPTIVE
        self.catalog = catalog
        self.mode = DecodeMode(mode)
        self.graphs = policy.PreparedGraphs(catalog.eligible(self.mode, fixed_width=fixed_width))
        self.policy = policy_config or PolicyConfig()
        self.costs = CostModel(self.policy.estimate_ttl_ns)
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.depth = max(1, self.graphs.max_depth)
        self.draft_storage = self.graphs.max_depth if draft_storage is None else draft_storage
        if initialize_requests:
            self.graphs.require(GraphKind.INITIALIZE, "initialize_requests")
        self.initialize_requests = initialize_requests
        self.captures = Captures(
            self.graphs,
            self.costs,
            checkpoints=checkpoints,
            snapshot_rows=snapshot_rows,
            request_slots=catalog.request_slots,
            vision_window_tokens=vision_window_tokens,
        )
        self.population = learning.Population(self.depth)
        self.counters = Counters()
        default_context = max_model_len if max_model_len < (1 << 20) else 8192
        default_pages = catalog.request_slots * pages_for(default_context, page_size)
        self.residents = Residents(
            catalog.request_slots, kv_pages or default_pages, self.captures, self.population, self.counters
        )
        self.timing_ledger = timing_ledger()
        self.acceptance_ledger = acceptance_ledger()
        self.now_ns = 0
        self.frames: collections.deque[Frame] = collections.deque()
        self._last_completed: Completed | None = None
        self._admitted_any = False
        self._normalizer_cache: tuple[int, service.Normalizers] | None = None

    # == configuration ======================================================================
    def configure_policy(self, policy_config: PolicyConfig) -> None:
        """Set the policy; allowed before the first admission only."""
        if self._admitted_any:
            raise ValueError("configure_policy must precede admission")
        if not isinstance(policy_config, PolicyConfig):
            raise TypeError("configure_policy takes a PolicyConfig")
        self.policy = policy_config
        self.costs.ttl_ns = policy_config.estimate_ttl_ns

    def seed_costs(self, now_ns: int = 0, samples: Mapping[CostKey, Sequence[float]] | None = None) -> int:
        """Reproduce a measured catalog through the observation path (one sample per entry), or,
        with `samples` (ms per cost key, several per program: ``prepare.measure_samples`` before
        serving), observe each sample as one device interval. Returns the entries seeded.

        Raises:
          ValueError: a key of `samples` names no program of the catalog.
        """
        if samples is None:
            return self.costs.seed_from_catalog(self.catalog, now_ns)
        unknown = samples.keys() - {g.key for g in self.catalog.graphs}
        if unknown:
            raise ValueError(f"samples name programs outside the catalog: {sorted(map(str, unknown))}")
        return self.costs.seed_samples(samples, now_ns)

    # == admission (pages_needed and can_admit: reads.py) ====================================
    def admit(
        self,
        prompt: Sequence[int],
        *,
        max_output: int,
        message_endpoints: Iterable[int] = (),
        image_spans: Iterable[tuple[int, int]] = (),
        stop_token_ids: Iterable[int] = (),
        needs_scores: bool = False,
        host_stops: bool = False,
        sampling: Any = None,
        proposal_source: str = SOURCE_LEARNED,
        acceptance_history: dict[str, PrefixEstimate] | None = None,
        width_limit: int | None = None,
        forecast_history: PrefixEstimate | None = None,
        host_mask: bool = False,
    ) -> Handle:
        """Make a request resident; raises ResourceError when no slot or pages are free.

        Args:
          prompt: prompt token ids.
          max_output: output token limit (at least 1).
          message_endpoints: exact token endpoints of the chat messages (checkpoint anchors).
          image_spans: atomic [start, end) prompt spans that must stay within one chunk.
          stop_token_ids: tokens that end the output.
          needs_scores: prompt log-probabilities requested (scored prefill).
          host_stops: stop strings or parsers on the host: rounds need completion feedback.
          sampling, proposal_source: the engine's settings (opaque here); "learned" or "copy".
          acceptance_history, forecast_history: optional preseeded estimates (copied).
          width_limit: grammar or stop restrictions on one round: at most this many target rows
            (pending token included); None for none. :meth:`restrict_width` changes it later.
          host_mask: samples take a host token mask (a grammar): no K-step decode lanes.
        A prompt that extends a stored checkpoint starts with a RESTORE of it and is charged only
        its uncached tokens. A request no eligible program can serve raises ValueError."""
        admission = admission_fields(
            prompt,
            max_output,
            max_model_len=self.max_model_len,
            message_endpoints=message_endpoints,
            image_spans=image_spans,
            stop_token_ids=stop_token_ids,
            needs_scores=needs_scores,
            host_stops=host_stops,
            sampling=sampling,
            proposal_source=proposal_source,
            width_limit=width_limit,
            host_mask=host_mask,
        )
        if needs_scores:
            self.graphs.require(GraphKind.SCORED_PREFILL, "a request for prompt scores")
        windows = self.captures.admission_windows(admission["image_spans"])
        pages_needed = self.pages_needed(len(admission["prompt"]), max_output)
        req = self.residents.new_request(
            admission, pages_needed, self.now_ns, acceptance_history, forecast_history
        )
        fraction = self.policy.checkpoint_extra_work_fraction
        self.captures.admit(req, windows, self.initialize_requests, fraction, self.now_ns)
        self.requests[req.rid] = req
        self._admitted_any = True
        return req.handle

    def restrict_width(self, handle: Handle, width_limit: int | None) -> None:
        """Set a request's grammar or stop restriction: later rounds give it at most
        `width_limit` target rows (pending token included); None lifts the restriction.

        The engine uses it when it knows that tokens past a point are useless this round (a
        grammar state that admits one continuation, a stop string matched up to its last
        token); selection then prices and sizes the request's lanes within it."""
        check_width_limit(width_limit)
        self.residents.lookup(handle).width_limit = width_limit

    # == ending requests ====================================================================
    def cancel(self, handle: Handle) -> None:
        """Stop selecting the request now; its resources stay owned through its last fence."""
        self.residents.cancel(self.residents.lookup(handle))

    def preempt(self, handle: Handle) -> None:
        """Retire a resident request without completing its response.

        Its terminal age starts now; when a destination row is obtainable its state is captured
        first, so that a continuation (the same prompt plus the output so far) restores it and is
        charged only what it did not have. The engine decides when (:meth:`preemption_candidate`).
        """
        req = self.residents.lookup(handle)
        if req.active:
            self.residents.preempt(req, self.now_ns)

    def preemption_candidate(self, prompt_len: int, max_output: int) -> Handle | None:
        """The resident decoding request to preempt so that a waiting request fits, or None.

        Trigger (the engine's, once the head of its admission queue has waited its preemption
        delay): admission is refused for lack of a slot or KV pages, and retiring one active
        decoding request would make it fit; the best-served one (lowest fairness price) is chosen.
        """
        if self.can_admit(prompt_len, max_output):
            return None
        needed = self.pages_needed(prompt_len, max_output)
        return pricing.best_served(self.requests, self.pages.available, needed)

    def finish(self, handle: Handle, reason: str = "stop") -> None:
        """A host-detected stop (stop string, parser): the request ends after committed output."""
        req = self.residents.lookup(handle)
        if req.active and not req.finished:
            req.finish_reason = reason
            req.epoch += 1
            self.residents.end(req, self.now_ns)

    # == time ===============================================================================
    def advance_to(self, now_ns: int) -> None:
        """Move the clock forward; idle (nothing in flight, nothing runnable) clears credit."""
        if now_ns < self.now_ns:
            raise ValueError(f"time went backwards: {now_ns} < {self.now_ns}")
        self.now_ns = int(now_ns)
        if not self.frames and not any(pricing.runnable(r) for r in self.requests.values()):
            self.timing_ledger.idle()
            self.acceptance_ledger.idle()

    # == planning ===========================================================================
    def _planning_start_ns(self) -> int:
        """Where the next frame would start (``frames.planning_start_ns``)."""
        return planning_start_ns(self.frames, self.now_ns)

    def _window_blocked(self) -> bool:
        """No frame can be appended now (``frames.window_blocked``)."""
        return window_blocked(self.frames, self.now_ns)

    def plan(self) -> ScheduledPlan | None:
        """The next program to submit, or None when nothing is runnable or the window is blocked.

        Pure: calling it twice without other calls in between returns equal plans and changes
        nothing. A plan with ``needs_empty_window`` must wait until queued work drains (the
        engine then replans); lower-value queueable work never displaces it. A repeated call
        with nothing changed returns the same plan (``reuse.py``).
        """
        return reuse.memoized(self, self._plan)

    def _plan(self) -> ScheduledPlan | None:
        if self._window_blocked():
            return None
        start = self._planning_start_ns()
        views = self.views(start, optimistic=False)  # a probe's estimates: only if it could widen
        if not views.any_runnable():
            return None
        inp = policy.SelectionInput(views, self.graphs, self.costs, self.now_ns, self.policy, self.mode)
        base = policy.selection_rows(inp)  # read again by a refresh alternative and a probe
        ordinary = policy.select(inp, rows=base[1])
        if ordinary is None:
            return None
        information = learning.aged_information(self.requests)
        chosen, reason, credit = learning.explore(
            inp,
            ordinary,
            self.graphs.graphs,
            self.timing_ledger,
            self.acceptance_ledger,
            information,
            base,
            build_probe_views=lambda: self._probe_views(views),
        )
        return self._freeze(chosen, reason, credit, start)

    def _freeze(self, c: Candidate, reason: ExecutionClass, credit: float, start: int) -> ScheduledPlan:
        """The chosen candidate frozen against its requests' current state (``frames.freeze``)."""
        return freeze(
            c,
            reason,
            credit,
            start,
            requests=self.requests,
            captures=self.captures,
            mode=self.mode,
            now_ns=self.now_ns,
        )

    # == commit =============================================================================
    def commit(self, plan: ScheduledPlan, fence: int) -> None:
        """Submit a plan as frame `fence` after rechecking it; never reruns selection.

        Raises:
          PlanRejected: stale epochs or handles, cancelled lanes, a busy window, a dependency
            that needs completion feedback, an estimate that expired since planning, or a
            refresh or probe whose ledger is no longer full.
        """
        if self.frames and fence <= self.frames[-1].fence:
            raise ValueError(f"fences must increase: {fence} after {self.frames[-1].fence}")
        ledger = funding_ledger(plan.reason, self.timing_ledger, self.acceptance_ledger)
        check_commit(
            plan,
            self.requests,
            queued=bool(self.frames),
            window_blocked=self._window_blocked(),
            fresh=self.costs.is_fresh(plan.graph.key, self.now_ns),
            funded=ledger is None or ledger.can_start(),
        )
        if ledger is not None:
            ledger.start()
        if (
            plan.reason is ExecutionClass.TIMING_REFRESH
            or plan.reason is ExecutionClass.DISCOVERY
            or self.costs.is_stale(plan.graph.key, self.now_ns)
        ):
            self.costs.note_attempt(plan.graph.key, self.now_ns)
        frame = frame_record(
            plan,
            fence,
            frames=self.frames,
            requests=self.requests,
            normalizers=self._normalizers(),
            now_ns=self.now_ns,
        )
        self.frames.append(frame)
        for lane in plan.lanes:
            req = self.requests[lane.handle.rid]
            req.inflight.append(fence)
            req.last_selected_ns = self.now_ns
        self.counters.committed(fence, plan, self.costs.observation_age_ns(plan.graph.key, self.now_ns))

    # == completion =========================================================================
    def complete(
        self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming
    ) -> list[GeneratedToken]:
        return self._complete(fence, records, timing, confidence=None, survival=None)

    def complete_packed_round(
        self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming, confidence: ArrayLike
    ) -> list[GeneratedToken]:
        """Completion of a confidence-producing speculative program (the f32 sidecar
        [2, request_slots, draft_capacity]; row 1 holds joint prefix probabilities). A sequence
        of sidecars is one per rank: all must be valid, rank zero's drives the forecasts."""
        return self._complete(fence, records, timing, confidence=confidence, survival=None)

    def complete_with_survival(
        self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming, survival: ArrayLike
    ) -> list[GeneratedToken]:
        """Completion with completion_speculative_survival rows [request_slots, draft_capacity]."""
        return self._complete(fence, records, timing, confidence=None, survival=survival)

    def complete_packed_round_with_survival(
        self,
        fence: int,
        records: Sequence[CompletionRecord],
        timing: ExecutionTiming,
        confidence: ArrayLike,
        survival: ArrayLike,
    ) -> list[GeneratedToken]:
        return self._complete(fence, records, timing, confidence=confidence, survival=survival)

    def _complete(
        self,
        fence: int,
        records: Sequence[CompletionRecord],
        timing: ExecutionTiming,
        confidence: ArrayLike | None,
        survival: ArrayLike | None,
    ) -> list[GeneratedToken]:
        if not self.frames or self.frames[0].fence != fence:
            expected = self.frames[0].fence if self.frames else None
            raise ValueError(f"completion for fence {fence}, but the oldest frame in flight is {expected}")
        frame = self.frames[0]
        records = list(records)
        conf = validate_completion(frame, records, timing, confidence, survival, self.catalog.request_slots)
        surv = None if survival is None else np.asarray(survival, dtype=np.float64)
        # -- validated: from here on state changes ------------------------------------------
        self.frames.popleft()
        reanchor(self.frames, self.now_ns)
        raw_ms = timing.service_interval_ns / NS_PER_MS
        valid_timing = timing.device_ns > 0
        self._account(frame.plan, timing, raw_ms, valid_timing)
        served, generated = self.residents.apply(
            frame,
            records,
            conf,
            surv,
            timing.device_ns / NS_PER_MS,
            self.policy.checkpoint_extra_work_fraction,
            self.now_ns,
        )
        # Service history: one measured interval per successful frame with a device interval
        # (positive in ms: one too small to represent there records none, and its publication
        # then changes no delivery history, as for a frame without one).
        delivery_before: dict[int, float | None] = {}
        interval_ms = raw_ms if valid_timing and raw_ms > 0 else None
        if interval_ms is not None:
            delivery_before = service.record_interval(self.requests, frame, served, raw_ms, self.policy)
        self._last_completed = Completed(
            fence,
            interval_ms,
            timing.device_ns / NS_PER_MS,
            delivery_before,
            {g.handle.rid for g in generated},
        )
        for req in list(self.requests.values()):
            self.residents.release(req)
        return generated

    def _account(
        self, plan: ScheduledPlan, timing: ExecutionTiming, raw_ms: float, valid_timing: bool
    ) -> None:
        """Duration estimates, exploration ledgers and execution counters of one execution."""
        # Duration estimates: device replay intervals only (queued or isolated), corrected.
        self.costs.observe(
            plan.graph.key,
            timing.device_intervals_ns,
            self.now_ns,
            readiness_delay_ns=timing.readiness_delay_ns,
        )
        # Exploration ledgers (raw physical time; never both for one execution).
        credited = raw_ms if valid_timing else timing.wall_ns / NS_PER_MS
        settle(
            plan.reason,
            self.timing_ledger,
            self.acceptance_ledger,
            raw_ms=raw_ms,
            credited_ms=credited,
            valid_timing=valid_timing,
        )
        self.counters.executed(plan, int(credited * NS_PER_MS))

    # == publication ========================================================================
    def published_output(self, handle: Handle, fence: int) -> None:
        """Report a visible burst of `fence` for `handle` (before the next completion).

        The first publication for the fence replaces the interval's delivery update with one
        served delivery; a missing delivery history starts at one delivery over the frame.
        A frame without a device interval added no measured interval to service history, so
        its publication changes no delivery history. Output age resets at the current
        (publication) time in every case.
        """
        last = self._last_completed
        if last is None or last.fence != fence:
            raise ValueError(
                f"publication for fence {fence} must precede the next completion "
                f"(last completed: {None if last is None else last.fence})"
            )
        if handle.rid not in last.publishable:
            raise ValueError(f"{handle} produced no tokens in fence {fence}")
        req = self.requests.get(handle.rid)
        if req is None or req.handle != handle:
            return  # retired since (its final burst): nothing left to price
        last.publish(handle.rid, req.history, self.policy)
        req.last_publication_ns = self.now_ns
