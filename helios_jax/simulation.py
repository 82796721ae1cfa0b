"""A scheduling simulator: the real Scheduler driven by a fake executor on a virtual clock.

Durations come from a catalog's measured ``duration_ms`` (optionally with multiplicative noise);
acceptance comes from a model: a fixed number of accepted drafts per round, or per-position
acceptance probabilities. The executor honours the two-slot window exactly as an engine does:
a queued frame starts at its predecessor's completion and reports only its device interval;
an isolated frame also reports its wall interval. Every visible burst is published at its
completion time, before the next completion is processed.

Measurements (RESOLUTIONS.md, 16):

- **first output**: time from a request's arrival to its first visible output.
- **largest gap**: the longest wait between a stream's consecutive visible outputs, including the
  wait still open when the run ends (from its last output to the end of the run; for an arrived
  stream with no output yet, its whole first-output wait).
- **progress spread**: max - min output tokens gained by the streams over whole rotation cycles
  from a symmetric start. A *cycle* is the shortest run of consecutive generation rounds (decode,
  speculative or mixed completions) in which every live stream is served, i.e. publishes output,
  at least once; a cycle that has not closed after ``rounds`` generation rounds is cut there (a
  stream went unserved that long, which the spread then shows). Cycles are laid back to back from
  the completion at which every stream has its first output; the window starts at the end of the
  first cycle (every stream served once since: a symmetric start) and ends at the first cycle
  boundary after at least ``rounds`` generation rounds. A fixed count of rounds would instead cut
  a rotation in the middle whenever a program is narrower than the stream count, so the phase of
  the rotation would show up as spread.
- **exploration budgets**: each timing-refresh and acceptance-learning episode's paid interval
  (the credited interval of its execution, as the simulated engine reported it), so the bounds
  ``refresh <= 0.002/0.998 * ordinary + one episode`` and ``probes <= 0.01/0.99 * ordinary + one
  episode`` are checked against the largest single episode, from the simulator's own record.

``scripts/scheduling_sim/run.py`` is the command-line entry; the conformance command and the
tests call :func:`run` directly.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from helios_jax.catalog import Allocation, Catalog, DecodeMode, GraphKind
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming, ScheduledPlan
from helios_jax.scheduler.rounds import allocate_prefix_rows
from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate
from helios_jax.scheduler.view import LaneRole

EOS = 0  # the simulated stop token (never produced unless asked)
TOKEN = 7  # every other simulated output token


@dataclasses.dataclass(frozen=True)
class SimConfig:
    catalog: Catalog
    scenario: str = "startup"  # "startup" (all at t=0) or "poisson"
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
    horizon_ms: float = 60_000.0  # stop after this much virtual time
    seed: int = 0
    fixed_width: int | None = None
    host_overhead_ms: float = 0.0  # wall time an isolated frame adds to its device interval


@dataclasses.dataclass
class RequestStats:
    arrival_ms: float
    prompt_tokens: int
    first_output_ms: float | None = None
    publications: list = dataclasses.field(default_factory=list)
    output_tokens: int = 0
    finished_ms: float | None = None
    end_ms: float | None = None  # when the run stopped (set by run())

    @property
    def open_wait_ms(self) -> float:
        """The wait still open when the run ended: since the last output, or since arrival for a
        stream with no output yet (0 once finished, or before arrival)."""
        if self.end_ms is None or self.finished_ms is not None:
            return 0.0
        since = self.publications[-1] if self.publications else self.arrival_ms
        return max(0.0, self.end_ms - since)

    @property
    def max_gap_ms(self) -> float:
        times = self.publications
        return max([b - a for a, b in zip(times, times[1:])] + [self.open_wait_ms, 0.0])


@dataclasses.dataclass
class SimResult:
    requests: list[RequestStats]
    progress_spread_tokens: int | None
    executions: dict
    execution_ms: dict
    selections: dict
    virtual_ms: float
    refresh_bound_ok: bool
    acceptance_bound_ok: bool
    timing_refresh_ms: float
    acceptance_learning_ms: float
    ordinary_ms: float
    first_refresh_after_ms: float | None
    speculative: dict
    spread_window: dict | None = None  # start_ms, end_ms, rounds, cycles, cut_cycles
    refresh_episodes_ms: list = dataclasses.field(default_factory=list)  # each episode's paid interval
    probe_episodes_ms: list = dataclasses.field(default_factory=list)

    @property
    def largest_refresh_episode_ms(self) -> float:
        return max(self.refresh_episodes_ms, default=0.0)

    @property
    def largest_probe_episode_ms(self) -> float:
        return max(self.probe_episodes_ms, default=0.0)

    def to_json(self) -> dict:
        return {
            "requests": [{"first_output_ms": r.first_output_ms, "max_gap_ms": r.max_gap_ms,
                          "open_wait_ms": r.open_wait_ms,
                          "output_tokens": r.output_tokens, "prompt_tokens": r.prompt_tokens,
                          "arrival_ms": r.arrival_ms, "finished_ms": r.finished_ms} for r in self.requests],
            "progress_spread_tokens": self.progress_spread_tokens,
            "spread_window": self.spread_window,
            "executions": self.executions,
            "execution_ms": self.execution_ms,
            "execution_ns": {k: int(v * 1e6) for k, v in self.execution_ms.items()},
            "selections": self.selections,
            "virtual_ms": self.virtual_ms,
            "bounds": {"timing_refresh_ms": self.timing_refresh_ms,
                       "acceptance_learning_ms": self.acceptance_learning_ms,
                       "ordinary_ms": self.ordinary_ms, "refresh_bound_ok": self.refresh_bound_ok,
                       "acceptance_bound_ok": self.acceptance_bound_ok,
                       "largest_refresh_episode_ms": self.largest_refresh_episode_ms,
                       "largest_probe_episode_ms": self.largest_probe_episode_ms,
                       "refresh_episodes": len(self.refresh_episodes_ms),
                       "probe_episodes": len(self.probe_episodes_ms),
                       "first_refresh_after_ms": self.first_refresh_after_ms},
            "speculative": self.speculative,
        }


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
        decode_lanes = [l for l in plan.lanes if l.role is LaneRole.DECODE]
        if device and graph.proposal_depth > 0:
            joint = self.survival(graph.proposal_depth)
            sidecar = np.zeros((2, slots, graph.proposal_depth), dtype=np.float32)
            order = sorted(decode_lanes, key=lambda l: l.slot)
            alloc = allocate_prefix_rows(np.tile(joint, (len(order), 1)), [l.ceiling for l in order],
                                         [True] * len(order), graph.target_capacity)
            for lane, r in zip(order, alloc):
                rows[lane.handle] = int(r)
                sidecar[1, lane.slot] = joint
                sidecar[0, lane.slot, 0] = joint[0]
                sidecar[0, lane.slot, 1:] = np.divide(joint[1:], joint[:-1], out=np.zeros(len(joint) - 1),
                                                      where=joint[:-1] > 0)
        records = []
        for lane in plan.lanes:
            if lane.role is LaneRole.PROMPT:
                records.append(CompletionRecord(lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens,
                                                tokens=(TOKEN,) if lane.finishes_prompt else ()))
            elif lane.role is LaneRole.DECODE:
                r = rows.get(lane.handle, lane.query_length)
                offered = r - 1
                accepted = self.accepted(offered)
                records.append(CompletionRecord(lane.handle, lane.epoch, tokens=(TOKEN,) * (accepted + 1),
                                                offered=offered, accepted=accepted))
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
    return {SOURCE_LEARNED: PrefixEstimate(_true_survival(config, depth), np.full(depth, PRESEEDED_WEIGHT), 0)}


def preseeded_forecast(config: SimConfig, depth: int) -> PrefixEstimate:
    """A confidence forecast already matching what the simulated confidence reports (the same
    joint survival, see :meth:`FakeExecutor.survival`), with the same heavy weight."""
    return PrefixEstimate(_true_survival(config, depth), np.full(depth, PRESEEDED_WEIGHT), 0)


class _SpreadWindow:
    """Progress spread over whole rotation cycles from a symmetric start (module docstring)."""

    def __init__(self, rounds: int):
        self.rounds = max(1, rounds)
        self.baseline: list[int] | None = None  # tokens at the window's start
        self.start_ms: float | None = None
        self.cycle_served: set[int] = set()
        self.cycle_rounds = 0
        self.window_rounds = 0
        self.cycles = 0
        self.cut_cycles = 0
        self.result: dict | None = None

    def observe(self, now: float, served: set[int], stats: list[RequestStats]) -> bool:
        """One generation round after every stream's first output; True once the window closed."""
        self.cycle_rounds += 1
        self.cycle_served |= served
        live = {i for i, s in enumerate(stats) if s.finished_ms is None}
        closed = live <= self.cycle_served
        cut = not closed and self.cycle_rounds >= self.rounds
        if self.baseline is not None:
            self.window_rounds += 1
        if not (closed or cut):
            return False
        self.cycle_served, self.cycle_rounds = set(), 0
        if self.baseline is None:  # the end of the first cycle: the symmetric start
            self.baseline = [s.output_tokens for s in stats]
            self.start_ms = now
            return False
        self.cycles += 1
        self.cut_cycles += cut
        if self.window_rounds < self.rounds:
            return False
        gained = [s.output_tokens - b for s, b in zip(stats, self.baseline)]
        self.result = {"spread_tokens": max(gained) - min(gained), "start_ms": self.start_ms, "end_ms": now,
                       "rounds": self.window_rounds, "cycles": self.cycles, "cut_cycles": self.cut_cycles,
                       "min_gained": min(gained), "max_gained": max(gained)}
        return True


