"""A scheduling simulator: the real Scheduler driven by a fake executor on a virtual clock.

Durations come from a catalog's measured ``duration_ms`` (optionally with multiplicative noise);
acceptance comes from a model: a fixed number of accepted drafts per round, or per-position
acceptance probabilities. The executor honours the two-slot window exactly as an engine does:
a queued frame starts at its predecessor's completion and reports only its device interval;
an isolated frame also reports its wall interval. Every visible burst is published at its
completion time, before the next completion is processed.

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
    rounds: int = 100  # generation rounds measured after every stream's first output
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

    @property
    def max_gap_ms(self) -> float:
        times = self.publications
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)


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

    def to_json(self) -> dict:
        return {
            "requests": [{"first_output_ms": r.first_output_ms, "max_gap_ms": r.max_gap_ms,
                          "output_tokens": r.output_tokens, "prompt_tokens": r.prompt_tokens,
                          "arrival_ms": r.arrival_ms, "finished_ms": r.finished_ms} for r in self.requests],
            "progress_spread_tokens": self.progress_spread_tokens,
            "executions": self.executions,
            "execution_ms": self.execution_ms,
            "execution_ns": {k: int(v * 1e6) for k, v in self.execution_ms.items()},
            "selections": self.selections,
            "virtual_ms": self.virtual_ms,
            "bounds": {"timing_refresh_ms": self.timing_refresh_ms,
                       "acceptance_learning_ms": self.acceptance_learning_ms,
                       "ordinary_ms": self.ordinary_ms, "refresh_bound_ok": self.refresh_bound_ok,
                       "acceptance_bound_ok": self.acceptance_bound_ok,
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
        if self.config.accepted_drafts is not None:
            return np.array([1.0 if d < self.config.accepted_drafts else 0.0 for d in range(depth)])
        probs = list(self.config.acceptance_probs or ())
        probs = (probs + [probs[-1] if probs else 0.0] * depth)[:depth]
        return np.cumprod(probs)

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


def preseeded_history(config: SimConfig, depth: int) -> dict:
    """An acceptance history already matching the acceptance model (heavy weight)."""
    if config.accepted_drafts is not None:
        mean = np.array([1.0 if d < config.accepted_drafts else 0.0 for d in range(depth)])
    else:
        probs = list(config.acceptance_probs or (0.0,))
        probs = (probs + [probs[-1]] * depth)[:depth]
        mean = np.cumprod(probs)
    return {SOURCE_LEARNED: PrefixEstimate(mean.copy(), np.full(depth, 64.0), 0)}


def run(config: SimConfig, scheduler_factory: Callable[..., Scheduler] = Scheduler) -> SimResult:
    """Simulate until every request finished, the measured rounds ran, or the horizon passed.

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
    history = preseeded_history(config, sched.depth) if config.acceptance_history == "preseeded" else None
    stats = [RequestStats(a, p) for a, p in zip(arrivals, prompts)]
    waiting = collections.deque(range(n))
    handles = {}
    by_rid = {}
    frames = []  # (end_ms, fence, plan, device_ms, queued)
    fence = 0
    now = 0.0
    all_started_at = None
    rounds_seen = 0
    progress_at_start = None
    spread = None
    first_refresh_after = None
    generation = {GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED}

    def admit_ready():
        while waiting and arrivals[waiting[0]] <= now + 1e-9:
            i = waiting[0]
            if not sched.can_admit(prompts[i], outputs[i]):
                return
            waiting.popleft()
            h = sched.admit([TOKEN] * prompts[i], max_output=outputs[i], stop_token_ids=(EOS,),
                            acceptance_history=history)
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
        for g in generated:
            i = by_rid[g.handle.rid]
            s = stats[i]
            if s.first_output_ms is None:
                s.first_output_ms = now - s.arrival_ms
            s.publications.append(now)
            s.output_tokens += len(g.tokens)
            if g.finished:
                s.finished_ms = now
            sched.published_output(g.handle, f)
        if all_started_at is None and all(s.first_output_ms is not None for s in stats):
            all_started_at = now
            progress_at_start = [s.output_tokens for s in stats]
        elif all_started_at is not None and plan.graph.kind in generation and spread is None:
            rounds_seen += 1
            if rounds_seen >= config.rounds:
                gained = [s.output_tokens - p for s, p in zip(stats, progress_at_start)]
                spread = max(gained) - min(gained)
                if config.scenario == "startup":
                    break
        if not waiting and all(s.finished_ms is not None for s in stats):
            break
    ordinary_ms = sched.execution_ns["ordinary"] / NS_PER_MS
    refresh_ms = sched.execution_ns["timing_refresh"] / NS_PER_MS
    probe_ms = sched.execution_ns["acceptance_learning"] / NS_PER_MS
    max_episode = max([d for d in _episode_durations(sched)] + [0.0])
    return SimResult(
        requests=stats,
        progress_spread_tokens=spread,
        executions=dict(sched.executions),
        execution_ms={k: v / NS_PER_MS for k, v in sched.execution_ns.items()},
        selections=dict(sched.selections),
        virtual_ms=now,
        refresh_bound_ok=refresh_ms <= 0.002 / 0.998 * sched.timing_ledger.earned_from_ms + max_episode + 1e-9,
        acceptance_bound_ok=probe_ms <= 0.01 / 0.99 * sched.acceptance_ledger.earned_from_ms + max_episode + 1e-9,
        timing_refresh_ms=refresh_ms,
        acceptance_learning_ms=probe_ms,
        ordinary_ms=ordinary_ms,
        first_refresh_after_ms=first_refresh_after,
        speculative=dict(sched.speculative),
    )


def _episode_durations(sched: Scheduler):
    return [sched.timing_ledger.spent_ms, sched.acceptance_ledger.spent_ms]
