"""The Scheduler: request resources, planning, commit and completion on the caller's clock.

A request's life through this object (the engine drives it; time is passed in):

1. ``admit`` reserves a request slot and the KV pages of the request's whole execution
   ceiling (prompt, output limit and the declared draft storage) and returns a ``Handle``.
2. ``advance_to(now)``; ``plan()`` (pure) projects prices and ages to the end of queued work,
   selects by value per time (``policy.py``) or, funded by the ledgers, a timing refresh or an
   acceptance probe, and returns a frozen ``ScheduledPlan``.
3. ``commit(plan, fence)`` rechecks ownership, epochs, freshness, the two-slot window and every
   feedback dependency without rerunning selection, and records the frame.
4. ``complete(fence, records, timing)`` validates every lane before anything changes, then
   updates duration estimates, acceptance and forecasts, service prices and committed state and
   returns the generated tokens; ``published_output(handle, fence)`` reports each visible burst
   (one delivery; output age resets at the actual publication time).
5. A finished or cancelled request releases its slot and pages after its last submitted fence.

The window has two frame slots. Only ordinary decode and complete speculative generation may
occupy both; every other kind, unknown or stale costs, host stops and phase transitions need an
empty window (completion feedback).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Iterable, Sequence

import numpy as np

from helios_jax.catalog import Allocation, Catalog, DecodeMode, GraphKind
from helios_jax.scheduler import learning, policy, service
from helios_jax.scheduler.checkpoints import CheckpointStore, Role, capture_endpoints
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.plan import (CompletionRecord, ExecutionClass, ExecutionTiming, GeneratedToken,
                                       Handle, PlanLane, ScheduledPlan, TraceRecord)
from helios_jax.scheduler.refresh import acceptance_ledger, timing_ledger
from helios_jax.scheduler.requests import Pool, Request, ResourceError, pages_for
from helios_jax.scheduler.rounds import forecast_observations
from helios_jax.scheduler.speculation import (SOURCE_LEARNED, SOURCES, AcceptanceHistory, PopulationPrior,
                                              PrefixEstimate, acceptance_observations, initial_prior)
from helios_jax.scheduler.view import Candidate, LaneRole, Phase, RequestView

NS_PER_MS = 1_000_000


def _check_width_limit(width_limit) -> None:
    if width_limit is not None and (isinstance(width_limit, bool) or not isinstance(width_limit, int)
                                    or width_limit < 1):
        raise ValueError(f"width_limit must be a positive integer or None, got {width_limit!r}")


class PlanRejected(RuntimeError):
    """commit() refused a plan: stale epochs, lost ownership, a full window or a dependency."""


@dataclasses.dataclass
class Frame:
    """A committed plan in flight."""

    fence: int
    plan: ScheduledPlan
    committed_ns: int
    expected_end_ns: int | None
    participants: tuple[Handle, ...]
    normalizers: service.Normalizers
    expected_service: dict  # rid -> (expected tokens, expected deliveries)


@dataclasses.dataclass
class Completed:
    """The most recent completion, kept until the next one for publication reports."""

    fence: int
    interval_ms: float | None  # the measured service interval; None: no device interval
    frame_ms: float
    delivery_before: dict  # rid -> log z before the interval's zero-delivery update
    publishable: set  # rids that received tokens in this completion
    published: set = dataclasses.field(default_factory=set)


class Scheduler:
    """Host scheduler over one loaded catalog and decode mode."""

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
        self.initialize_requests = initialize_requests
        kinds = {g.kind for g in self.graphs.graphs}
        # Checkpoint retention (anchors, extras, terminal captures, the prefix cache) needs snapshot
        # and restore programs; it is opt-in (docs/checkpoints.md says why).
        self.state_copies = {GraphKind.SNAPSHOT, GraphKind.RESTORE} <= kinds
        self.captures_enabled = checkpoints and self.state_copies
        if snapshot_rows is None:
            snapshot_rows = catalog.request_slots if self.state_copies else 0
        self.checkpoints = CheckpointStore(snapshot_rows if self.state_copies else 0)
        vision = [g for g in self.graphs.graphs if g.kind is GraphKind.VISION]
        self.images_per_execution = max((g.image_capacity for g in vision), default=0)
        if vision_window_tokens is not None and vision_window_tokens < 1:
            raise ValueError("vision_window_tokens must be positive")
        self.vision_window_tokens = vision_window_tokens  # prepared feature storage per window
        self.slots = Pool(catalog.request_slots, "request slots")
        default_pages = catalog.request_slots * pages_for(max_model_len if max_model_len < (1 << 20) else 8192,
                                                          page_size)
        self.pages = Pool(kv_pages or default_pages, "KV pages")
        self._slot_generation = [0] * catalog.request_slots
        self._next_rid = 0
        self.requests: dict[int, Request] = {}
        self.acceptance_priors = {s: PopulationPrior(self.depth) for s in SOURCES}
        # Every completed observation per source, pooled (weight 2 at 0.5**d, cap 128): where a
        # request's own evidence is thin, selection reads it hierarchically from this pool.
        self.acceptance_pools = {s: PrefixEstimate.from_prior(initial_prior(self.depth)) for s in SOURCES}
        self.forecast_prior = PopulationPrior(self.depth)
        self.timing_ledger = timing_ledger()
        self.acceptance_ledger = acceptance_ledger()
        self.now_ns = 0
        self.frames: collections.deque[Frame] = collections.deque()
        self._last_completed: Completed | None = None
        self._admitted_any = False
        self.executions = collections.Counter()  # class -> count
        self.execution_ns = collections.Counter()  # class -> ns
        self.speculative = collections.Counter()  # programs, drafts offered/accepted
        self.accepted_by_position = collections.Counter()  # depth -> accepted drafts
        self.offered_by_position = collections.Counter()
        self.selections = collections.Counter()  # graph kind -> committed plans
        self.trace: collections.deque[TraceRecord] = collections.deque(maxlen=4096)
        self._normalizer_cache: tuple | None = None

    # == configuration ======================================================================
    def configure_policy(self, policy_config: PolicyConfig) -> None:
        """Set the policy; allowed before the first admission only."""
        if self._admitted_any:
            raise ValueError("configure_policy must precede admission")
        if not isinstance(policy_config, PolicyConfig):
            raise TypeError("configure_policy takes a PolicyConfig")
        self.policy = policy_config
        self.costs.ttl_ns = policy_config.estimate_ttl_ns

    def seed_costs(self, now_ns: int = 0) -> int:
        """Reproduce a measured catalog through the observation path (one sample per entry)."""
        return self.costs.seed_from_catalog(self.catalog, now_ns)

    # == admission ==========================================================================
    def pages_needed(self, prompt_len: int, max_output: int) -> int:
        ceiling = min(prompt_len + max_output + self.draft_storage, self.max_model_len + self.draft_storage)
        return pages_for(ceiling, self.page_size)

    def can_admit(self, prompt_len: int, max_output: int) -> bool:
        return self.slots.can_allocate() and self.pages.can_allocate(self.pages_needed(prompt_len, max_output))

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
          sampling: the engine's sampling settings (opaque here).
          proposal_source: "learned" or "copy".
          acceptance_history: optional preseeded estimates per source.
          width_limit: grammar or stop restrictions on one round: at most this many target rows
            (pending token included); None for none. :meth:`restrict_width` changes it later.
          forecast_history: an optional preseeded confidence forecast (copied).

        A prompt that extends a stored checkpoint starts with a RESTORE of it and is charged only
        its uncached tokens.
        """
        prompt = tuple(int(t) for t in prompt)
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if any(t < 0 for t in prompt):
            raise ValueError("prompt token ids must be nonnegative")
        if max_output < 1:
            raise ValueError(f"max_output must be at least 1, got {max_output}")
        if len(prompt) + max_output > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)}) plus max_output ({max_output}) exceeds the "
                             f"context of {self.max_model_len} tokens")
        if proposal_source not in SOURCES:
            raise ValueError(f"unknown proposal source {proposal_source!r}")
        _check_width_limit(width_limit)
        endpoints = tuple(sorted(int(e) for e in message_endpoints))
        if any(not 0 < e <= len(prompt) for e in endpoints):
            raise ValueError("message endpoints must lie within the prompt")
        spans = tuple(sorted((int(s), int(e)) for s, e in image_spans))
        if any(not 0 <= s < e <= len(prompt) for s, e in spans):
            raise ValueError("image spans must be nonempty and lie within the prompt")
        windows = self._image_windows(spans, len(prompt))
        if spans and not self.images_per_execution:
            raise ValueError("this catalog has no vision programs; image inputs are not supported")
        if len(windows) > 1 and not (self.state_copies and self.checkpoints.obtainable(-1, mandatory=True)):
            raise ResourceError("a multi-window image request needs a private snapshot row")
        needed = self.pages_needed(len(prompt), max_output)
        if not self.slots.can_allocate():
            raise ResourceError("no free request slot")
        if not self.pages.can_allocate(needed):
            raise ResourceError(f"{needed} KV pages needed, {self.pages.available} free")
        rid = self._next_rid
        self._next_rid += 1
        slot = self.slots.allocate(1, rid)[0]
        self._slot_generation[slot] += 1
        pages = self.pages.allocate(needed, rid)
        handle = Handle(rid, self._slot_generation[slot])
        req = Request(
            handle=handle, slot=slot, prompt=prompt, max_output=int(max_output),
            stop_token_ids=frozenset(int(t) for t in stop_token_ids), message_endpoints=endpoints,
            image_spans=spans, needs_scores=bool(needs_scores), host_stops=bool(host_stops),
            sampling=sampling, proposal_source=proposal_source, pages=pages, admitted_ns=self.now_ns,
            history=service.ServiceHistory(),
            acceptance=AcceptanceHistory(self.acceptance_priors, preseeded=acceptance_history),
            forecast=(PrefixEstimate.from_prior(self.forecast_prior.mean) if forecast_history is None
                      else forecast_history.copy()), width_limit=width_limit,
        )
        hit = self.checkpoints.lookup(prompt) if self.captures_enabled and not spans else None
        if windows:
            req.windows = windows
            req.phase, req.enables = Phase.BLOCKED, Phase.PREFILL
            req.prerequisites = [GraphKind.VISION] * self._vision_executions(req, 0)
            if len(windows) > 1:
                req.window_row = self.checkpoints.arm(rid, (), Role.WINDOW, self.now_ns, mandatory=True)
        elif hit is not None:
            req.cached = req.consumed = hit.length
            req.restore_row = hit.row
            self.checkpoints.pin(hit.row, self.now_ns)
            req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.RESTORE], Phase.PREFILL
        elif self.initialize_requests:
            req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.INITIALIZE], Phase.PREFILL
        if self.captures_enabled and not spans:
            # Checkpoints are keyed by token ids; a prompt with images holds image features that
            # the same placeholder ids in another prompt do not, so it publishes none.
            self._plan_captures(req)
        self.requests[rid] = req
        self._admitted_any = True
        return handle

    def restrict_width(self, handle: Handle, width_limit: int | None) -> None:
        """Set a request's grammar or stop restriction: later rounds give it at most
        `width_limit` target rows (pending token included); None lifts the restriction.

        The engine uses it when it knows that tokens past a point are useless this round (a
        grammar state that admits one continuation, a stop string matched up to its last
        token); selection then prices and sizes the request's lanes within it."""
        _check_width_limit(width_limit)
        self._lookup(handle).width_limit = width_limit

    def cancel(self, handle: Handle) -> None:
        """Stop selecting the request now; its resources stay owned through its last fence."""
        req = self._lookup(handle)
        req.cancelled = True
        self._drop_captures(req)
        self._maybe_release(req)

    def preempt(self, handle: Handle) -> None:
        """Retire a resident request without completing its response.

        Its terminal age starts now; when a destination row is obtainable its state is captured
        first, so that a continuation (the same prompt plus the output so far) restores it and is
        charged only what it did not have. The engine decides when to preempt; see
        :meth:`preemption_candidate` for the trigger it uses.
        """
        req = self._lookup(handle)
        if not req.active:
            return
        req.preempted = True
        req.finish_reason = "preempted"
        req.epoch += 1
        self._drop_captures(req)
        if not self._begin_terminal_capture(req, funded=True):
            self._retire(req)

    def preemption_candidate(self, prompt_len: int, max_output: int) -> Handle | None:
        """The resident decoding request to preempt so that a waiting request fits, or None.

        Trigger (used by the engine when the head of its admission queue has waited longer than
        its preemption delay): admission is refused for lack of a slot or KV pages, and retiring
        one active decoding request would make it fit. Among those, the best-served one (highest
        token rate: the lowest fairness price) is chosen.
        """
        if self.can_admit(prompt_len, max_output):
            return None
        needed = self.pages_needed(prompt_len, max_output)
        candidates = []
        for r in self.requests.values():
            if r.active and r.phase is Phase.DECODE:
                frees = self.pages.available + len(r.pages) >= needed
                if frees:
                    rate = r.history.log_x if r.history.log_x is not None else -math.inf
                    candidates.append((rate, -r.admitted_ns, r.handle))
        if not candidates:
            return None
        return max(candidates)[2]

    def finish(self, handle: Handle, reason: str = "stop") -> None:
        """A host-detected stop (stop string, parser): the request ends after committed output."""
        req = self._lookup(handle)
        if req.active and not req.finished:
            req.finish_reason = reason
            req.epoch += 1
            self._end(req)

    def _end(self, req: Request) -> None:
        """A validated termination: a funded terminal capture, or retirement now.

        A request that ends right at its anchor (its prompt end, with one output token) still
        captures the anchor: the terminal capture then holds exactly the anchor's state.
        """
        at_anchor = len(req.output) <= 1 and any(e == req.consumed and r is Role.ANCHOR for e, r in req.captures)
        self._drop_captures(req)
        if not self._begin_terminal_capture(req, funded=at_anchor):
            self._retire(req)

    # == image windows =======================================================================
    def _image_windows(self, spans, prompt_len: int) -> list:
        """Group image spans into whole-image windows bounded by the prepared feature storage.

        Returns [(first token of the window's first image, (image indices...)), ...]; a span is
        one image and its tokens are its features.
        """
        windows, current, used = [], [], 0
        limit = self.vision_window_tokens
        for i, (start, end) in enumerate(spans):
            size = end - start
            if limit is not None and size > limit:
                raise ValueError(f"image {i} needs {size} feature tokens, the window holds {limit}")
            if current and limit is not None and used + size > limit:
                windows.append((spans[current[0]][0], tuple(current)))
                current, used = [], 0
            current.append(i)
            used += size
        if current:
            windows.append((spans[current[0]][0], tuple(current)))
        return windows

    def _vision_executions(self, req: Request, window: int) -> int:
        images = len(req.windows[window][1])
        return -(-images // max(1, self.images_per_execution))

    def _window_stop(self, req: Request) -> int | None:
        """Prefill stops before the next window's first image dependency."""
        if req.window + 1 < len(req.windows):
            return req.windows[req.window + 1][0]
        return None

    def _cross_window(self, req: Request) -> bool:
        """At a window boundary: drain, snapshot the exact state, restore into a fresh generation,
        then encode the next window's images (compact feature offsets from zero)."""
        stop = self._window_stop(req)
        if stop is None or req.consumed != stop:
            return False
        req.window += 1
        req.window_images_done = 0
        req.capture_row = req.window_row
        self.checkpoints.pin(req.window_row, self.now_ns)
        req.phase, req.enables = Phase.BLOCKED, Phase.PREFILL
        req.prerequisites = [GraphKind.SNAPSHOT, GraphKind.RESTORE] + \
            [GraphKind.VISION] * self._vision_executions(req, req.window)
        return True

    def _vision_lane(self, req: Request) -> tuple[tuple[int, ...], int]:
        """The images the next vision execution encodes and their compact feature offset."""
        images = req.windows[req.window][1]
        done = req.window_images_done
        batch = images[done: done + max(1, self.images_per_execution)]
        offset = sum(req.image_spans[i][1] - req.image_spans[i][0] for i in images[:done])
        return batch, offset

    # == checkpoints =========================================================================
    def _cost_ms(self, kind: GraphKind) -> float | None:
        """The fastest fresh estimate among the loaded programs of one kind (None: unknown)."""
        known = [self.costs.estimate_ms(g.key) for g in self.graphs.graphs
                 if g.kind is kind and self.costs.is_fresh(g.key, self.now_ns)]
        return min(known) if known else None

    def _prefill_ms_per_token(self) -> float | None:
        rates = [self.costs.estimate_ms(g.key) / g.token_capacity for g in self.graphs.prefill
                 if self.costs.is_known(g.key)]
        return min(rates) if rates else None

    def _extra_capture_cost_ms(self) -> float | None:
        """An extra capture: one snapshot copy plus one additional prefill split (the smallest
        measured chunk's duration stands for the launch a split adds). None: unknown."""
        snap = self._cost_ms(GraphKind.SNAPSHOT)
        splits = [self.costs.estimate_ms(g.key) for g in self.graphs.prefill if self.costs.is_fresh(g.key, self.now_ns)]
        if snap is None or not splits:
            return None
        return snap + min(splits)

    def _plan_captures(self, req: Request) -> None:
        """Choose the request's capture endpoints: the anchor, then extras within the allowance.

        The anchor is best effort (captured when a destination row is obtainable then; a free row
        is guarded for it now); extras need known costs and the request-local allowance of
        checkpoint_extra_work_fraction x its estimated uncached prefill work.
        """
        anchor, extras = capture_endpoints(req.message_endpoints, req.prompt_len, req.consumed)
        if anchor is None:
            return
        points = []
        if not self.checkpoints.holds(req.prompt[:anchor]):
            points.append((anchor, Role.ANCHOR))
            self.checkpoints.guard(req.rid)
        per_token = self._prefill_ms_per_token()
        cost = self._extra_capture_cost_ms()
        if per_token is not None and cost is not None:
            allowance = self.policy.checkpoint_extra_work_fraction * per_token * req.prompt_remaining
            for e in extras:
                if cost <= allowance and not self.checkpoints.holds(req.prompt[:e]):
                    points.append((e, Role.EXTRA))
                    allowance -= cost
            req.extra_allowance_ms = allowance
        req.captures = sorted(points)

    def _drop_captures(self, req: Request) -> None:
        """Cancellation or retirement: pending captures go; armed or in-flight rows stay pinned
        until their fence completes."""
        req.captures = []
        self.checkpoints.release_guards(req.rid)
        if req.capture_row is not None and req.capture_row != req.window_row and not req.inflight \
                and req.phase is Phase.BLOCKED:
            self.checkpoints.abandon(req.capture_row)
            req.capture_row = None

    def _next_capture(self, req: Request) -> int | None:
        for endpoint, _ in req.captures:
            if endpoint > req.consumed:
                return endpoint
        return None

    def _reach_endpoint(self, req: Request, enables: Phase) -> None:
        """A prompt chunk ended at a capture endpoint: snapshot the exact consumed state first."""
        point = next(((e, r) for e, r in req.captures if e == req.consumed), None)
        if point is None:
            return
        req.captures.remove(point)
        endpoint, role = point
        if role is Role.EXTRA and self._cost_ms(GraphKind.SNAPSHOT) is None:
            return  # its cost expired after the split was dispatched: skip the copy
        if self.checkpoints.holds(req.prompt[:endpoint]):
            # Stored, or being captured by an identical prompt admitted alongside: never twice.
            if role is Role.ANCHOR:
                self.checkpoints.release_guards(req.rid)
            return
        if not self.checkpoints.obtainable(req.rid, role=role):
            return  # best effort: no destination row now
        req.capture_row = self.checkpoints.arm(req.rid, req.prompt[:endpoint], role, self.now_ns)
        req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.SNAPSHOT], enables
        if role is Role.ANCHOR:
            self.checkpoints.release_guards(req.rid)

    def _begin_terminal_capture(self, req: Request, *, funded: bool = False) -> bool:
        """Enter the terminal phase with an armed destination row, when the capture is funded
        (productive decode allowance covers a snapshot, or a preemption) and obtainable.

        Only a decoding request holds the state of prompt + output[:-1]; one preempted or ended
        before its prompt is prefilled (or restored) retires without a capture."""
        if not self.captures_enabled or req.cancelled or req.phase is not Phase.DECODE or req.image_spans:
            return False
        cost = self._cost_ms(GraphKind.SNAPSHOT)
        tokens = req.prompt + tuple(req.output[:-1])
        if cost is None or (not funded and req.terminal_allowance_ms < cost) or self.checkpoints.holds(tokens):
            return False
        if not self.checkpoints.obtainable(req.rid):
            return False
        req.capture_row = self.checkpoints.arm(req.rid, tokens, Role.TERMINAL, self.now_ns)
        req.phase, req.prerequisites, req.enables = Phase.TERMINAL, [], None
        req.terminal_since_ns = self.now_ns
        req.terminal_allowance_ms -= cost
        return True

    def _lookup(self, handle: Handle) -> Request:
        req = self.requests.get(handle.rid)
        if req is None or req.handle != handle:
            raise KeyError(f"unknown or stale request handle {handle}")
        return req

    def page_table(self, handle: Handle) -> list[int]:
        """The request's reserved KV page ids, in position order."""
        return list(self._lookup(handle).pages)

    def output(self, handle: Handle) -> list[int]:
        return list(self._lookup(handle).output)

    # == time ===============================================================================
    def advance_to(self, now_ns: int) -> None:
        """Move the clock forward; idle (nothing in flight, nothing runnable) clears credit."""
        if now_ns < self.now_ns:
            raise ValueError(f"time went backwards: {now_ns} < {self.now_ns}")
        self.now_ns = int(now_ns)
        if not self.frames and not any(self._runnable(r) for r in self.requests.values()):
            self.timing_ledger.idle()
            self.acceptance_ledger.idle()

    # == planning ===========================================================================
    def _planning_start_ns(self) -> int:
        if not self.frames:
            return self.now_ns
        return max(self.now_ns, self.frames[-1].expected_end_ns or self.now_ns)

    def _window_blocked(self) -> bool:
        """No frame can be appended: a draining frame, a full window or an overrun is in flight."""
        if not self.frames:
            return False
        if len(self.frames) >= 2 or any(not f.plan.graph.kind.may_share_window for f in self.frames):
            return True
        last = self.frames[-1]
        return last.expected_end_ns is None or self.now_ns > last.expected_end_ns  # overrun

    def _runnable(self, req: Request) -> bool:
        if not req.active:
            return False
        if req.phase in (Phase.PREFILL, Phase.BLOCKED, Phase.TERMINAL) and req.inflight:
            return False  # its prompt, prerequisite or snapshot is in flight
        return True

    def _needs_feedback(self, req: Request) -> bool:
        """A request whose next round needs completion feedback of its queued rounds."""
        return bool(req.inflight) and req.host_stops

    def _queued_advance(self, req: Request) -> int:
        """Committed tokens the request's queued lanes can still add: each at most
        min(lane ceiling, P) (``ScheduledPlan.max_advance``)."""
        return sum(f.plan.max_advance(l) for f in self.frames for l in f.plan.lanes if l.handle == req.handle)

    def _projected_histories(self, start_ns: int) -> tuple[dict, dict]:
        """Copies of service histories after the queued frames' frozen expected service, and the
        expected delivery time of each request with a queued delivery."""
        # Shared with the requests (read-only) except where a queued frame projects them.
        histories = {rid: r.history for rid, r in self.requests.items()}
        projected = set()
        delivered_at = {}
        for f in self.frames:
            if f.plan.expected_duration_ms is None:
                continue
            dt = f.plan.expected_duration_ms
            for h in f.participants:
                if h.rid not in histories:
                    continue
                if h.rid not in projected:
                    histories[h.rid] = histories[h.rid].copy()
                    projected.add(h.rid)
                hist = histories[h.rid]
                tokens, deliveries = f.expected_service.get(h.rid, (0.0, 0.0))
                prior = self._missing_rate(self.requests[h.rid], f.committed_ns, f.normalizers, histories)
                service.update_token_history(hist, tokens, dt, self.policy, prior)
                hist.log_z = service.delivery_update(hist.log_z, deliveries, dt, self.policy)
                if deliveries:
                    delivered_at[h.rid] = f.expected_end_ns
        return histories, delivered_at

    def _normalizers(self) -> service.Normalizers:
        """The loaded catalog's measured generation programs, recomputed when an estimate changes."""
        version = self.costs.version
        if self._normalizer_cache is None or self._normalizer_cache[0] != version:
            self._normalizer_cache = (version, service.Normalizers.measure(self.graphs.delivery, self.costs))
        return self._normalizer_cache[1]

    def _missing_rate(self, req: Request, at_ns: int, norm: service.Normalizers, histories: dict,
                      known: list | None = None) -> float:
        """The priced token rate of a request not served yet (``service.missing_log_token_rate``).

        `known`: the residents' token rates from `histories`, when the caller already gathered
        them (`_resident_rates`) for many requests at once.
        """
        if known is None:
            known = self._resident_rates(histories)
        return service.missing_log_token_rate(norm, len(known), known, (at_ns - req.admitted_ns) / NS_PER_MS,
                                              self.policy.adaptation_ms)

    def _resident_rates(self, histories: dict) -> list:
        """Every active resident's token rate (log, or None while missing) in `histories`."""
        return [histories[r.rid].log_x for r in self.requests.values() if r.active and r.rid in histories]

    def views(self, start_ns: int | None = None) -> list[RequestView]:
        """Request views with prices and ages projected to the planning start."""
        start = self._planning_start_ns() if start_ns is None else start_ns
        histories, delivered_at = self._projected_histories(start)
        norm = self._normalizers()
        residents = [r for r in self.requests.values() if r.active]
        prior_z = norm.share_log_rate(sum(1 for r in residents if r.delivery_bearing))
        known = self._resident_rates(histories)
        out = []
        for r in residents:
            hist = histories[r.rid]
            log_x = self._missing_rate(r, start, norm, histories, known) if hist.log_x is None else hist.log_x
            log_z = None
            if r.delivery_bearing:  # decoding, or blocked before decoding: a delivery coordinate
                log_z = prior_z if hist.log_z is None else hist.log_z
            prices = service.log_prices(self.policy, log_x, log_z)
            common = dict(rid=r.rid, slot=r.slot, runnable=self._runnable(r), last_selected_ns=r.last_selected_ns,
                          log_prefill_price=prices.prefill_token, log_output_price=prices.output_token,
                          log_delivery_price=prices.delivery)
            if r.phase is Phase.PREFILL:
                out.append(RequestView(phase=Phase.PREFILL, **self._prompt_fields(r), **common))
            elif r.phase is Phase.DECODE:
                queued = self._queued_advance(r)
                remaining = r.max_output - len(r.output) - queued
                last = delivered_at.get(r.rid, r.last_publication_ns)
                age = 0.0 if last is None else max(0.0, (start - last) / NS_PER_MS)
                if r.last_publication_ns is None and last is None:
                    age = max(0.0, (start - r.admitted_ns) / NS_PER_MS)
                est, pool = r.acceptance.get(r.proposal_source), self.acceptance_pools[r.proposal_source]
                tokens = len(r.output)
                common["runnable"] = common["runnable"] and remaining > 0
                out.append(RequestView(
                    phase=Phase.DECODE, age_ms=age, output_remaining=max(remaining, 0),
                    context_remaining=self.max_model_len - (r.cursor + queued), width_limit=r.width_limit,
                    survival=est.means(pool), optimistic=est.optimistic(tokens, pool), forecast=r.forecast.means(),
                    **common))
            elif r.phase is Phase.TERMINAL:
                since = r.terminal_since_ns if r.terminal_since_ns is not None else start
                out.append(RequestView(phase=Phase.TERMINAL, terminal_age_ms=max(0.0, (start - since) / NS_PER_MS),
                                       **common))
            else:
                # Blocked: priced like the phase it enables, with the same logical limits, so
                # that lookahead values only work the following program can really do.
                last = r.last_publication_ns if r.last_publication_ns is not None else r.admitted_ns
                est, pool = r.acceptance.get(r.proposal_source), self.acceptance_pools[r.proposal_source]
                out.append(RequestView(phase=Phase.BLOCKED, prerequisites=tuple(r.prerequisites), enables=r.enables,
                                       age_ms=max(0.0, (start - last) / NS_PER_MS),
                                       output_remaining=r.max_output - len(r.output),
                                       context_remaining=self.max_model_len - r.cursor, width_limit=r.width_limit,
                                       survival=est.means(pool), forecast=r.forecast.means(), **self._prompt_fields(r),
                                       **common))
        return out

    def _prompt_fields(self, r: Request) -> dict:
        """A request's uncached prompt work and what restricts a chunk of it: the next capture
        or image-window stop, atomic image spans and the next message endpoint."""
        stops = [x for x in (self._next_capture(r), self._window_stop(r)) if x is not None]
        return dict(prompt_remaining=r.prompt_remaining,
                    prompt_limit=min(stops) - r.consumed if stops else None,
                    atomic_spans=r.spans_from_cursor(), endpoint=r.next_endpoint(), needs_scores=r.needs_scores)

    def plan(self) -> ScheduledPlan | None:
        """The next program to submit, or None when nothing is runnable or the window is blocked.

        Pure: calling it twice without other calls in between returns equal plans and changes
        nothing. A plan with ``needs_empty_window`` must wait until queued work drains (the
        engine then replans); lower-value queueable work never displaces it.
        """
        if self._window_blocked():
            return None
        start = self._planning_start_ns()
        views = self.views(start)
        if not any(v.runnable for v in views):
            return None
        inp = policy.SelectionInput(views, self.graphs, self.costs, self.now_ns, self.policy, self.mode)
        ordinary = policy.select(inp)
        if ordinary is None:
            return None
        chosen, reason, credit = ordinary, ExecutionClass.ORDINARY, 0.0
        if ordinary.indeterminate:
            reason = ExecutionClass.DISCOVERY
        elif self.timing_ledger.can_start():
            alternative = self._refresh_alternative(inp, ordinary)
            if alternative is not None:
                chosen, reason, credit = alternative, ExecutionClass.TIMING_REFRESH, self.timing_ledger.balance_ms
        if reason is ExecutionClass.ORDINARY and self.acceptance_ledger.can_start():
            optimistic = [v if v.survival.size == 0 and v.optimistic.size == 0 else
                          dataclasses.replace(v, survival=v.optimistic) for v in views]
            probe = learning.probe(inp, ordinary, optimistic, self._information)
            if probe is not None:
                chosen, reason, credit = probe, ExecutionClass.ACCEPTANCE_LEARNING, self.acceptance_ledger.balance_ms
        return self._freeze(chosen, reason, credit, start)

    def _refresh_alternative(self, inp: policy.SelectionInput, ordinary: Candidate) -> Candidate | None:
        """The stale alternative a full timing-refresh ledger lets displace the ordinary winner:
        oldest by the later of last valid observation and last attempt, then by value."""
        if not any(self.costs.is_stale(g.key, self.now_ns) for g in self.graphs.graphs):
            return None
        rows = [r for r in policy.scored(inp) if not r.indeterminate and r.graph != ordinary.graph
                and self.costs.is_stale(r.graph.key, self.now_ns)]
        if not rows:
            return None
        return min(rows, key=lambda r: (self.costs.refresh_order_ns(r.graph.key), -r.score)).build()

    def _information(self, rid: int, from_width: int, to_width: int) -> float:
        req = self.requests[rid]
        weights = req.acceptance.get(req.proposal_source).aged_weight(len(req.output))
        return float(np.min(weights[from_width - 1: to_width - 1])) if to_width > from_width else math.inf

    def _freeze(self, c: Candidate, reason: ExecutionClass, credit: float, start: int) -> ScheduledPlan:
        lanes = []
        for lane in c.lanes:
            req = self.requests[lane.rid]
            finishes = lane.role is LaneRole.PROMPT and req.consumed + lane.prompt_tokens == req.prompt_len
            row = None
            if lane.role is LaneRole.TERMINAL or (lane.role is LaneRole.PREREQUISITE
                                                  and c.graph.kind is GraphKind.SNAPSHOT):
                row = req.capture_row
            elif lane.role is LaneRole.PREREQUISITE and c.graph.kind is GraphKind.RESTORE:
                row = req.restore_row
            images, offset = ((), 0)
            if lane.role is LaneRole.PREREQUISITE and c.graph.kind is GraphKind.VISION:
                images, offset = self._vision_lane(req)
            lanes.append(PlanLane(handle=req.handle, slot=req.slot, epoch=req.epoch, role=lane.role,
                                  prompt_tokens=lane.prompt_tokens,
                                  prompt_start=req.consumed if lane.role is LaneRole.PROMPT else 0,
                                  query_length=lane.query_length, ceiling=lane.ceiling,
                                  expected_tokens=lane.expected_tokens, finishes_prompt=finishes,
                                  snapshot_row=row, images=images, feature_offset=offset))
        needs_empty = (not c.graph.kind.may_share_window or c.indeterminate or c.stale
                       or reason is not ExecutionClass.ORDINARY
                       or any(self._needs_feedback(self.requests[l.rid]) for l in c.lanes))
        if c.graph.allocation is Allocation.PREFIX_LIMIT:
            # The device breaks frontier ties by lane position: lanes in slot order make that
            # the original request slot, the order the host priced the allocation with.
            lanes.sort(key=lambda lane: lane.slot)
        return ScheduledPlan(graph=c.graph, lanes=tuple(lanes), decode_mode=self.mode,
                             expected_duration_ms=c.duration_ms, value_rate=c.score, log_scale=c.log_scale,
                             reason=reason, exploration_credit_ms=credit, needs_empty_window=needs_empty,
                             planned_at_ns=self.now_ns, planning_start_ns=start, following=c.following)

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
        for i, lane in enumerate(plan.lanes):
            req = self.requests.get(lane.handle.rid)
            if req is None or req.handle != lane.handle:
                raise PlanRejected(f"lane {i}: request {lane.handle} is no longer resident")
            if not req.active:
                raise PlanRejected(f"lane {i}: request {lane.handle} was cancelled or finished")
            if req.epoch != lane.epoch:
                raise PlanRejected(f"lane {i}: request {lane.handle} moved from epoch {lane.epoch} to {req.epoch}")
            if lane.role is LaneRole.PROMPT and lane.prompt_start != req.consumed:
                raise PlanRejected(f"lane {i}: prompt position moved")
        needs_empty = plan.needs_empty_window or not self.costs.is_fresh(plan.graph.key, self.now_ns)
        if self.frames:
            if needs_empty:
                raise PlanRejected("this plan needs an empty window; wait for queued work to complete")
            if self._window_blocked():
                raise PlanRejected("the execution window is full, draining or overrun")
            if any(self._needs_feedback(self.requests[l.handle.rid]) for l in plan.lanes):
                raise PlanRejected("a lane needs completion feedback before another frame")
        ledger = {ExecutionClass.TIMING_REFRESH: self.timing_ledger,
                  ExecutionClass.ACCEPTANCE_LEARNING: self.acceptance_ledger}.get(plan.reason)
        if ledger is not None and not ledger.can_start():
            raise PlanRejected(f"the {plan.reason.value} credit that funded this plan is no longer full")
        if plan.reason is ExecutionClass.TIMING_REFRESH:
            self.timing_ledger.start()
        elif plan.reason is ExecutionClass.ACCEPTANCE_LEARNING:
            self.acceptance_ledger.start()
        if plan.reason is ExecutionClass.TIMING_REFRESH or plan.reason is ExecutionClass.DISCOVERY \
                or self.costs.is_stale(plan.graph.key, self.now_ns):
            self.costs.note_attempt(plan.graph.key, self.now_ns)
        # Participants: resident, selectable requests at dispatch (later admissions are not).
        participants = tuple(r.handle for r in self.requests.values() if r.active and r.phase is not Phase.BLOCKED)
        previous_end = self.frames[-1].expected_end_ns if self.frames else self.now_ns
        expected_end = None
        if plan.expected_duration_ms is not None:
            expected_end = max(self.now_ns, previous_end or self.now_ns) + int(plan.expected_duration_ms * NS_PER_MS)
        expected_service = {}
        for lane in plan.lanes:
            # Expected output tokens (a finishing prompt lane's first token included): the
            # token rate x counts output, not prompt tokens (docs/scheduling-utility.md).
            deliveries = 1.0 if lane.role is LaneRole.DECODE else 0.0
            expected_service[lane.handle.rid] = (lane.expected_tokens, deliveries)
        self.frames.append(Frame(fence, plan, self.now_ns, expected_end, participants,
                                 self._normalizers(), expected_service))
        for lane in plan.lanes:
            req = self.requests[lane.handle.rid]
            req.inflight.append(fence)
            req.last_selected_ns = self.now_ns
        self.selections[plan.graph.kind.value] += 1
        self.trace.append(TraceRecord(
            fence=fence, kind=plan.graph.kind, batch_capacity=plan.graph.batch_capacity,
            proposal_depth=plan.graph.proposal_depth, token_capacity=plan.graph.token_capacity,
            target_capacity=plan.graph.target_capacity, selected_cost_ms=plan.expected_duration_ms,
            observation_age_ns=self.costs.observation_age_ns(plan.graph.key, self.now_ns), reason=plan.reason,
            exploration_credit_ms=plan.exploration_credit_ms, served=len(plan.lanes)))

    # == completion =========================================================================
    def complete(self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming) -> list[GeneratedToken]:
        return self._complete(fence, records, timing, confidence=None, survival=None)

    def complete_packed_round(self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming,
                              confidence) -> list[GeneratedToken]:
        """Completion of a confidence-producing speculative program (the f32 sidecar
        [2, request_slots, draft_capacity]; row 1 holds joint prefix probabilities). A sequence
        of sidecars is one per rank: all must be valid, rank zero's drives the forecasts."""
        return self._complete(fence, records, timing, confidence=confidence, survival=None)

    def complete_with_survival(self, fence: int, records: Sequence[CompletionRecord], timing: ExecutionTiming,
                               survival) -> list[GeneratedToken]:
        """Completion with completion_speculative_survival rows [request_slots, draft_capacity]."""
        return self._complete(fence, records, timing, confidence=None, survival=survival)

    def complete_packed_round_with_survival(self, fence: int, records: Sequence[CompletionRecord],
                                            timing: ExecutionTiming, confidence, survival) -> list[GeneratedToken]:
        return self._complete(fence, records, timing, confidence=confidence, survival=survival)

    def _validate(self, frame: Frame, records, timing: ExecutionTiming, confidence, survival) -> np.ndarray | None:
        plan = frame.plan
        if len(records) != len(plan.lanes):
            raise ValueError(f"fence {frame.fence}: {len(records)} records for {len(plan.lanes)} lanes")
        device_rows = plan.graph.kind is GraphKind.SPECULATIVE and plan.graph.allocation is not None \
            and plan.graph.allocation.value == "prefix_limit" and plan.graph.proposal_depth > 0
        if device_rows and confidence is None:
            raise ValueError(f"fence {frame.fence}: a device-allocated speculative program completes through "
                             "complete_packed_round with its confidence sidecar")
        for i, (lane, rec) in enumerate(zip(plan.lanes, records)):
            where = f"fence {frame.fence} lane {i} ({lane.handle})"
            if not isinstance(rec, CompletionRecord):
                raise TypeError(f"{where}: expected a CompletionRecord, got {type(rec).__name__}")
            if rec.handle != lane.handle or rec.epoch != lane.epoch:
                raise ValueError(f"{where}: record is for {rec.handle} epoch {rec.epoch}, plan has epoch {lane.epoch}")
            if any((not isinstance(t, (int, np.integer))) or t < 0 for t in rec.tokens):
                raise ValueError(f"{where}: token ids must be nonnegative integers")
            if lane.role is LaneRole.PROMPT:
                if rec.prompt_tokens != lane.prompt_tokens:
                    raise ValueError(f"{where}: consumed {rec.prompt_tokens} prompt tokens, plan has {lane.prompt_tokens}")
                if len(rec.tokens) != (1 if lane.finishes_prompt else 0):
                    raise ValueError(f"{where}: a prompt chunk emits one token only when it finishes the prompt")
                if rec.offered or rec.accepted:
                    raise ValueError(f"{where}: a prompt row verifies no proposals")
            elif lane.role is LaneRole.DECODE:
                rows = lane.query_length or lane.ceiling
                if rec.prompt_tokens:
                    raise ValueError(f"{where}: a decode row consumes no prompt tokens")
                if not 0 <= rec.offered <= min(rows - 1, plan.graph.proposal_depth):
                    raise ValueError(f"{where}: offered {rec.offered} proposals, at most {min(rows - 1, plan.graph.proposal_depth)}")
                if lane.query_length and rec.offered != lane.query_length - 1:
                    raise ValueError(f"{where}: the host binding fixed {lane.query_length - 1} proposals, "
                                     f"the record offered {rec.offered}")
                if not 0 <= rec.accepted <= rec.offered:
                    raise ValueError(f"{where}: accepted {rec.accepted} of {rec.offered} proposals")
                if len(rec.tokens) != rec.accepted + 1:
                    raise ValueError(f"{where}: a round commits its accepted proposals plus one token, "
                                     f"got {len(rec.tokens)} tokens for {rec.accepted} accepted")
            elif rec.tokens or rec.prompt_tokens or rec.offered or rec.accepted:
                raise ValueError(f"{where}: {lane.role.value} rows produce no tokens")
        for x in tuple(timing.device_intervals_ns) + (timing.wall_ns, timing.readiness_delay_ns):
            if not (isinstance(x, (int, float, np.floating, np.integer)) and math.isfinite(x) and x >= 0):
                raise ValueError(f"fence {frame.fence}: timing values must be finite and nonnegative")
        conf = None
        if confidence is not None:
            sidecars = confidence if isinstance(confidence, (list, tuple)) else [confidence]
            for rank, sc in enumerate(sidecars):
                arr = np.asarray(sc, dtype=np.float64)
                if arr.ndim != 3 or arr.shape[0] != 2 or arr.shape[1] != self.catalog.request_slots \
                        or arr.shape[2] < plan.graph.proposal_depth:
                    raise ValueError(f"fence {frame.fence}: rank {rank} sidecar shape {arr.shape}, expected "
                                     f"[2, {self.catalog.request_slots}, >= {plan.graph.proposal_depth}]")
                used = arr[:, [l.slot for l in plan.lanes], : plan.graph.proposal_depth]
                if np.any(~np.isfinite(used)) or np.any((used < 0) | (used > 1)):
                    raise ValueError(f"fence {frame.fence}: rank {rank} confidence must be valid probabilities")
            conf = np.asarray(sidecars[0], dtype=np.float64)
        if survival is not None:
            surv = np.asarray(survival, dtype=np.float64)
            if surv.ndim != 2 or surv.shape[0] != self.catalog.request_slots:
                raise ValueError(f"fence {frame.fence}: survival rows shape {surv.shape}, expected "
                                 f"[{self.catalog.request_slots}, draft_capacity]")
            for i, (lane, rec) in enumerate(zip(plan.lanes, records)):
                vals = surv[lane.slot, : rec.offered]
                if np.any(~np.isfinite(vals)) or np.any((vals < 0) | (vals > 1)):
                    raise ValueError(f"fence {frame.fence} lane {i}: survival values must be probabilities")
        return conf

    def _complete(self, fence, records, timing, confidence, survival) -> list[GeneratedToken]:
        if not self.frames or self.frames[0].fence != fence:
            expected = self.frames[0].fence if self.frames else None
            raise ValueError(f"completion for fence {fence}, but the oldest frame in flight is {expected}")
        frame = self.frames[0]
        records = list(records)
        conf = self._validate(frame, records, timing, confidence, survival)
        surv = None if survival is None else np.asarray(survival, dtype=np.float64)
        # -- validated: from here on state changes ------------------------------------------
        self.frames.popleft()
        plan = frame.plan
        raw_ms = timing.service_interval_ns / NS_PER_MS
        device_ms = timing.device_ns / NS_PER_MS
        valid_timing = timing.device_ns > 0
        # Duration estimates: device replay intervals only (queued or isolated), corrected.
        self.costs.observe(plan.graph.key, timing.device_intervals_ns, self.now_ns,
                           readiness_delay_ns=timing.readiness_delay_ns)
        # Exploration ledgers (raw physical time; never both for one execution).
        credited = raw_ms if valid_timing else timing.wall_ns / NS_PER_MS
        if plan.reason is ExecutionClass.ORDINARY and valid_timing:
            self.timing_ledger.earn(raw_ms)
            self.acceptance_ledger.earn(raw_ms)
        elif plan.reason is ExecutionClass.TIMING_REFRESH:
            self.timing_ledger.close(credited)
        elif plan.reason is ExecutionClass.ACCEPTANCE_LEARNING:
            self.acceptance_ledger.close(credited)
        self.executions[plan.reason.value] += 1
        if plan.graph.kind is GraphKind.SPECULATIVE:
            self.speculative["programs"] += 1  # complete programs, not producer and target calls
        self.execution_ns[plan.reason.value] += int(credited * NS_PER_MS)
        # Committed state, lane by lane.
        served: dict[int, float] = collections.defaultdict(float)
        generated = []
        for lane, rec in zip(plan.lanes, records):
            req = self.requests.get(lane.handle.rid)
            if req is None or req.handle != lane.handle:
                continue
            req.inflight.remove(fence)
            if not req.active or (req.finished and lane.role is not LaneRole.TERMINAL):
                self._maybe_release(req)  # effects after cancellation or termination are dropped
                continue
            tokens = self._apply_lane(req, lane, rec, plan, conf, surv, device_ms, len(plan.lanes))
            served[req.rid] += len(tokens)  # output tokens: the fairness rate x counts no prompt tokens
            if lane.role is LaneRole.TERMINAL:
                # The terminal capture completed: the response's completion becomes visible.
                generated.append(GeneratedToken(req.handle, (), True, req.finish_reason))
                continue
            if req.finished:
                self._end(req)
            if tokens:
                done = req.finished and req.phase is not Phase.TERMINAL
                generated.append(GeneratedToken(req.handle, tuple(tokens), done, req.finish_reason if done else None))
        # Service history: one measured interval per successful frame with a device interval.
        delivery_before = {}
        if valid_timing and raw_ms > 0:
            histories = {rid: r.history for rid, r in self.requests.items()}
            priors = {h.rid: self._missing_rate(self.requests[h.rid], frame.committed_ns, frame.normalizers, histories)
                      for h in frame.participants
                      if h.rid in self.requests and self.requests[h.rid].history.log_x is None}
            for h in frame.participants:
                req = self.requests.get(h.rid)
                if req is None or req.handle != h or req.cancelled:
                    continue
                service.update_token_history(req.history, served.get(req.rid, 0.0), raw_ms, self.policy,
                                             priors.get(req.rid, 0.0))
                delivery_before[req.rid] = req.history.log_z
                req.history.log_z = service.delivery_update(req.history.log_z, 0.0, raw_ms, self.policy)
        self._last_completed = Completed(fence, raw_ms if valid_timing else None, device_ms, delivery_before,
                                         {g.handle.rid for g in generated})
        for req in list(self.requests.values()):
            self._maybe_release(req)
        return generated

    def _apply_lane(self, req: Request, lane: PlanLane, rec: CompletionRecord, plan: ScheduledPlan,
                    conf, surv, frame_ms: float, lanes: int) -> list[int]:
        """Commit one lane's effects; returns the tokens it commits for the request."""
        if lane.role is LaneRole.PROMPT:
            req.consumed += rec.prompt_tokens
            req.epoch += 1
            tokens = []
            if lane.finishes_prompt:
                req.phase = Phase.DECODE
                tokens = self._commit_tokens(req, list(rec.tokens))
            if not req.finished and not self._cross_window(req):
                self._reach_endpoint(req, Phase.DECODE if lane.finishes_prompt else Phase.PREFILL)
            return tokens
        if lane.role is LaneRole.DECODE:
            tokens = self._commit_tokens(req, list(rec.tokens))
            offered = rec.offered
            if offered > 0:
                # A stop or limit at accepted proposal j ends the request: depths 1..j were
                # accepted (observed), the suffix after j is censored.
                terminated = len(tokens) if req.finished and len(tokens) <= rec.accepted else None
                obs = acceptance_observations(self.depth, offered, rec.accepted, terminated_after=terminated,
                                              survival=None if surv is None else surv[lane.slot, :offered])
                req.acceptance.get(req.proposal_source).observe(obs, len(req.output))
                self.acceptance_priors[req.proposal_source].observe(obs)
                self.acceptance_pools[req.proposal_source].observe(obs, 0)
                self.speculative["drafts_offered"] += offered
                self.speculative["drafts_accepted"] += rec.accepted
                if req.proposal_source == SOURCE_LEARNED:
                    # Learned-proposal draws (sampling metrics); copy proposals draw nothing.
                    self.speculative["learned_drafts"] += offered
                for d in range(offered):
                    self.offered_by_position[d + 1] += 1
                    if d < rec.accepted:
                        self.accepted_by_position[d + 1] += 1
            if conf is not None:
                ceiling = lane.ceiling or lane.query_length
                obs = forecast_observations(conf[1, lane.slot], min(ceiling, plan.graph.proposal_depth + 1), self.depth)
                req.forecast.observe(obs, len(req.output))
                self.forecast_prior.observe(obs)
            # Productive decode earns the extra-work fraction of its share of the measured time
            # toward a distinct terminal capture.
            req.terminal_allowance_ms += self.policy.checkpoint_extra_work_fraction * frame_ms / max(1, lanes)
            return tokens
        if lane.role is LaneRole.PREREQUISITE:
            if req.prerequisites and req.prerequisites[0] is plan.graph.kind:
                if plan.graph.kind is GraphKind.SNAPSHOT and req.capture_row is not None:
                    self.checkpoints.captured(req.capture_row, self.now_ns)
                    req.capture_row = None
                    if req.window_row is not None and req.prerequisites[1:2] == [GraphKind.RESTORE]:
                        req.restore_row = req.window_row  # private window state, restored next
                        self.checkpoints.pin(req.window_row, self.now_ns)
                elif plan.graph.kind is GraphKind.RESTORE and req.restore_row is not None:
                    self.checkpoints.unpin(req.restore_row)
                    req.restore_row = None
                    req.generation += 1  # the state is bound to a fresh request generation
                elif plan.graph.kind is GraphKind.VISION:
                    req.window_images_done += max(1, self.images_per_execution)
                req.prerequisites.pop(0)
                if not req.prerequisites:
                    req.phase = req.enables or Phase.PREFILL
                req.epoch += 1
            return []
        if lane.role is LaneRole.TERMINAL:
            if req.capture_row is not None:
                self.checkpoints.captured(req.capture_row, self.now_ns)
                req.capture_row = None
            self._retire(req)
            return []
        return []

    def _commit_tokens(self, req: Request, tokens: list[int]) -> list[int]:
        """Append output up to the first stop token or the output limit."""
        out = []
        for t in tokens:
            if len(req.output) >= req.max_output:
                break
            req.output.append(int(t))
            out.append(int(t))
            if t in req.stop_token_ids:
                req.finish_reason = "stop"
                break
        if req.finish_reason is None and len(req.output) >= req.max_output:
            req.finish_reason = "length"
        return out

    def _retire(self, req: Request) -> None:
        """A finished request leaves selection; resources return after its last fence."""
        req.retired = True
        self._drop_captures(req)
        if req.restore_row is not None:
            self.checkpoints.unpin(req.restore_row)
            req.restore_row = None
        self._maybe_release(req)

    def _maybe_release(self, req: Request) -> None:
        if (req.retired or req.cancelled) and not req.inflight and req.rid in self.requests:
            # Its last fence has completed: an armed capture that never ran (or was cancelled
            # while in flight) returns its row, and a restore that never ran drops its pin.
            if req.capture_row is not None and req.capture_row != req.window_row:
                self.checkpoints.abandon(req.capture_row)
            if req.restore_row is not None and req.restore_row != req.window_row:
                self.checkpoints.unpin(req.restore_row)
            req.capture_row = req.restore_row = None
            if req.window_row is not None:
                self.checkpoints.release_private(req.window_row)
                req.window_row = None
            self.slots.free([req.slot], req.rid)
            self.pages.free(req.pages, req.rid)
            del self.requests[req.rid]

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
            raise ValueError(f"publication for fence {fence} must precede the next completion "
                             f"(last completed: {None if last is None else last.fence})")
        if handle.rid not in last.publishable:
            raise ValueError(f"{handle} produced no tokens in fence {fence}")
        req = self.requests.get(handle.rid)
        if req is None or req.handle != handle:
            return  # retired since (its final burst): nothing left to price
        if handle.rid not in last.published and last.interval_ms is not None:
            last.published.add(handle.rid)
            before = last.delivery_before.get(handle.rid, req.history.log_z)
            if before is None:
                req.history.log_z = service.first_delivery_log_rate(last.frame_ms)
            else:
                req.history.log_z = service.delivery_update(before, 1.0, last.interval_ms, self.policy)
        req.last_publication_ns = self.now_ns

    # == introspection ======================================================================
    def metrics_text(self) -> str:
        """Prometheus exposition of the scheduler's counters (the spec's flare_* as helios_*)."""
        lines = [
            "# HELP helios_scheduler_executions_total Executions by accounting class.",
            "# TYPE helios_scheduler_executions_total counter",
        ]
        classes = [c.value for c in ExecutionClass]
        lines += [f'helios_scheduler_executions_total{{class="{c}"}} {self.executions[c]}' for c in classes]
        lines += ["# HELP helios_scheduler_execution_nanoseconds_total Raw execution time by accounting class.",
                  "# TYPE helios_scheduler_execution_nanoseconds_total counter"]
        lines += [f'helios_scheduler_execution_nanoseconds_total{{class="{c}"}} {self.execution_ns[c]}' for c in classes]
        lines += ["# HELP helios_scheduler_selections_total Committed plans by program kind.",
                  "# TYPE helios_scheduler_selections_total counter"]
        lines += [f'helios_scheduler_selections_total{{kind="{k}"}} {v}' for k, v in sorted(self.selections.items())]
        lines += ["# HELP helios_speculative_programs_total Complete speculative programs (not producer or target calls).",
                  "# TYPE helios_speculative_programs_total counter",
                  f"helios_speculative_programs_total {self.speculative['programs']}",
                  "# TYPE helios_speculative_drafts_offered_total counter",
                  f"helios_speculative_drafts_offered_total {self.speculative['drafts_offered']}",
                  "# TYPE helios_speculative_learned_draws_total counter",
                  f"helios_speculative_learned_draws_total {self.speculative['learned_drafts']}",
                  "# TYPE helios_speculative_drafts_accepted_total counter",
                  f"helios_speculative_drafts_accepted_total {self.speculative['drafts_accepted']}",
                  "# TYPE helios_speculative_accepted_by_position_total counter"]
        lines += [f'helios_speculative_accepted_by_position_total{{position="{d}"}} {self.accepted_by_position[d]}'
                  for d in sorted(self.offered_by_position)]
        lines += ["# TYPE helios_speculative_offered_by_position_total counter"]
        lines += [f'helios_speculative_offered_by_position_total{{position="{d}"}} {self.offered_by_position[d]}'
                  for d in sorted(self.offered_by_position)]
        lines += ["# TYPE helios_scheduler_refresh_credit_ms gauge",
                  f"helios_scheduler_refresh_credit_ms {self.timing_ledger.balance_ms}",
                  "# TYPE helios_scheduler_learning_credit_ms gauge",
                  f"helios_scheduler_learning_credit_ms {self.acceptance_ledger.balance_ms}"]
        return "\n".join(lines) + "\n"

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(f.fence for f in self.frames)

    def owned_pages(self) -> dict[int, int]:
        return self.pages.owned()

    def owned_slots(self) -> dict[int, int]:
        return self.slots.owned()
