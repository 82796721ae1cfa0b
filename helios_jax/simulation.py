"""A scheduling simulator: the real Scheduler driven by a fake executor on a virtual clock.

Durations come from a catalog's measured ``duration_ms`` (optionally with multiplicative noise);
acceptance comes from a model: a fixed number of accepted drafts per round, or per-position
acceptance probabilities. The executor honours the two-slot window exactly as an engine does:
a queued frame starts at its predecessor's completion and reports only its device interval;
an isolated frame also reports its wall interval. Every visible burst is published at its
completion time, before the next completion is processed.

Measurements (RESOLUTIONS.md, 16) are defined in ``helios_jax.simulation_stats``: first output,
largest gap, progress spread over whole rotation cycles, and the exploration budgets.

``scripts/scheduling_sim/run.py`` is the command-line entry; the conformance command and the
tests call :func:`run` directly.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from helios_jax.catalog import Allocation, Catalog, DecodeMode, GraphKind
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming, ScheduledPlan
from helios_jax.scheduler.rounds import allocate_prefix_rows
from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate
from helios_jax.scheduler.view import LaneRole
from helios_jax.simulation_stats import (
    RequestStats,
    SimResult,
    SpreadWindow,
    acceptance_bound_holds,
    refresh_bound_holds,
)

EOS = 0  # the simulated stop token (never produced unless asked)
TOKEN = 7  # every other simulated output token


@dataclasses.dataclass(frozen=True)
class SimConfig:
    catalog: Catalog
    scenario: str = "startup"  # "startup" (all at t=0), "poisson" or "trace" (arrivals_ms)
    requests: int = 5
    prompt_tokens: int | Sequence[int] = 64
    output_tokens: int | Sequence[int] = 100_000
    accepted_drafts: int | None = 3  # accepted proposals per round (None: use acceptance_probs)
    acceptance_probs: tuple[float, ...] | None = None  # per-position conditional acceptance
    acceptance_history: str = "untrained"  # or "preseeded"
    rounds: int = 100  # generation rounds the spread window spans at least (whole cycles)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    mode: DecodeMode | None = None
    costs: str = "measured"  # or "cold": estimates start indeterminate and discovery runs
    noise: float = 0.0  # log-uniform multiplicative noise on durations
    arrival_rate_per_s: float = 10.0  # poisson scenario
    arrivals_ms: Sequence[float] | None = None  # trace scenario: each request's arrival, ascending
    horizon_ms: float = 60_000.0  # stop after this much virtual time
    seed: int = 0
    fixed_width: int | None = None
    host_overhead_ms: float = 0.0  # wall time an isolated frame adds to its device interval
    # Serving's scheduler: checkpoint retention (an anchor at each prompt end; prompts made
    # distinct so that every request captures its own) and an initialize before each request.
    serving: bool = False


class FakeExecutor:
    """Produces completion records and timing for a plan, derivable on paper."""

    def __init__(self, config: SimConfig, scheduler: Scheduler, rng: np.random.Generator):
        self.config = config
        self.scheduler = scheduler
        self.rng = rng
        self.durations = {g.key: g.duration_ms for g in config.catalog.graphs}

    def duration_ms(self, plan: ScheduledPlan) -> float:
        base = self.durations[plan.graph.key]
        if self.config.noise:
            base *= math.exp(self.rng.uniform(-self.config.noise, self.config.noise))
        return base

    def survival(self, depth: int) -> np.ndarray:
        """The true joint prefix survival of the acceptance model (what confidence reports)."""
        return _true_survival(self.config, depth)

    def accepted(self, offered: int) -> int:
        if self.config.accepted_drafts is not None:
            return min(offered, self.config.accepted_drafts)
        probs = list(self.config.acceptance_probs or ())
        for d in range(offered):
            p = probs[d] if d < len(probs) else (probs[-1] if probs else 0.0)
            if self.rng.random() >= p:
                return d
        return offered

    def run(self, plan: ScheduledPlan):
        """Records, the optional confidence sidecar, for one plan."""
        graph = plan.graph
        slots = self.config.catalog.request_slots
        depth = max(graph.proposal_depth, 1)
        sidecar = None
        rows = {}
        device = graph.kind is GraphKind.SPECULATIVE and graph.allocation is Allocation.PREFIX_LIMIT
        decode_lanes = [each for each in plan.lanes if each.role is LaneRole.DECODE]
        if device and graph.proposal_depth > 0:
            joint = self.survival(graph.proposal_depth)
            sidecar = np.zeros((2, slots, graph.proposal_depth), dtype=np.float32)
            order = sorted(decode_lanes, key=lambda each: each.slot)
            alloc = allocate_prefix_rows(
                np.tile(joint, (len(order), 1)),
                [each.ceiling for each in order],
                [True] * len(order),
                graph.target_capacity,
            )
            for lane, r in zip(order, alloc):
                rows[lane.handle] = int(r)
                sidecar[1, lane.slot] = joint
                sidecar[0, lane.slot, 0] = joint[0]
                sidecar[0, lane.slot, 1:] = np.divide(
                    joint[1:], joint[:-1], out=np.zeros(len(joint) - 1), where=joint[:-1] > 0
                )
        records = []
        for lane in plan.lanes:
            if lane.role is LaneRole.PROMPT:
                records.append(
                    CompletionRecord(
                        lane.handle,
                        lane.epoch,
                        prompt_tokens=lane.prompt_tokens,
                        tokens=(TOKEN,) if lane.finishes_prompt else (),
                    )
                )
            elif lane.role is LaneRole.DECODE and graph.steps > 1:  # K-step: one token a step
                records.append(CompletionRecord(lane.handle, lane.epoch, tokens=(TOKEN,) * lane.ceiling))
            elif lane.role is LaneRole.DECODE:
                r = rows.get(lane.handle, lane.query_length)
                offered = r - 1
                accepted = self.accepted(offered)
                records.append(
                    CompletionRecord(
                        lane.handle,
                        lane.epoch,
                        tokens=(TOKEN,) * (accepted + 1),
                        offered=offered,
                        accepted=accepted,
                    )
                )
            else:
                records.append(CompletionRecord(lane.handle, lane.epoch))
        del depth
        return records, sidecar


def _lengths(value, n: int, rng: np.random.Generator) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    value = list(value)
    return [int(value[i % len(value)]) for i in range(n)]


def _true_survival(config: SimConfig, depth: int) -> np.ndarray:
    """The acceptance model's joint prefix survival per draft depth."""
    if config.accepted_drafts is not None:
        return np.array([1.0 if d < config.accepted_drafts else 0.0 for d in range(depth)])
    probs = list(config.acceptance_probs or (0.0,))
    probs = (probs + [probs[-1]] * depth)[:depth]
    return np.cumprod(probs)