def run(config: SimConfig, scheduler_factory: Callable[..., Scheduler] = Scheduler) -> SimResult:
    """Simulate until every request finished, the spread window closed (startup), or the horizon
    passed.

    `scheduler_factory` takes `Scheduler`'s arguments; a subclass with another selection rule
    (the baselines of scripts/scheduling_sim) runs on the same loop, executor and statistics.
    """
    rng = np.random.default_rng(config.seed)
    mode = config.mode or (DecodeMode.ORDINARY if config.catalog.mode == "ordinary" else DecodeMode.ADAPTIVE)
    sched = scheduler_factory(config.catalog, mode=mode, policy_config=config.policy, fixed_width=config.fixed_width,
                      max_model_len=1 << 19)
    if config.costs == "measured":
        sched.seed_costs(0)
    elif config.costs != "cold":
        raise ValueError(f"costs must be measured or cold, got {config.costs!r}")
    executor = FakeExecutor(config, sched, rng)
    n = config.requests
    prompts = _lengths(config.prompt_tokens, n, rng)
    outputs = _lengths(config.output_tokens, n, rng)
    if config.scenario == "startup":
        arrivals = [0.0] * n
    elif config.scenario == "poisson":
        gaps = rng.exponential(1000.0 / config.arrival_rate_per_s, size=n)
        arrivals = list(np.cumsum(gaps) - gaps[0])
    else:
        raise ValueError(f"unknown scenario {config.scenario!r}")
    if config.acceptance_history == "preseeded":
        history = preseeded_history(config, sched.depth)
        forecast = preseeded_forecast(config, sched.depth)
    elif config.acceptance_history == "untrained":
        history = forecast = None
    else:
        raise ValueError(f"acceptance_history must be untrained or preseeded, got {config.acceptance_history!r}")
    stats = [RequestStats(a, p) for a, p in zip(arrivals, prompts)]
    waiting = collections.deque(range(n))
    handles = {}
    by_rid = {}
    frames = []  # (end_ms, fence, plan, device_ms, queued)
    fence = 0
    now = 0.0
    all_started = False
    window = _SpreadWindow(config.rounds)
    first_refresh_after = None
    generation = {GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED}
    paid = collections.defaultdict(float)  # credited interval per execution class, as reported
    episodes = {"timing_refresh": [], "acceptance_learning": []}

    def admit_ready():
        while waiting and arrivals[waiting[0]] <= now + 1e-9:
            i = waiting[0]
            if not sched.can_admit(prompts[i], outputs[i]):
                return
            waiting.popleft()
            extra = {} if forecast is None else {"forecast_history": forecast}
            h = sched.admit([TOKEN] * prompts[i], max_output=outputs[i], stop_token_ids=(EOS,),
                            acceptance_history=history, **extra)
            handles[i] = h
            by_rid[h.rid] = i

    while now <= config.horizon_ms:
        admit_ready()
        sched.advance_to(int(now * NS_PER_MS))
        while True:
            plan = sched.plan()
            if plan is None or (plan.needs_empty_window and frames):
                break
            fence += 1
            sched.commit(plan, fence)
            device = executor.duration_ms(plan)
            start = max(now, frames[-1][0]) if frames else now
            queued = bool(frames)
            frames.append((start + device, fence, plan, device, queued))
            if plan.reason.value == "timing_refresh" and first_refresh_after is None:
                first_refresh_after = sched.timing_ledger.earned_from_ms
            if len(frames) >= 2:
                break
        if not frames:
            if waiting:
                now = max(now, arrivals[waiting[0]])
                continue
            break
        end, f, plan, device, queued = frames.pop(0)
        now = end
        sched.advance_to(int(now * NS_PER_MS))
        records, sidecar = executor.run(plan)
        wall = device + (0.0 if queued else config.host_overhead_ms)
        timing = ExecutionTiming((device * NS_PER_MS,), wall * NS_PER_MS, queued=queued)
        if sidecar is not None:
            generated = sched.complete_packed_round(f, records, timing, sidecar)
        else:
            generated = sched.complete(f, records, timing)
        # The credited interval (RESOLUTIONS.md, 1): the device interval for a queued frame, the
        # larger of it and the wall interval for an isolated one; each exploration completion is
        # one episode, and it pays this interval.
        credited = max(device, wall)
        paid[plan.reason.value] += credited
        if plan.reason.value in episodes:
            episodes[plan.reason.value].append(credited)
        served = set()
        for g in generated:
            i = by_rid[g.handle.rid]
            s = stats[i]
            if s.first_output_ms is None:
                s.first_output_ms = now - s.arrival_ms
            s.publications.append(now)
            s.output_tokens += len(g.tokens)
            served.add(i)
            if g.finished:
                s.finished_ms = now
            sched.published_output(g.handle, f)
        if not all_started:
            all_started = all(s.first_output_ms is not None for s in stats)
        elif plan.graph.kind in generation and window.result is None:
            if window.observe(now, served, stats) and config.scenario == "startup":
                break
        if not waiting and all(s.finished_ms is not None for s in stats):
            break
    for s in stats:
        s.end_ms = now
    ordinary_ms = paid["ordinary"]
    refresh_ms = paid["timing_refresh"]
    probe_ms = paid["acceptance_learning"]
    refresh_episode = max(episodes["timing_refresh"], default=0.0)
    probe_episode = max(episodes["acceptance_learning"], default=0.0)
    return SimResult(
        requests=stats,
        progress_spread_tokens=None if window.result is None else window.result["spread_tokens"],
        executions=dict(sched.executions),
        execution_ms={k: v / NS_PER_MS for k, v in sched.execution_ns.items()},
        selections=dict(sched.selections),
        virtual_ms=now,
        refresh_bound_ok=refresh_bound_holds(refresh_ms, ordinary_ms, refresh_episode),
        acceptance_bound_ok=acceptance_bound_holds(probe_ms, ordinary_ms, probe_episode),
        timing_refresh_ms=refresh_ms,
        acceptance_learning_ms=probe_ms,
        ordinary_ms=ordinary_ms,
        first_refresh_after_ms=first_refresh_after,
        speculative=dict(sched.speculative),
        spread_window=window.result,
        refresh_episodes_ms=episodes["timing_refresh"],
        probe_episodes_ms=episodes["acceptance_learning"],
    )


def refresh_bound_holds(refresh_ms: float, ordinary_ms: float, largest_episode_ms: float) -> bool:
    """timing-refresh/aggregate-bound: refresh <= 0.002/0.998 * ordinary + one (the largest) episode."""
    return refresh_ms <= 0.002 / 0.998 * ordinary_ms + largest_episode_ms + 1e-9


def acceptance_bound_holds(probe_ms: float, ordinary_ms: float, largest_episode_ms: float) -> bool:
    """acceptance-learning/aggregate-bound: probes <= 0.01/0.99 * ordinary + one (the largest) episode."""
    return probe_ms <= 0.01 / 0.99 * ordinary_ms + largest_episode_ms + 1e-9
