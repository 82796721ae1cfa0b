"""Resident requests: admission's reservations, committed state as lanes complete, how a request
ends, and the release of what it owns after its last fence.

A request is resident from admission until it retires (or is cancelled) and its last submitted
fence has completed (``requests.py`` holds the records). :class:`Residents` owns the request
table, the request slots (with their generations, so a stale handle never matches) and the KV
pages; it delegates checkpoint rows and image windows to ``captures.Captures``, what completed
rounds teach to ``learning.Population`` and draft counts to ``stats.Counters``. The scheduler
(``core.py``) decides when; the clock is passed in.

Lane effects of a completed frame, in plan order (validated before any of them):

- PROMPT: the consumed prompt advances (a new epoch); the chunk that finishes the prompt commits
  the first output token; then an image-window boundary or a capture endpoint may block it.
- DECODE: committed tokens (up to a stop token or the output limit), acceptance observations of
  the verified proposals and forecast observations of a confidence sidecar; the lane's share of
  the measured time funds a terminal capture.
- PREREQUISITE and TERMINAL: the state operation's rows (``captures.py``); a terminal capture
  retires the request and makes its completion visible.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from helios_jax.scheduler.captures import Captures
from helios_jax.scheduler.learning import Population
from helios_jax.scheduler.plan import CompletionRecord, Frame, GeneratedToken, Handle, PlanLane, ScheduledPlan
from helios_jax.scheduler.requests import Admission, Pool, Request, ResourceError
from helios_jax.scheduler.service import ServiceHistory
from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate
from helios_jax.scheduler.stats import Counters
from helios_jax.scheduler.view import LaneRole, Phase


class Residents:
    """The resident requests and the request slots and KV pages they own."""

    def __init__(
        self,
        request_slots: int,
        kv_pages: int,
        captures: Captures,
        population: Population,
        counters: Counters,
    ):
        self.requests: dict[int, Request] = {}
        self.slots = Pool(request_slots, "request slots")
        self.pages = Pool(kv_pages, "KV pages")
        self._slot_generation = [0] * request_slots
        self._next_rid = 0
        self.captures = captures
        self.population = population
        self.counters = counters

    # == admission and lookup ===============================================================
    def reserve(self, pages_needed: int) -> tuple[Handle, int, list[int]]:
        """A request slot (its generation bumped) and `pages_needed` KV pages for a new request."""
        if not self.slots.can_allocate():
            raise ResourceError("no free request slot")
        if not self.pages.can_allocate(pages_needed):
            raise ResourceError(f"{pages_needed} KV pages needed, {self.pages.available} free")
        rid = self._next_rid
        self._next_rid += 1
        slot = self.slots.allocate(1, rid)[0]
        self._slot_generation[slot] += 1
        pages = self.pages.allocate(pages_needed, rid)
        return Handle(rid, self._slot_generation[slot]), slot, pages

    def new_request(
        self,
        admission: Admission,
        pages_needed: int,
        now_ns: int,
        acceptance_history: dict[str, PrefixEstimate] | None,
        forecast_history: PrefixEstimate | None,
    ) -> Request:
        """The record of a checked admission, holding its reserved slot and pages and fresh
        (or preseeded) estimates; the caller enters it in the table once its prerequisites are
        decided."""
        self.population.check_preseeded(acceptance_history)  # before anything is reserved
        handle, slot, pages = self.reserve(pages_needed)
        return Request(
            handle=handle,
            slot=slot,
            pages=pages,
            admitted_ns=now_ns,
            history=ServiceHistory(),
            acceptance=self.population.new_acceptance(acceptance_history),
            forecast=self.population.new_forecast(forecast_history),
            **admission,
        )

    def lookup(self, handle: Handle) -> Request:
        req = self.requests.get(handle.rid)
        if req is None or req.handle != handle:
            raise KeyError(f"unknown or stale request handle {handle}")
        return req

    # == ending =============================================================================
    def cancel(self, req: Request) -> None:
        """Stop selecting the request now; its resources stay owned through its last fence."""
        req.cancelled = True
        self.captures.drop_captures(req)
        self.release(req)

    def preempt(self, req: Request, now_ns: int) -> None:
        """Retire an active request without completing its response, capturing its state first
        when a destination row is obtainable."""
        req.finish_reason = "preempted"
        req.epoch += 1
        self.captures.drop_captures(req)
        if not self.captures.begin_terminal_capture(req, now_ns, funded=True):
            self.retire(req)

    def end(self, req: Request, now_ns: int) -> None:
        """A validated termination: a funded terminal capture, or retirement now.

        A request that ends right at its anchor (its prompt end, with one output token) still
        captures the anchor: the terminal capture then holds exactly the anchor's state.
        """
        at_anchor = self.captures.ends_at_anchor(req)
        self.captures.drop_captures(req)
        if not self.captures.begin_terminal_capture(req, now_ns, funded=at_anchor):
            self.retire(req)

    def retire(self, req: Request) -> None:
        """A finished request leaves selection; resources return after its last fence."""
        req.retired = True
        self.captures.retire(req)
        self.release(req)

    def release(self, req: Request) -> None:
        """Once a retired or cancelled request's last fence has completed: its rows, slot and pages."""
        if (req.retired or req.cancelled) and not req.inflight and req.rid in self.requests:
            self.captures.release(req)
            self.slots.free([req.slot], req.rid)
            self.pages.free(req.pages, req.rid)
            del self.requests[req.rid]

    # == completed lanes ====================================================================
    def apply(
        self,
        frame: Frame,
        records: Sequence[CompletionRecord],
        conf: np.ndarray | None,
        surv: np.ndarray | None,
        frame_ms: float,
        fraction: float,
        now_ns: int,
    ) -> tuple[dict[int, float], list[GeneratedToken]]:
        """Committed state, lane by lane: output tokens served per request and what to publish.

        `frame_ms`: the measured device time, whose per-lane share times `fraction`
        (checkpoint_extra_work_fraction) funds terminal captures.
        """
        served: dict[int, float] = collections.defaultdict(float)
        generated = []
        allowance_ms = fraction * frame_ms / max(1, len(frame.plan.lanes))
        for lane, rec in zip(frame.plan.lanes, records):
            req = self.requests.get(lane.handle.rid)
            if req is None or req.handle != lane.handle:
                continue
            req.inflight.remove(frame.fence)
            if not req.active or (req.finished and lane.role is not LaneRole.TERMINAL):
                self.release(req)  # effects after cancellation or termination are dropped
                continue
            tokens = self._apply_lane(req, lane, rec, frame.plan, conf, surv, allowance_ms, now_ns)
            served[req.rid] += len(tokens)  # output tokens: the fairness rate x counts no prompt tokens
            if lane.role is LaneRole.TERMINAL:
                # The terminal capture completed: the response's completion becomes visible.
                generated.append(GeneratedToken(req.handle, (), True, req.finish_reason))
                continue
            if req.finished:
                self.end(req, now_ns)
            if tokens:
                done = req.finished and req.phase is not Phase.TERMINAL
                reason = req.finish_reason if done else None
                generated.append(GeneratedToken(req.handle, tuple(tokens), done, reason))
        return served, generated

    def _apply_lane(
        self,
        req: Request,
        lane: PlanLane,
        rec: CompletionRecord,
        plan: ScheduledPlan,
        conf: np.ndarray | None,
        surv: np.ndarray | None,
        allowance_ms: float,
        now_ns: int,
    ) -> list[int]:
        """Commit one lane's effects; returns the tokens it commits for the request."""
        if lane.role is LaneRole.PROMPT:
            return self._apply_prompt(req, lane, rec, now_ns)
        if lane.role is LaneRole.DECODE:
            tokens = req.commit_tokens(rec.tokens)
            self._learn(req, lane, rec, plan, tokens, conf, surv)
            # Productive decode earns the extra-work fraction of its share of the measured time
            # toward a distinct terminal capture.
            req.capture.terminal_allowance_ms += allowance_ms
            return tokens
        if lane.role is LaneRole.PREREQUISITE:
            self.captures.prerequisite_done(req, plan.graph.kind, now_ns)
        elif lane.role is LaneRole.TERMINAL:
            self.captures.terminal_done(req, now_ns)
            self.retire(req)
        return []

    def _apply_prompt(self, req: Request, lane: PlanLane, rec: CompletionRecord, now_ns: int) -> list[int]:
        req.consumed += rec.prompt_tokens
        req.epoch += 1
        tokens = []
        if lane.finishes_prompt:
            req.phase = Phase.DECODE
            tokens = req.commit_tokens(rec.tokens)
        if not req.finished and not self.captures.cross_window(req, now_ns):
            enables = Phase.DECODE if lane.finishes_prompt else Phase.PREFILL
            self.captures.reach_endpoint(req, enables, now_ns)
        return tokens

    def _learn(
        self,
        req: Request,
        lane: PlanLane,
        rec: CompletionRecord,
        plan: ScheduledPlan,
        tokens: list[int],
        conf: np.ndarray | None,
        surv: np.ndarray | None,
    ) -> None:
        """Acceptance observations of a decode lane's verified proposals, and its forecast."""
        if rec.offered > 0:
            survival = None if surv is None else surv[lane.slot, : rec.offered].tolist()
            self.population.observe_acceptance(req, rec, len(tokens), survival)
            self.counters.drafts(req.proposal_source == SOURCE_LEARNED, rec.offered, rec.accepted)
        if conf is not None:
            self.population.observe_forecast(req, lane, conf[1, lane.slot], plan.graph.proposal_depth)