PRESEEDED_WEIGHT = 64.0  # a heavy history: many rounds' worth of evidence


def preseeded_history(config: SimConfig, depth: int) -> dict:
    """An acceptance history already matching the acceptance model (heavy weight)."""
    return {
        SOURCE_LEARNED: PrefixEstimate(_true_survival(config, depth), np.full(depth, PRESEEDED_WEIGHT), 0)
    }


def preseeded_forecast(config: SimConfig, depth: int) -> PrefixEstimate:
    """A confidence forecast already matching what the simulated confidence reports (the same
    joint survival, see :meth:`FakeExecutor.survival`), with the same heavy weight."""
    return PrefixEstimate(_true_survival(config, depth), np.full(depth, PRESEEDED_WEIGHT), 0)


GENERATION = (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED)  # rounds the spread counts


def run(config: SimConfig, scheduler_factory: Callable[..., Scheduler] = Scheduler) -> SimResult:
    """Simulate until every request finished, the spread window closed (startup), or the horizon
    passed.

    `scheduler_factory` takes `Scheduler`'s arguments; a subclass with another selection rule
    (the baselines of scripts/scheduling_sim) runs on the same loop, executor and statistics.
    """
    rng = np.random.default_rng(config.seed)
    sched = _start_scheduler(config, scheduler_factory)
    executor = FakeExecutor(config, sched, rng)
    simulation = _Simulation(config, sched, executor, _workload(config, sched.depth, rng))
    simulation.run()
    return simulation.result()


def _start_scheduler(config: SimConfig, scheduler_factory: Callable[..., Scheduler]) -> Scheduler:
    """The scheduler in the configured decode mode, its costs seeded from the catalog's
    measurements ("measured") or left indeterminate ("cold")."""
    mode = config.mode or (DecodeMode.ORDINARY if config.catalog.mode == "ordinary" else DecodeMode.ADAPTIVE)
    serving = dict(checkpoints=True, initialize_requests=True) if config.serving else {}
    sched = scheduler_factory(
        config.catalog,
        mode=mode,
        policy_config=config.policy,
        fixed_width=config.fixed_width,
        max_model_len=1 << 19,
        **serving,
    )
    if config.costs == "measured":
        sched.seed_costs(0)
    elif config.costs != "cold":
        raise ValueError(f"costs must be measured or cold, got {config.costs!r}")
    return sched


