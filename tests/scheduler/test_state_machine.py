"""Random scheduler lifecycles keep the scheduler's invariants.

The machine drives the real Scheduler the way an engine may: admissions (shared prompt prefixes,
message endpoints, host stops, scored prompts, images in one or several windows), plans committed
into the two-slot window (a second frame queued behind the first whenever the plan allows it),
completions in fence order with queued or isolated timing (positive, zero or missing device
intervals, several ranks, wall time), speculative rounds whose offered and accepted proposals
follow the plan (host query lengths, or device ceilings with the allocation computed from a
confidence sidecar), optional survival rows, stop tokens inside accepted prefixes, publication of
the visible bursts before the next completion, cancellation (also of requests with frames in
flight), preemption, host finishes, saved plans committed late, and malformed completions.

After every step it checks:

- no KV page, request slot or checkpoint row is owned twice, or owned by a request that is no
  longer resident; every frame's requests stay resident through its fence; checkpoint pins
  equal the references that will release them, an unready row always has a capture pending,
  and a checkpoint never claims more tokens than its owner's committed state;
- both exploration ledgers within their bounds (balance at most the 5 ms cap, spent time at most
  rate x earned + the largest single episode) and earning/paying exactly the credited time;
- a request's committed output equals the tokens the scheduler returned for it, never exceeds
  max_output, and each completion returns exactly the accepted prefix up to the first stop
  token; the prompt cursor never passes the prompt; epochs only grow; plans are pure.

Teardown completes every frame and cancels every request: nothing may be left owned, and every
remaining checkpoint row must hold a published (ready, unpinned) checkpoint.
"""

import collections
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler.checkpoints import Role
from helios_jax.scheduler.core import NS_PER_MS, PlanRejected, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionClass, ExecutionTiming
from helios_jax.scheduler.pricing import runnable
from helios_jax.scheduler.refresh import CREDIT_CAP_MS
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.rounds import allocate_prefix_rows
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, RAGGED, SPEC, k_step_only

TOKEN, STOP = 3, 0
CATALOGS = {
    "speculative": SPEC,
    "ordinary": ORDINARY,
    "ragged": RAGGED,
    # `--decode_steps=4` without mixed programs: every decode frame runs K steps, so a capture's
    # follower is a K-step program (a catalog with no single-step follower once left every
    # request blocked on its snapshot).
    "k-step": k_step_only(with_decode_steps(ORDINARY, (4,), 0.5)),
    # `--decode_steps=1,4` under speculation: width-one rounds of one and of four steps beside
    # the verifying ones.
    "k-step-width-one": with_decode_steps(SPEC, (4,), 0.5),
}
EPS = 1e-9
REQUEST = st.fixed_dictionaries(
    {
        "prompt": st.one_of(st.integers(1, 40), st.integers(1, 300)),
        "out": st.one_of(st.integers(1, 40), st.integers(40, 200)),
        "host_stops": st.booleans(),
        "needs_scores": st.booleans(),
        "endpoints": st.lists(st.integers(1, 300), max_size=3),
        "images": st.lists(st.integers(8, 40), max_size=3),  # image sizes, placed in the prompt in order
    }
)
ENGINE = st.integers(0, 3)  # engine rounds that run after a client action (the loop never stops)
DURATION_MS = st.one_of(st.floats(0.5, 20.0), st.sampled_from([80.0, 300.0, 1200.0]))


def device_allocated(graph) -> bool:
    return (
        graph.kind is GraphKind.SPECULATIVE
        and graph.allocation is Allocation.PREFIX_LIMIT
        and graph.proposal_depth > 0
    )


