"""Random admit/plan/commit/complete/cancel/publish sequences keep the scheduler's invariants."""
import math

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from helios_jax.scheduler.core import NS_PER_MS, PlanRejected, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.view import LaneRole

from .helpers import ORDINARY, SPEC


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(speculative=st.booleans(), checkpoints=st.booleans())
    def setup(self, speculative, checkpoints):
        self.s = Scheduler(SPEC if speculative else ORDINARY, kv_pages=96, page_size=16, checkpoints=checkpoints,
                           snapshot_rows=3)
        self.s.seed_costs(0)
        self.now = 0.0
        self.fence = 0
        self.handles = []
        self.epochs = {}
        self.pending_publication = None

    def _publish(self):
        if self.pending_publication:
            fence, handles = self.pending_publication
            for h in handles:
                self.s.published_output(h, fence)
            self.pending_publication = None

    @rule(prompt=st.integers(1, 300), out=st.integers(1, 40), host_stops=st.booleans(),
          endpoints=st.lists(st.integers(1, 300), max_size=3))
    def admit(self, prompt, out, host_stops, endpoints):
        try:
            self.handles.append(self.s.admit([3] * prompt, max_output=out, host_stops=host_stops, stop_token_ids=[0],
                                             message_endpoints=[e for e in endpoints if e <= prompt]))
        except ResourceError:
            assert not self.s.can_admit(prompt, out)

    @rule()
    def plan_and_commit(self):
        self.s.advance_to(int(self.now * NS_PER_MS))
        plan = self.s.plan()
        if plan is None:
            return
        assert plan == self.s.plan()  # pure
        if plan.needs_empty_window and self.s.in_flight:
            with pytest.raises(PlanRejected):
                self.s.commit(plan, self.fence + 1)
            return
        self.fence += 1
        self.s.commit(plan, self.fence)

    def _records(self, plan, accepted, stop):
        out = []
        for lane in plan.lanes:
            if lane.role is LaneRole.PROMPT:
                out.append(CompletionRecord(lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens,
                                            tokens=(0 if stop else 3,) if lane.finishes_prompt else ()))
            elif lane.role is LaneRole.DECODE:
                rows = lane.query_length or lane.ceiling
                a = min(accepted, rows - 1)
                out.append(CompletionRecord(lane.handle, lane.epoch, tokens=(3,) * a + ((0,) if stop else (3,)),
                                            offered=rows - 1, accepted=a))
            else:
                out.append(CompletionRecord(lane.handle, lane.epoch))
        return out

    @precondition(lambda self: self.s.in_flight)
    @rule(accepted=st.integers(0, 7), stop=st.booleans(), ms=st.floats(0.5, 20.0))
    def complete(self, accepted, stop, ms):
        self._publish()
        frame = self.s.frames[0]
        self.now += ms
        self.s.advance_to(int(self.now * NS_PER_MS))
        records = self._records(frame.plan, accepted, stop)
        timing = ExecutionTiming((ms * NS_PER_MS,), ms * NS_PER_MS, queued=len(self.s.frames) > 1)
        device = frame.plan.graph.allocation is not None and frame.plan.graph.allocation.value == "prefix_limit" \
            and frame.plan.graph.proposal_depth > 0
        if device:
            import numpy as np
            sidecar = np.full((2, self.s.catalog.request_slots, frame.plan.graph.proposal_depth), 0.5, np.float32)
            gen = self.s.complete_packed_round(frame.fence, records, timing, sidecar)
        else:
            gen = self.s.complete(frame.fence, records, timing)
        self.pending_publication = (frame.fence, [g.handle for g in gen])

    @precondition(lambda self: self.s.in_flight)
    @rule(which=st.integers(0, 3))
    def malformed_completion_changes_nothing(self, which):
        frame = self.s.frames[0]
        records = self._records(frame.plan, 0, False)
        r = records[0]
        bad = [
            records[:-1] if len(records) > 1 else records + records,
            [CompletionRecord(r.handle, r.epoch + 7, r.prompt_tokens, r.tokens, r.offered, r.accepted)] + records[1:],
            [CompletionRecord(r.handle, r.epoch, r.prompt_tokens + 1, r.tokens, r.offered, r.accepted)] + records[1:],
            [CompletionRecord(r.handle, r.epoch, r.prompt_tokens, r.tokens + (3, 3, 3, 3, 3, 3, 3, 3, 3),
                              r.offered, r.accepted)] + records[1:],
        ][which]
        before = self._state()
        with pytest.raises((ValueError, TypeError)):
            self.s.complete(frame.fence, bad, ExecutionTiming((1e6,), 1e6))
        assert self._state() == before

    def _state(self):
        s = self.s
        return ({rid: (r.epoch, r.consumed, tuple(r.output), r.history.log_x, r.history.log_z, tuple(r.inflight))
                 for rid, r in s.requests.items()}, s.pages.owned(), s.slots.owned(), s.in_flight,
                s.costs.version, s.timing_ledger.balance_ms, s.acceptance_ledger.balance_ms)

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 1000))
    def cancel(self, i):
        h = self.handles[i % len(self.handles)]
        if h.rid in self.s.requests and self.s.requests[h.rid].handle == h:
            self.s.cancel(h)

    @rule(ms=st.floats(0.0, 50.0))
    def wait(self, ms):
        self._publish()
        self.now += ms
        self.s.advance_to(int(self.now * NS_PER_MS))

    @invariant()
    def resources_are_owned_once_and_never_leak(self):
        s = self.s
        pages, slots = s.pages.owned(), s.slots.owned()
        assert sum(len(r.pages) for r in s.requests.values()) == len(pages)
        for rid, r in s.requests.items():
            assert slots[r.slot] == rid and all(pages[p] == rid for p in r.pages)
            assert r.active or r.inflight  # finished or cancelled requests stay only while fenced
        assert s.pages.available + len(pages) == s.pages.size

    @invariant()
    def checkpoint_rows_are_accounted(self):
        store = self.s.checkpoints
        assert store.free_rows + len(store.entries) == store.size
        for cp in store.entries.values():
            assert cp.pins >= 0

    @rule(i=st.integers(0, 1000))
    def preempt(self, i):
        if self.handles:
            h = self.handles[i % len(self.handles)]
            if h.rid in self.s.requests and self.s.requests[h.rid].handle == h:
                self.s.preempt(h)

    @invariant()
    def epochs_are_monotone(self):
        for rid, r in self.s.requests.items():
            assert r.epoch >= self.epochs.get(rid, 0)
            self.epochs[rid] = r.epoch

    @invariant()
    def prices_are_finite(self):
        for v in self.s.views():
            assert math.isfinite(v.log_prefill_price) and math.isfinite(v.log_output_price)
            assert v.log_delivery_price < math.inf

    @invariant()
    def drain_only_frames_run_alone(self):
        frames = self.s.frames
        assert len(frames) <= 2
        if len(frames) == 2:
            assert all(f.plan.graph.kind.may_share_window for f in frames)


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestScheduler = pytest.mark.spec("service-accounting/validate-first", "planning-queue/double-occupancy",
                                 "planning-queue/pages-pinned", "service-accounting/cancelled-slot-reuse",
                                 "verification/lifecycle-no-outrank")(TestScheduler)