@dataclasses.dataclass(frozen=True)
class _Workload:
    """The requests of one run: lengths, arrival times and their starting acceptance evidence."""

    prompts: list[int]
    outputs: list[int]
    arrivals: list[float]
    history: dict | None  # acceptance history given at admission (None: untrained)
    forecast: PrefixEstimate | None  # confidence forecast given at admission (None: untrained)


def _workload(config: SimConfig, depth: int, rng: np.random.Generator) -> _Workload:
    n = config.requests
    prompts = _lengths(config.prompt_tokens, n, rng)
    outputs = _lengths(config.output_tokens, n, rng)
    if config.scenario == "startup":
        arrivals = [0.0] * n
    elif config.scenario == "poisson":
        gaps = rng.exponential(1000.0 / config.arrival_rate_per_s, size=n)
        arrivals = list(np.cumsum(gaps) - gaps[0])
    elif config.scenario == "trace":
        arrivals = [float(a) for a in config.arrivals_ms or ()]
        if len(arrivals) != n or any(b < a for a, b in zip(arrivals, arrivals[1:])):
            raise ValueError(f"the trace scenario needs {n} ascending arrivals_ms, got {len(arrivals)}")
    else:
        raise ValueError(f"unknown scenario {config.scenario!r}")
    if config.acceptance_history == "preseeded":
        return _Workload(
            prompts, outputs, arrivals, preseeded_history(config, depth), preseeded_forecast(config, depth)
        )
    if config.acceptance_history == "untrained":
        return _Workload(prompts, outputs, arrivals, history=None, forecast=None)
    raise ValueError(f"acceptance_history must be untrained or preseeded, got {config.acceptance_history!r}")


@dataclasses.dataclass(frozen=True)
class _Frame:
    """A committed plan in the two-slot window, with its simulated device interval."""

    end_ms: float
    fence: int
    plan: ScheduledPlan
    device_ms: float
    queued: bool  # started at its predecessor's completion (reports only its device interval)