def expected_commit(tokens, before: int, max_output: int) -> tuple:
    """What the scheduler must commit of a lane's tokens: up to the first stop or the limit."""
    out = []
    for t in tokens:
        if before + len(out) >= max_output:
            break
        out.append(t)
        if t == STOP:
            break
    return tuple(out)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        catalog=st.sampled_from(sorted(CATALOGS)),
        checkpoints=st.sampled_from([True, True, False]),
        snapshot_rows=st.integers(1, 4),
        initialize_requests=st.booleans(),
        vision_window_tokens=st.sampled_from([None, 40, 40]),
        initial=st.lists(REQUEST, min_size=1, max_size=5),
    )
    def setup(self, catalog, checkpoints, snapshot_rows, initialize_requests, vision_window_tokens, initial):
        self.s = Scheduler(
            CATALOGS[catalog],
            kv_pages=96,
            page_size=16,
            checkpoints=checkpoints,
            snapshot_rows=snapshot_rows,
            initialize_requests=initialize_requests and bool(CATALOGS[catalog].of_kind(GraphKind.INITIALIZE)),
            vision_window_tokens=vision_window_tokens,
        )
        self.s.seed_costs(0)
        self.now = 0.0  # ms
        self.fence = 0
        self.queued = {}  # fence -> the frame was committed behind another frame
        self.handles = []
        self.epochs = {}
        self.returned = collections.defaultdict(list)  # rid -> tokens returned by completions
        self.ended = set()  # rids whose response completion (finished=True) was returned
        self.stopped = set()  # rids that may receive no further tokens (cancel, preempt, finish, end)
        self.cancelled = set()
        self.pending_publication = None  # (fence, [handles]) of the last completion
        self.saved_plan = None
        # Independent ledger model: credited ordinary time, per-ledger paid episodes.
        self.earned = 0.0
        self.paid = {"timing": [], "acceptance": []}
        self.seen_checkpoints = set()
        self.last_interval_valid = True
        self.limits = {}  # rid -> max_output
        for request in initial:
            self._admit(**request)

    # == helpers =========================================================================
    def _resident(self, h):
        r = self.s.requests.get(h.rid)
        return r if r is not None and r.handle == h else None

    def _pick(self, i):
        live = [h for h in self.handles if self._resident(h) is not None]
        return live[i % len(live)] if live else None

    def _state(self):
        s = self.s
        reqs = {
            rid: (
                r.epoch,
                r.consumed,
                tuple(r.output),
                r.finish_reason,
                r.phase,
                r.cancelled,
                r.retired,
                r.history.log_x,
                r.history.log_z,
                tuple(r.inflight),
                r.capture.row,
                r.capture.restore_row,
                tuple(r.capture.endpoints),
                tuple(r.prerequisites),
                r.last_publication_ns,
                r.acceptance.get(r.proposal_source).means().tobytes(),
                r.forecast.means().tobytes(),
            )
            for rid, r in s.requests.items()
        }
        store = s.checkpoints
        cps = {
            row: (cp.tokens, cp.role, cp.owner, cp.ready, cp.pins, cp.last_demand_ns)
            for row, cp in store.entries.items()
        }
        ledgers = tuple(
            (ledger.balance_ms, ledger.episode_active, ledger.earned_from_ms, ledger.spent_ms)
            for ledger in (s.timing_ledger, s.acceptance_ledger)
        )
        return (
            reqs,
            s.pages.owned(),
            s.slots.owned(),
            s.in_flight,
            s.costs.version,
            ledgers,
            cps,
            dict(store.guards),
            tuple(sorted(store._free)),
            dict(s.speculative),
            dict(s.executions),
            None
            if s._last_completed is None
            else (s._last_completed.fence, set(s._last_completed.published)),
        )

    def _publish(self, handles):
        fence, _ = self.pending_publication
        for h in handles:
            self.s.published_output(h, fence)

    # == admission, cancellation, preemption, host finishes ==================================
    @rule(request=REQUEST, data=st.data(), then_engine_rounds=ENGINE)
    def admit(self, request, data, then_engine_rounds):
        self._admit(**request)
        self._engine(data, then_engine_rounds)

    def _admit(self, prompt, out, host_stops, needs_scores, endpoints, images):
        spans, start = [], 5
        for size in images if self.s.captures.images_per_execution else ():
            if start + size > prompt:
                break
            spans.append((start, start + size))
            start += size + 10
        # Prompt scores on a catalog without a scored prefill could never be served: refused.
        scored = any(g.kind is GraphKind.SCORED_PREFILL for g in self.s.graphs.graphs)
        unservable = needs_scores and not scored
        before = self._state() if unservable else None
        try:
            h = self.s.admit(
                [TOKEN] * prompt,
                max_output=out,
                host_stops=host_stops,
                stop_token_ids=[STOP],
                needs_scores=needs_scores,
                message_endpoints=[e for e in endpoints if e <= prompt],
                image_spans=spans,
            )
        except ResourceError:
            assert not self.s.can_admit(prompt, out) or len(self.s.captures.image_windows(spans)) > 1
            candidate = self.s.preemption_candidate(prompt, out)
            if candidate is not None:
                r = self._resident(candidate)
                assert r is not None and r.active and r.phase is Phase.DECODE
                assert self.s.pages.available + len(r.pages) >= self.s.pages_needed(prompt, out)
            return
        except ValueError:
            assert unservable and self._state() == before
            return
        assert not unservable
        self.handles.append(h)
        self.limits[h.rid] = out
        assert h.rid not in self.returned
        r = self.s.requests[h.rid]
        if r.capture.restore_row is not None:
            event("admission restores a checkpoint")
        if r.image_windows.bounds:
            event(f"admission with {len(r.image_windows.bounds)} image windows")

    @rule(i=st.integers(0, 1000), data=st.data(), then_engine_rounds=ENGINE)
    def cancel(self, i, data, then_engine_rounds):
        h = self._pick(i)
        if h is not None:
            self._cancel(h)
        self._engine(data, then_engine_rounds)

    def _cancel(self, h):
        if self._resident(h).inflight:
            event("cancel with frames in flight")
        self.s.cancel(h)
        self.cancelled.add(h)
        self.stopped.add(h.rid)
        r = self._resident(h)
        assert r is None or r.inflight  # resources stay owned only through its last fence

    @rule(i=st.integers(0, 1000))
    def stale_handles_are_refused(self, i):
        gone = [h for h in self.handles if self._resident(h) is None]
        if not gone:
            return
        h = gone[i % len(gone)]
        before = self._state()
        for call in (self.s.cancel, self.s.preempt, self.s.finish, self.s.page_table):
            with pytest.raises(KeyError):
                call(h)
        assert self._state() == before

    @rule(i=st.integers(0, 1000), data=st.data(), then_engine_rounds=ENGINE)
    def preempt(self, i, data, then_engine_rounds):
        h = self._pick(i)
        if h is not None:
            self._preempt(h)
        self._engine(data, then_engine_rounds)

    def _preempt(self, h):
        was_active = self._resident(h).active
        self.s.preempt(h)
        if was_active and self._resident(h) is not None and self._resident(h).phase is Phase.TERMINAL:
            event("preempt captures")
        if was_active:
            self.stopped.add(h.rid)
            r = self._resident(h)
            assert r is None or r.phase is Phase.TERMINAL or r.inflight

    @rule(i=st.integers(0, 1000), data=st.data(), then_engine_rounds=ENGINE)
    def host_finish(self, i, data, then_engine_rounds):
        h = self._pick(i)
        if h is not None:
            self._host_finish(h)
        self._engine(data, then_engine_rounds)

    def _host_finish(self, h):
        r = self._resident(h)
        was_open = r.active and not r.finished
        self.s.finish(h)
        if was_open:
            self.stopped.add(h.rid)

    # == planning and commit =============================================================
    @rule(twice=st.booleans())
    def plan_and_commit(self, twice):
        """Plan (twice: plans are pure) and commit, or see the commit refused unchanged."""
        self._fill(2 if twice else 1, check_purity=True)

    def _fill(self, frames, check_purity=False):
        for _ in range(frames):
            self.s.advance_to(int(self.now * NS_PER_MS))
            before = self._state() if check_purity else None
            plan = self.s.plan()
            if check_purity:
                assert plan == self.s.plan()
                assert self._state() == before
            if plan is None:
                # Liveness: with nothing in flight, a request that can be served is served.
                assert self.s.in_flight or not any(runnable(r) for r in self.s.requests.values())
                return
            self._check_plan(plan)
            if plan.needs_empty_window and self.s.in_flight:
                before = self._state()
                with pytest.raises(PlanRejected):
                    self.s.commit(plan, self.fence + 1)
                assert self._state() == before
                return
            self._commit(plan)

    def _check_plan(self, plan):
        rids = [each.handle.rid for each in plan.lanes]
        slots = [each.slot for each in plan.lanes]
        assert len(set(rids)) == len(rids) and len(set(slots)) == len(slots)
        assert len(plan.lanes) <= plan.graph.batch_capacity
        for lane in plan.lanes:
            r = self._resident(lane.handle)
            assert r is not None and r.slot == lane.slot and r.active
            assert lane.handle not in self.cancelled
        if device_allocated(plan.graph):
            decode = [each for each in plan.lanes if each.role is LaneRole.DECODE]
            assert len(decode) <= plan.graph.target_capacity
            assert all(
                1 <= each.ceiling <= plan.graph.proposal_depth + 1 and not each.query_length
                for each in decode
            )

    def _commit(self, plan):
        queued = bool(self.s.in_flight)
        if queued:  # fences must increase: a repeated fence is refused before anything changes
            before = self._state()
            with pytest.raises(ValueError):
                self.s.commit(plan, self.s.in_flight[-1])
            assert self._state() == before
        self.fence += 1
        self.s.commit(plan, self.fence)
        self.queued[self.fence] = queued
        self._check_invariants()
        event(f"commit {plan.graph.kind.value} {plan.reason.value}" + (" queued" if queued else ""))

    @rule()
    def save_plan(self):
        self.s.advance_to(int(self.now * NS_PER_MS))
        self.saved_plan = self.s.plan()

    @rule()
    def commit_saved_plan(self):
        """A plan may outlive later calls: commit takes it or refuses it without side effects."""
        plan, self.saved_plan = self.saved_plan, None
        if plan is None:
            return
        self.s.advance_to(int(self.now * NS_PER_MS))
        before = self._state()
        queued = bool(self.s.in_flight)
        try:
            self.s.commit(plan, self.fence + 1)
        except PlanRejected:
            assert self._state() == before
            return
        self.fence += 1
        self.queued[self.fence] = queued
        for lane in plan.lanes:
            assert lane.handle not in self.cancelled

    # == completion =========================================================================
    def _records(self, data, plan, clean=False):
        """Completion records for `plan` (and the confidence sidecars of a device-allocated
        program): offered and accepted proposals per lane as the plan binds them."""
        graph = plan.graph
        slots = self.s.catalog.request_slots
        rows = {}
        sidecars = None
        decode = [each for each in plan.lanes if each.role is LaneRole.DECODE]
        if device_allocated(graph):
            depth = graph.proposal_depth
            ranks = 1 if clean else data.draw(st.integers(1, 2), label="ranks")
            sidecars = []
            for _rank in range(ranks):
                sc = np.zeros((2, slots, depth), np.float32)
                for lane in plan.lanes:
                    cond = (
                        [0.5] * depth
                        if clean
                        else data.draw(
                            st.lists(
                                st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]), min_size=depth, max_size=depth
                            ),
                            label="conditional",
                        )
                    )
                    sc[0, lane.slot] = cond
                    sc[1, lane.slot] = np.cumprod(cond)
                sidecars.append(sc)
            order = sorted(decode, key=lambda each: each.slot)
            alloc = allocate_prefix_rows(
                sidecars[0][1, [each.slot for each in order]],
                [each.ceiling for each in order],
                [True] * len(order),
                graph.target_capacity,
            )
            assert int(alloc.sum()) <= graph.target_capacity
            for lane, n in zip(order, alloc):
                assert 1 <= n <= lane.ceiling
                rows[lane.handle] = int(n)
        records = []
        for lane in plan.lanes:
            stop = False if clean else data.draw(st.sampled_from([False] * 7 + [True]), label="stop")
            if lane.role is LaneRole.PROMPT:
                records.append(
                    CompletionRecord(
                        lane.handle,
                        lane.epoch,
                        prompt_tokens=lane.prompt_tokens,
                        tokens=((STOP if stop else TOKEN),) if lane.finishes_prompt else (),
                    )
                )
            elif lane.role is LaneRole.DECODE and graph.steps > 1:  # K-step: its steps, or to a stop
                tokens = [TOKEN] * lane.ceiling
                if stop:
                    tokens = tokens[: data.draw(st.integers(0, lane.ceiling - 1), label="stop at")] + [STOP]
                records.append(CompletionRecord(lane.handle, lane.epoch, tokens=tuple(tokens)))
            elif lane.role is LaneRole.DECODE:
                n = rows.get(lane.handle, lane.query_length)
                assert n >= 1
                offered = min(n - 1, graph.proposal_depth)
                accepted = 0 if clean else data.draw(st.integers(0, offered), label="accepted")
                tokens = [TOKEN] * (accepted + 1)
                if stop:  # a stop token inside the accepted prefix (or as the bonus token)
                    tokens[data.draw(st.integers(0, accepted), label="stop at")] = STOP
                records.append(
                    CompletionRecord(
                        lane.handle, lane.epoch, tokens=tuple(tokens), offered=offered, accepted=accepted
                    )
                )
            else:
                records.append(CompletionRecord(lane.handle, lane.epoch))
        return records, sidecars

    def _timing(self, data, queued, ms):
        kind = data.draw(st.sampled_from(["device", "device", "zero", "missing", "ranks"]), label="timing")
        wall = ms * data.draw(st.sampled_from([1.0, 1.0, 1.1, 3.0, 0.5]), label="wall/device")
        device = {
            "device": (ms * NS_PER_MS,),
            "zero": (0.0,),
            "missing": (),
            "ranks": (0.0, ms * NS_PER_MS, 0.7 * ms * NS_PER_MS),
        }[kind]
        return ExecutionTiming(device, wall * NS_PER_MS, queued=queued)

    @rule(data=st.data(), rounds=st.integers(1, 8))
    def engine_rounds(self, data, rounds):
        self._engine(data, rounds)

    def _engine(self, data, rounds):
        """What an engine loop does: fill the window, complete the oldest frame, publish; it may
        stop with the window filled again (frames in flight across the next client action)."""
        for _ in range(rounds):
            self._fill(2)
            if not self.s.in_flight:
                return
            self.complete(
                data,
                data.draw(DURATION_MS, label="ms"),
                publish_rest=False,
                survival=data.draw(st.booleans(), label="survival"),
            )
            self.publish(data, data.draw(st.sampled_from([0.0, 0.0, 0.0, 2.0]), label="delay"))
        if rounds and data.draw(st.booleans(), label="refill"):
            self._fill(2)

    @rule(data=st.data(), ms=DURATION_MS, publish_rest=st.booleans(), survival=st.booleans())
    def complete(self, data, ms, publish_rest, survival):
        if not self.s.in_flight:
            return
        if self.pending_publication and publish_rest:
            self._publish(self.pending_publication[1])
        self.pending_publication = None
        frame = self.s.frames[0]
        plan = frame.plan
        self.now += ms
        self.s.advance_to(int(self.now * NS_PER_MS))
        records, sidecars = self._records(data, plan)
        timing = self._timing(data, self.queued.pop(frame.fence), ms)
        surv = None
        if survival and plan.graph.proposal_depth > 0:
            width = max(plan.graph.proposal_depth, self.s.depth)
            surv = np.cumprod(
                np.full(
                    (self.s.catalog.request_slots, width),
                    data.draw(st.sampled_from([0.0, 0.6, 1.0]), label="survival"),
                ),
                axis=1,
            )
        pre = {}
        for lane in plan.lanes:
            r = self._resident(lane.handle)
            pre[lane.handle] = None if r is None else (r.active, r.finished, len(r.output), r.max_output)
        ledgers = {"timing": self.s.timing_ledger.copy(), "acceptance": self.s.acceptance_ledger.copy()}
        key = plan.graph.key
        cost_before = (
            self.s.costs.estimate_ns(key),
            self.s.costs.last_valid_ns(key),
            self.s.costs.samples(key),
        )
        histories = {
            rid: (r.history.log_x, r.history.log_z, r.cancelled) for rid, r in self.s.requests.items()
        }
        if sidecars is not None:
            with pytest.raises(ValueError):  # a device-allocated round completes with its sidecar
                self.s.complete(frame.fence, records, timing)
            assert self.s.frames[0] is frame
            conf = sidecars if len(sidecars) > 1 else sidecars[0]
            gen = (
                self.s.complete_packed_round(frame.fence, records, timing, conf)
                if surv is None
                else self.s.complete_packed_round_with_survival(frame.fence, records, timing, conf, surv)
            )
        else:
            gen = (
                self.s.complete(frame.fence, records, timing)
                if surv is None
                else self.s.complete_with_survival(frame.fence, records, timing, surv)
            )
        event(
            f"complete {plan.graph.kind.value} device={device_allocated(plan.graph)} "
            f"survival={surv is not None} queued={timing.queued} valid={timing.device_ns > 0}"
        )
        for rec in records:
            if rec.offered and STOP in rec.tokens[:-1]:
                event("stop inside accepted prefix")
        for lane in plan.lanes:
            if lane.handle in self.cancelled:
                event("completed lane of a cancelled request")
            if lane.role is LaneRole.TERMINAL:
                event("terminal capture completed")
        self._check_ledgers_after(plan, timing, ledgers)
        self._check_measurements_after(key, timing, cost_before, histories)
        self._check_generated(plan, records, pre, gen)
        self.pending_publication = (frame.fence, [g.handle for g in gen])
        self.last_interval_valid = timing.device_ns > 0
        self._check_invariants()

    def _check_ledgers_after(self, plan, timing, before):
        """Credited time: the max positive device interval if queued, else max(device, wall); an
        ordinary valid completion earns rate x credited up to the cap; an episode pays its credited
        time (its wall time without a device interval) once, into one ledger only."""
        valid = timing.device_ns > 0
        credited = timing.service_interval_ns / NS_PER_MS if valid else timing.wall_ns / NS_PER_MS
        expected_credit = (
            timing.device_ns if timing.queued else max(timing.device_ns, timing.wall_ns)
        ) / NS_PER_MS
        if valid:
            assert credited == pytest.approx(expected_credit)
        earns = plan.reason is ExecutionClass.ORDINARY and valid
        if earns:
            self.earned += credited
        for name, ledger, reason in (
            ("timing", self.s.timing_ledger, ExecutionClass.TIMING_REFRESH),
            ("acceptance", self.s.acceptance_ledger, ExecutionClass.ACCEPTANCE_LEARNING),
        ):
            old = before[name]
            paid = ledger.spent_ms - old.spent_ms
            if plan.reason is reason:
                assert paid == pytest.approx(credited)  # pays its own interval once
                assert ledger.balance_ms == pytest.approx(old.balance_ms - credited)
                assert not ledger.episode_active
                self.paid[name].append(paid)
                continue
            assert paid == 0.0  # never both ledgers for one execution
            if earns and old.balance_ms < CREDIT_CAP_MS:
                assert ledger.balance_ms == pytest.approx(
                    min(CREDIT_CAP_MS, old.balance_ms + ledger.rate * credited)
                )
            else:
                assert ledger.balance_ms == old.balance_ms

    def _check_measurements_after(self, key, timing, cost_before, histories):
        """Missing or zero device intervals change no estimate and no service history; a valid one
        is observed as the maximum positive rank interval (queued or isolated); cancelled requests
        are never charged."""
        costs = self.s.costs
        after = (costs.estimate_ns(key), costs.last_valid_ns(key), costs.samples(key))
        if timing.device_ns <= 0:
            assert after == cost_before
        else:
            assert after[2][-1] == pytest.approx(max(timing.device_intervals_ns))
            assert after[1] == self.s.now_ns
        for rid, (log_x, log_z, cancelled) in histories.items():
            r = self.s.requests.get(rid)
            if r is not None and (cancelled or timing.device_ns <= 0):
                assert (r.history.log_x, r.history.log_z) == (log_x, log_z)

    def _check_generated(self, plan, records, pre, gen):
        """Each completion returns exactly the committed prefix of each live lane."""
        expected = []
        for lane, rec in zip(plan.lanes, records):
            status = pre[lane.handle]
            if status is None:
                continue
            active, finished, before, limit = status
            if not active or (finished and lane.role is not LaneRole.TERMINAL):
                continue
            if lane.role is LaneRole.TERMINAL:
                expected.append((lane.handle, (), True))
                continue
            toks = expected_commit(rec.tokens, before, limit)
            if toks:
                ended = toks[-1] == STOP or before + len(toks) >= limit
                now = self._resident(lane.handle)
                expected.append(
                    (lane.handle, toks, ended and not (now is not None and now.phase is Phase.TERMINAL))
                )
        assert [(g.handle, g.tokens, g.finished) for g in gen] == expected
        for g in gen:
            rid = g.handle.rid
            assert rid not in self.ended
            assert not g.tokens or rid not in self.stopped
            assert g.handle not in self.cancelled
            self.returned[rid].extend(g.tokens)
            if g.tokens and (g.tokens[-1] == STOP or len(self.returned[rid]) >= self.limits[rid]):
                self.stopped.add(rid)
            if g.finished:
                self.ended.add(rid)
                assert g.finish_reason in ("stop", "length", "preempted")

    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.0, 2.0, 9.0]))
    def publish(self, data, delay):
        """Publish some of the last completion's visible bursts (possibly later, possibly twice)."""
        if not self.pending_publication:
            return
        fence, handles = self.pending_publication
        if not handles:
            return
        chosen = data.draw(st.lists(st.sampled_from(handles), max_size=len(handles) + 1), label="published")
        self.now += delay
        self.s.advance_to(int(self.now * NS_PER_MS))
        z = {h: self._resident(h).history.log_z for h in chosen if self._resident(h) is not None}
        self._publish(chosen)
        for h, log_z in z.items():
            r = self._resident(h)
            assert r.last_publication_ns == self.s.now_ns  # output age restarts at publication
            if not self.last_interval_valid:  # no measured interval: no delivery update either
                assert r.history.log_z == log_z
        outsiders = [h for h in self.handles if h not in handles]
        if outsiders:
            before = self._state()
            with pytest.raises(ValueError):
                self.s.published_output(outsiders[-1], fence)
            with pytest.raises(ValueError):
                self.s.published_output(handles[0], fence - 1)
            assert self._state() == before

    @rule(data=st.data(), which=st.integers(0, 6))
    def malformed_completion_changes_nothing(self, data, which):
        if not self.s.in_flight:
            return
        frame = self.s.frames[0]
        plan = frame.plan
        records, sidecars = self._records(data, plan, clean=True)
        r = records[0]
        timing = ExecutionTiming((1e6,), 1e6)
        conf = sidecars[0] if sidecars else None
        calls = {
            0: (frame.fence, records[:-1] if len(records) > 1 else records + records, timing, conf),
            1: (
                frame.fence,
                [CompletionRecord(r.handle, r.epoch + 7, r.prompt_tokens, r.tokens, r.offered, r.accepted)]
                + records[1:],
                timing,
                conf,
            ),
            2: (
                frame.fence,
                [CompletionRecord(r.handle, r.epoch, r.prompt_tokens + 1, r.tokens, r.offered, r.accepted)]
                + records[1:],
                timing,
                conf,
            ),
            3: (
                frame.fence,
                [
                    CompletionRecord(
                        r.handle, r.epoch, r.prompt_tokens, r.tokens + (3,) * 9, r.offered, r.accepted
                    )
                ]
                + records[1:],
                timing,
                conf,
            ),
            4: (frame.fence + 1, records, timing, conf),  # not the oldest frame
            5: (frame.fence, records, ExecutionTiming((-1.0,), math.nan), conf),
            6: (frame.fence, records, timing, None if conf is not None else np.full((2, 1, 1), 0.5)),
        }
        fence, recs, tm, cf = calls[which]
        if which == 6 and conf is None and plan.graph.kind is not GraphKind.SPECULATIVE:
            return  # a sidecar is only malformed where it is checked
        before = self._state()
        with pytest.raises((ValueError, TypeError)):
            if cf is None:
                self.s.complete(fence, recs, tm)
            else:
                self.s.complete_packed_round(fence, recs, tm, cf)
        assert self._state() == before

    # == time ===============================================================================
    @rule(ms=st.one_of(st.floats(0.0, 50.0), st.just(31_000.0)), data=st.data(), then_engine_rounds=ENGINE)
    def wait(self, ms, data, then_engine_rounds):
        """Time passes (31 s makes every measured estimate stale: refresh and empty windows)."""
        self.now += ms
        self.s.advance_to(int(self.now * NS_PER_MS))
        self._engine(data, then_engine_rounds)

    # == invariants ===========================================================================
    def _check_invariants(self):
        """Also inside rules: an engine round's states between its commits and completions."""
        self.resources_are_owned_once_and_never_leak()
        self.frames_keep_their_requests_resident()
        self.checkpoint_rows_are_accounted()
        self.ledgers_stay_within_their_bounds()
        self.output_is_what_completions_returned()
        self.epochs_are_monotone()

    @invariant()
    def resources_are_owned_once_and_never_leak(self):
        s = self.s
        for pool in (s.pages, s.slots):
            owned = pool.owned()
            free = pool._free
            assert len(set(free)) == len(free) and not set(free) & set(owned)
            assert len(free) + len(owned) == pool.size
            assert set(owned.values()) <= set(s.requests)
        pages, slots = s.pages.owned(), s.slots.owned()
        assert sum(len(r.pages) for r in s.requests.values()) == len(pages)
        for rid, r in s.requests.items():
            assert r.rid == rid and slots[r.slot] == rid and all(pages[p] == rid for p in r.pages)
            assert len(r.pages) == s.pages_needed(r.prompt_len, r.max_output)
            assert r.active or r.inflight  # finished or cancelled requests stay only while fenced
        assert len(slots) == len(s.requests)

    @invariant()
    def frames_keep_their_requests_resident(self):
        s = self.s
        fences = [f.fence for f in s.frames]
        assert fences == sorted(set(fences)) and len(fences) <= 2
        if len(fences) == 2:
            assert all(f.plan.graph.kind.may_share_window for f in s.frames)
        inflight = collections.defaultdict(list)
        for f in s.frames:
            for lane in f.plan.lanes:
                r = self._resident(lane.handle)
                assert r is not None and r.slot == lane.slot  # pages pinned through the fence
                inflight[lane.handle.rid].append(f.fence)
        for rid, r in s.requests.items():
            assert r.inflight == inflight.get(rid, [])
        if len(s.frames) == 2:  # only decode rounds of requests without host stops queue twice
            second = {each.handle.rid: each for each in s.frames[1].plan.lanes}
            for lane in s.frames[0].plan.lanes:
                if lane.handle.rid in second:
                    assert lane.role is LaneRole.DECODE and second[lane.handle.rid].role is LaneRole.DECODE
                    assert not s.requests[lane.handle.rid].host_stops

    @invariant()
    def checkpoint_rows_are_accounted(self):
        s = self.s
        store = s.checkpoints
        free = store._free
        assert len(set(free)) == len(free) and not set(free) & set(store.entries)
        assert len(free) + len(store.entries) == store.size
        refs = collections.Counter()
        for r in s.requests.values():
            for row in (r.capture.row, r.capture.restore_row):
                if row is not None:
                    assert row in store.entries
                    refs[row] += 1
        for row, cp in store.entries.items():
            assert cp.row == row
            assert cp.pins == refs[row] + (1 if cp.role is Role.WINDOW else 0), (row, cp, refs[row])
            if cp.role is Role.WINDOW:  # a multi-window request's private row, released with it
                owner = s.requests.get(cp.owner)
                assert owner is not None and owner.image_windows.row == row
            elif not cp.ready:
                armed = any(r.capture.row == row for r in s.requests.values())
                assert armed, f"row {row} armed, never captured"
            key = (row, cp.tokens, cp.owner)
            if key not in self.seen_checkpoints:  # a new capture: its owner holds those tokens
                self.seen_checkpoints.add(key)
                owner = s.requests.get(cp.owner)
                if owner is not None and cp.role is not Role.WINDOW:
                    assert len(cp.tokens) <= owner.cursor, (cp, owner.consumed, len(owner.output))
                    assert cp.tokens == (owner.prompt + tuple(owner.output))[: len(cp.tokens)]
        for row, owner in store.guards.items():
            assert row in free and owner in s.requests and s.requests[owner].active

    @invariant()
    def ledgers_stay_within_their_bounds(self):
        s = self.s
        assert s.timing_ledger.earned_from_ms == pytest.approx(self.earned)
        assert s.acceptance_ledger.earned_from_ms == pytest.approx(self.earned)
        for name, ledger in (("timing", s.timing_ledger), ("acceptance", s.acceptance_ledger)):
            assert ledger.balance_ms <= CREDIT_CAP_MS + EPS
            assert ledger.spent_ms == pytest.approx(sum(self.paid[name]))
            largest = max(self.paid[name], default=0.0)
            assert ledger.spent_ms <= ledger.rate * ledger.earned_from_ms + largest + EPS

    @invariant()
    def output_is_what_completions_returned(self):
        for rid, r in self.s.requests.items():
            assert r.output == self.returned[rid]
            assert len(r.output) <= r.max_output
            assert 0 <= r.cached <= r.consumed <= r.prompt_len
            if r.phase in (Phase.DECODE, Phase.TERMINAL):
                assert r.consumed == r.prompt_len
            assert r.output.count(STOP) <= 1 and (STOP not in r.output or r.output[-1] == STOP)

    @invariant()
    def epochs_are_monotone(self):
        for rid, r in self.s.requests.items():
            assert r.epoch >= self.epochs.get(rid, 0)
            self.epochs[rid] = r.epoch

    @invariant()
    def speculative_counters_agree(self):
        s = self.s
        assert sum(s.offered_by_position.values()) == s.speculative["drafts_offered"]
        assert sum(s.accepted_by_position.values()) == s.speculative["drafts_accepted"]

    @invariant()
    def prices_are_finite(self):
        for v in self.s.views():
            assert math.isfinite(v.log_prefill_price) and math.isfinite(v.log_output_price)
            assert v.log_delivery_price < math.inf

    # == drain ==================================================================================
    def teardown(self):
        """Complete every frame, cancel everything: nothing may stay owned or armed."""
        if not hasattr(self, "s"):
            return
        s = self.s
        while s.frames:
            frame = s.frames[0]
            records, sidecars = self._records(None, frame.plan, clean=True)
            self.now += 1.0
            s.advance_to(int(self.now * NS_PER_MS))
            timing = ExecutionTiming((NS_PER_MS,), NS_PER_MS, queued=self.queued.pop(frame.fence))
            if sidecars is not None:
                s.complete_packed_round(frame.fence, records, timing, sidecars[0])
            else:
                s.complete(frame.fence, records, timing)
        for h in self.handles:
            if self._resident(h) is not None:
                s.cancel(h)
        assert not s.requests and not s.frames
        assert s.pages.available == s.pages.size and s.slots.available == s.slots.size
        store = s.checkpoints
        assert not store.guards
        for row, cp in store.entries.items():
            assert cp.ready and cp.pins == 0 and cp.role is not Role.WINDOW, (row, cp)
        assert store.free_rows + len(store.entries) == store.size


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Rules the machine checks after every step (a one-line change of their implementing code fails it).
TestScheduler = pytest.mark.spec(
    # ownership: pages, slots and checkpoint rows through fences, cancellation and errors
    "planning-queue/pages-pinned",
    "planning-queue/cancel-keeps-pages",
    "planning-queue/cancel-stops",
    "prerequisites/fenced-ownership",
    "planning-queue/armed-retained",
    "service-accounting/cancelled-slot-reuse",
    # the window and the commit contract
    "planning-queue/two-slots",
    "planning-queue/double-occupancy",
    "planning-queue/feedback-triggers",
    "planning-queue/plan-readonly",
    "planning-queue/commit-checks",
    "planning-queue/packed-round",
    # completion and publication
    "service-accounting/validate-first",
    "service-accounting/one-interval",
    "service-accounting/publish-before-complete",
    "duration-estimates/missing-zero-ignored",
    "duration-estimates/raw-max-rank",
    # exploration ledgers
    "timing-refresh/credit-cap",
    "acceptance-learning/credit-cap",
    "timing-refresh/invalid-wall-pays",
    "acceptance-learning/ledgers-disjoint",
    "timing-refresh/aggregate-bound",
    "acceptance-learning/aggregate-bound",
    "verification/lifecycle-no-outrank",
)(pytest.mark.exhaustive(TestScheduler))