class _Simulation:
    """One run's loop on the virtual clock: admit arrivals, fill the two-slot window with
    committed plans, complete the earliest frame, publish its output, and account for it."""

    def __init__(self, config: SimConfig, sched: Scheduler, executor: FakeExecutor, work: _Workload):
        self.config, self.sched, self.executor, self.work = config, sched, executor, work
        self.stats = [RequestStats(a, p) for a, p in zip(work.arrivals, work.prompts)]
        self.waiting = collections.deque(range(config.requests))
        self.by_rid: dict[int, int] = {}  # scheduler request id -> request index
        self.frames: list[_Frame] = []
        self.fence = 0
        self.now = 0.0
        self.all_started = False
        self.window = SpreadWindow(config.rounds)
        self.first_refresh_after: float | None = None
        self.paid: dict[str, float] = collections.defaultdict(float)  # credited interval per class
        self.episodes: dict[str, list[float]] = {"timing_refresh": [], "acceptance_learning": []}

    def run(self) -> None:
        while self.now <= self.config.horizon_ms:
            self._admit_ready()
            self.sched.advance_to(int(self.now * NS_PER_MS))
            self._fill_window()
            if not self.frames:
                if self.waiting:
                    self.now = max(self.now, self.work.arrivals[self.waiting[0]])
                    continue
                break
            plan, served = self._complete_next()
            if not self.all_started:
                self.all_started = all(s.first_output_ms is not None for s in self.stats)
            elif plan.graph.kind in GENERATION and self.window.result is None:
                if self.window.observe(self.now, served, self.stats) and self.config.scenario == "startup":
                    break
            if not self.waiting and all(s.finished_ms is not None for s in self.stats):
                break
        for s in self.stats:
            s.end_ms = self.now

    def _admit_ready(self) -> None:
        """Admits arrived requests in arrival order while the scheduler has room."""
        work = self.work
        while self.waiting and work.arrivals[self.waiting[0]] <= self.now + 1e-9:
            i = self.waiting[0]
            if not self.sched.can_admit(work.prompts[i], work.outputs[i]):
                return
            self.waiting.popleft()
            distinct = [TOKEN + 1 + i] if self.config.serving else []  # its own checkpoint
            h = self.sched.admit(
                distinct + [TOKEN] * (work.prompts[i] - len(distinct)),
                max_output=work.outputs[i],
                stop_token_ids=(EOS,),
                acceptance_history=work.history,
                forecast_history=work.forecast,
            )
            self.by_rid[h.rid] = i

    def _fill_window(self) -> None:
        """Plans and commits frames until the window holds two or the scheduler has nothing
        (or wants an empty window); a queued frame starts at its predecessor's end."""
        while True:
            plan = self.sched.plan()
            if plan is None or (plan.needs_empty_window and self.frames):
                return
            self.fence += 1
            self.sched.commit(plan, self.fence)
            device = self.executor.duration_ms(plan)
            start = max(self.now, self.frames[-1].end_ms) if self.frames else self.now
            self.frames.append(_Frame(start + device, self.fence, plan, device, queued=bool(self.frames)))
            if plan.reason.value == "timing_refresh" and self.first_refresh_after is None:
                self.first_refresh_after = self.sched.timing_ledger.earned_from_ms
            if len(self.frames) >= 2:
                return

    def _complete_next(self) -> tuple[ScheduledPlan, set[int]]:
        """Completes the earliest frame at its end time. Returns its plan and the requests served."""
        frame = self.frames.pop(0)
        self.now = frame.end_ms
        self.sched.advance_to(int(self.now * NS_PER_MS))
        records, sidecar = self.executor.run(frame.plan)
        wall = frame.device_ms + (0.0 if frame.queued else self.config.host_overhead_ms)
        timing = ExecutionTiming((frame.device_ms * NS_PER_MS,), wall * NS_PER_MS, queued=frame.queued)
        if sidecar is not None:
            generated = self.sched.complete_packed_round(frame.fence, records, timing, sidecar)
        else:
            generated = self.sched.complete(frame.fence, records, timing)
        # The credited interval (RESOLUTIONS.md, 1): the device interval for a queued frame, the
        # larger of it and the wall interval for an isolated one; each exploration completion is
        # one episode, and it pays this interval.
        credited = max(frame.device_ms, wall)
        reason = frame.plan.reason.value
        self.paid[reason] += credited
        if reason in self.episodes:
            self.episodes[reason].append(credited)
        return frame.plan, self._publish(generated, frame.fence)

    def _publish(self, generated, fence: int) -> set[int]:
        """Records each visible burst at the current time; returns the requests served."""
        served = set()
        for g in generated:
            i = self.by_rid[g.handle.rid]
            s = self.stats[i]
            if s.first_output_ms is None:
                s.first_output_ms = self.now - s.arrival_ms
            s.publications.append(self.now)
            s.output_tokens += len(g.tokens)
            served.add(i)
            if g.finished:
                s.finished_ms = self.now
            self.sched.published_output(g.handle, fence)
        return served

    def result(self) -> SimResult:
        sched, window, episodes = self.sched, self.window, self.episodes
        ordinary_ms = self.paid["ordinary"]
        refresh_ms = self.paid["timing_refresh"]
        probe_ms = self.paid["acceptance_learning"]
        refresh_episode = max(episodes["timing_refresh"], default=0.0)
        probe_episode = max(episodes["acceptance_learning"], default=0.0)
        return SimResult(
            requests=self.stats,
            progress_spread_tokens=None if window.result is None else window.result["spread_tokens"],
            executions=dict(sched.executions),
            execution_ms={k: v / NS_PER_MS for k, v in sched.execution_ns.items()},
            selections=dict(sched.selections),
            virtual_ms=self.now,
            refresh_bound_ok=refresh_bound_holds(refresh_ms, ordinary_ms, refresh_episode),
            acceptance_bound_ok=acceptance_bound_holds(probe_ms, ordinary_ms, probe_episode),
            timing_refresh_ms=refresh_ms,
            acceptance_learning_ms=probe_ms,
            ordinary_ms=ordinary_ms,
            first_refresh_after_ms=self.first_refresh_after,
            speculative=dict(sched.speculative),
            spread_window=window.result,
            refresh_episodes_ms=episodes["timing_refresh"],
            probe_episodes_ms=episodes["acceptance_learning"],
        )
