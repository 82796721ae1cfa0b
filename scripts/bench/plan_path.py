"""Time the whole ``Scheduler.plan()`` path at 1, 4, 16 and 64 resident requests.

    python scripts/bench/plan_path.py [--catalog=FILE|engine|engine-off16] [--requests=1,4,16,64]
        [--decisions=200] [--subsets=all,no_wide_mixed,no_mixed,core] [--mode=adaptive] [--burst]
        [--json_out=FILE] [--profile]

``scripts/bench/scheduler_select.py`` times ``policy.select`` on synthetic views; this times what
an engine pays per decision: ``plan()`` on a live Scheduler (projected service histories and
prices for every resident, normalisers, selection, the timing-refresh and acceptance-probe
checks, freezing the plan). The catalog JSON is loaded with ``request_slots`` raised to 64 (a
copy; every program is unchanged), so 64 requests can be resident.

Population: a closed loop of N resident requests (prompts drawn from 64/512/2048/6000 tokens,
outputs from 16/128/512; a finished request is replaced at once), driven by the simulator's fake
executor (per-position acceptance 0.8..0.2) one plan at a time: each decision is timed right
after the previous completion, as in serving. After ``--warmup`` decisions, ``--decisions`` are
timed. Beside each ``plan()`` the same state's ``views()`` (with optimistic estimates only when
a probe can be funded, as ``plan()`` asks for them) and the selection (``policy.selection_rows``
and ``policy.select`` on its rows, as ``plan()`` selects) are timed on their own (both are
pure), which splits the cost; "other" is plan minus the two (ledger checks, a refresh
alternative or an acceptance probe when funded, freezing).

``--catalog=engine`` benches the catalog HeliosEngine builds from a default ``EngineConfig()``
(its request slots, decode mode, context, draft storage and initialize programs, as the engine
constructs its Scheduler), with synthetic durations (its programs carry none): prompts are then
drawn up to its context, and ``--slots`` is ignored. ``--catalog=engine-off16`` is the engine
``scripts/bench/engine.py`` serves (``bench_common.engine_bench_config``): 16 request slots, no
speculation, decode programs of 1, 4 and 8 steps, prefill chunks 64 to 512 with prompt rows 1, 4
and 16, context 512 (run it with ``--mode=ordinary``).

``--burst``: instead of replacing each finished request at once, the loop admits N requests
together and admits the next N only when all have finished, so the decisions include the
start-up of a burst (N prompts waiting, their initialization and snapshots) as in
``engine.py``'s runs; outputs are then drawn from those that fit the context beside the prompt.

Wall time is what a caller sees; process CPU time is reported beside it because this machine is
shared. Catalog size: ``--subsets`` drop program families (``all``: every program;
``no_wide_mixed``: mixed programs of width one only; ``no_mixed``: no mixed programs; ``core``:
prefill and speculative programs only; an engine catalog keeps the initialize, snapshot and
restore programs its Scheduler requires in every subset).
"""

from __future__ import annotations

import collections
import cProfile
import dataclasses
import importlib.resources
import io
import json
import math
import pstats
import statistics
import time

import numpy as np
from absl import app, flags
from bench_common import engine_bench_config

from helios_jax import simulation
from helios_jax.catalog import Catalog, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.scheduler import policy
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import ExecutionTiming

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "catalog",
    None,
    "catalog JSON, or 'engine': EngineConfig()'s catalog, or 'engine-off16': engine.py's "
    "(default: synthetic-h200)",
)
flags.DEFINE_bool("burst", False, "admit N requests together, the next N when all have finished")
flags.DEFINE_integer(
    "window", 1, "frames in flight: 2 plans the next frame while one is queued, as an engine does"
)
flags.DEFINE_list("requests", ["1", "4", "16", "64"], "resident requests")
flags.DEFINE_list("subsets", ["all", "no_wide_mixed", "no_mixed", "core"], "catalog subsets")
flags.DEFINE_enum("mode", "adaptive", ["ordinary", "fixed", "adaptive"], "loaded decode mode")
flags.DEFINE_integer("decisions", 200, "timed decisions per population and subset")
flags.DEFINE_integer("warmup", 40, "untimed decisions first")
flags.DEFINE_integer("slots", 64, "request_slots of the loaded copy")
flags.DEFINE_integer("seed", 0, "workload seed")
flags.DEFINE_float(
    "noise",
    0.0,
    "log-uniform multiplicative noise on the fake durations (simulation.SimConfig.noise): with it a "
    "measured median moves after most frames, as a device's does, so the caches kept per cost "
    "version are rebuilt as often as in an engine (0: the synthetic durations never move one)",
)
flags.DEFINE_string("json_out", None, "write results as JSON here")
flags.DEFINE_bool(
    "profile", False, "then cProfile plan() (untimed pass) at the largest population, first subset"
)

PROMPTS = (64, 512, 2048, 6000)
OUTPUTS = (16, 128, 512)
ACCEPTANCE = (0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)

SUBSETS = {
    "all": lambda g: True,
    "no_wide_mixed": lambda g: not (g.kind is GraphKind.MIXED and g.token_capacity > 1),
    "no_mixed": lambda g: g.kind is not GraphKind.MIXED,
    "core": lambda g: g.kind in (GraphKind.PREFILL, GraphKind.SPECULATIVE, GraphKind.DECODE),
}


def catalog_json() -> dict:
    if FLAGS.catalog:
        with open(FLAGS.catalog) as f:
            return json.load(f)
    return json.loads(
        importlib.resources.files("helios_jax.catalogs").joinpath("synthetic-h200.json").read_text()
    )


def subset_catalog(obj: dict, slots: int, subset: str) -> Catalog:
    """A copy of the catalog JSON with `slots` request slots and only the subset's programs."""
    full = Catalog.from_json(dict(obj, request_slots=slots))
    return dataclasses.replace(full, graphs=tuple(g for g in full.graphs if SUBSETS[subset](g)))


def _synthetic_ms(g: GraphDescriptor) -> float:
    """A plausible duration for a program that carries none (the engine's catalog)."""
    rows = max(g.batch_capacity * max(g.token_capacity, 1), g.target_capacity, g.max_packed_extent)
    return round(0.3 + 0.004 * rows + 0.02 * g.batch_capacity, 3)


# The engine configurations --catalog names: EngineConfig()'s, and the one scripts/bench/engine.py
# serves (bench_common.engine_bench_config: 16 slots, speculation off, K-step decode programs).
ENGINE_CONFIGS = {"engine": EngineConfig, "engine-off16": engine_bench_config}
# Programs an engine's Scheduler requires (it initializes requests and retains checkpoints): kept
# in every subset of an engine catalog, which would otherwise fail to construct under ``core``.
ENGINE_SUPPORT = (GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE)


def engine_catalog(subset: str) -> tuple[Catalog, dict]:
    """An engine configuration's catalog with synthetic durations, and the Scheduler arguments
    the engine gives it (``runtime.engine``)."""
    config = ENGINE_CONFIGS[FLAGS.catalog]()
    full = config.catalog()
    graphs = tuple(dataclasses.replace(g, duration_ms=_synthetic_ms(g)) for g in full.graphs)
    draft = max(config.proposal_depths, default=0) if config.speculative else 0
    fixed = max(config.proposal_depths) + 1 if config.speculation == "fixed" else None
    kwargs = dict(  # the decode mode is --mode's (EngineConfig()'s is adaptive, its default)
        fixed_width=fixed,
        page_size=config.page_size,
        kv_pages=config.kv_pages,
        max_model_len=config.max_model_len - draft,
        draft_storage=draft,
        initialize_requests=True,
        snapshot_rows=config.snapshot_rows,  # checkpoint retention, as runtime.scheduling builds it
        checkpoints=config.snapshot_rows > 0,
    )
    kept = tuple(g for g in graphs if SUBSETS[subset](g) or g.kind in ENGINE_SUPPORT)
    return dataclasses.replace(full, graphs=kept), kwargs


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class Loop:
    """A closed loop of `n` resident requests on a live Scheduler, `window` frames in flight."""

    def __init__(
        self,
        catalog: Catalog,
        mode: DecodeMode,
        n: int,
        seed: int,
        burst: bool = False,
        window: int = 1,
        **kwargs,
    ):
        self.sched = Scheduler(catalog, mode=mode, **kwargs)
        self.window = window  # frames in flight before the oldest completes (an engine's: 2)
        self.in_flight: collections.deque = collections.deque()
        # Prompt and output sizes that fit the context (the engine's catalog has a short one).
        room = self.sched.max_model_len
        self.prompts = [p for p in PROMPTS if p + max(OUTPUTS) <= room] or [min(PROMPTS)]
        self.outputs = [o for o in OUTPUTS if max(self.prompts) + o <= room] or [min(OUTPUTS)]
        self.burst = burst
        self.sched.seed_costs(0)
        self.rng = np.random.default_rng(seed)
        config = simulation.SimConfig(
            catalog, accepted_drafts=None, acceptance_probs=ACCEPTANCE, seed=seed, noise=FLAGS.noise
        )
        self.executor = simulation.FakeExecutor(config, self.sched, self.rng)
        self.n = n
        self.fence = 0
        self.now_ms = 0.0
        self.fill()

    def fill(self) -> None:
        if self.burst and self.sched.requests:
            return
        while len(self.sched.requests) < self.n:
            p, o = int(self.rng.choice(self.prompts)), int(self.rng.choice(self.outputs))
            self.sched.admit([simulation.TOKEN] * p, max_output=o, stop_token_ids=(simulation.EOS,))

    def step(self, plan) -> None:
        """Commit `plan` (None, or one that needs an empty window while a frame is queued: none),
        and complete the oldest frame once `window` frames are in flight (or nothing was
        committed): run it on the fake executor, complete and publish, refill."""
        s = self.sched
        if plan is not None and not (plan.needs_empty_window and self.in_flight):
            self.fence += 1
            s.commit(plan, self.fence)
            queued = bool(self.in_flight)  # starts at its predecessor's end: its interval alone
            self.in_flight.append((self.fence, plan, self.executor.duration_ms(plan), queued))
            if len(self.in_flight) < self.window:
                return
        if self.in_flight:
            self._complete_oldest()
        self.fill()

    def _complete_oldest(self) -> None:
        s = self.sched
        fence, plan, device, queued = self.in_flight.popleft()
        self.now_ms += device
        s.advance_to(int(self.now_ms * NS_PER_MS))
        records, sidecar = self.executor.run(plan)
        timing = ExecutionTiming((device * NS_PER_MS,), device * NS_PER_MS, queued=queued)
        if sidecar is not None:
            generated = s.complete_packed_round(fence, records, timing, sidecar)
        else:
            generated = s.complete(fence, records, timing)
        for g in generated:
            s.published_output(g.handle, fence)


def profile_plan(catalog: Catalog, mode: DecodeMode, n: int, **kwargs) -> str:
    """cProfile of plan() alone over the same closed loop (a separate, untimed pass)."""
    loop = Loop(catalog, mode, n, FLAGS.seed, burst=FLAGS.burst, window=FLAGS.window, **kwargs)
    s = loop.sched
    for _ in range(FLAGS.warmup):
        loop.step(s.plan())
    profiler = cProfile.Profile()
    for _ in range(FLAGS.decisions):
        profiler.enable()
        plan = s.plan()
        profiler.disable()
        loop.step(plan)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats("helios_jax", 22)
    stats.sort_stats("tottime").print_stats(12)
    return out.getvalue()


def measure(catalog: Catalog, mode: DecodeMode, n: int, **kwargs) -> dict:
    loop = Loop(catalog, mode, n, FLAGS.seed, burst=FLAGS.burst, window=FLAGS.window, **kwargs)
    s = loop.sched
    for _ in range(FLAGS.warmup):
        loop.step(s.plan())
    wall, cpu, views_ms, select_ms = [], [], [], []
    kinds: dict[str, int] = {}
    wall_by_kind: dict[str, list[float]] = {}  # each decision's wall time, by the kind it chose
    for _ in range(FLAGS.decisions):
        w0, c0 = time.perf_counter(), time.process_time()
        plan = s.plan()
        c1, w1 = time.process_time(), time.perf_counter()
        wall.append((w1 - w0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
        # The split, on the same (unchanged) state: both calls are pure.
        t0 = time.perf_counter()
        start = s._planning_start_ns()
        views = s.views(start, optimistic=False)  # as plan() asks (a probe prices its own)
        t1 = time.perf_counter()
        inp = policy.SelectionInput(views, s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        policy.select(inp, rows=policy.selection_rows(inp)[1])  # as plan() selects
        t2 = time.perf_counter()
        views_ms.append((t1 - t0) * 1e3)
        select_ms.append((t2 - t1) * 1e3)
        kind = "none" if plan is None else plan.graph.kind.value
        kinds[kind] = kinds.get(kind, 0) + 1
        wall_by_kind.setdefault(kind, []).append(wall[-1])
        loop.step(plan)
    phases = {}
    for r in s.requests.values():
        phases[r.phase.value] = phases.get(r.phase.value, 0) + 1
    row = {
        "requests": n,
        "programs": len(s.graphs.graphs),
        "median_ms": statistics.median(wall),
        "mean_ms": statistics.fmean(wall),
        "cpu_mean_ms": statistics.fmean(cpu),
        "p99_ms": _p99(wall),
        "cpu_median_ms": statistics.median(cpu),
        "cpu_p99_ms": _p99(cpu),
        "views_median_ms": statistics.median(views_ms),
        "select_median_ms": statistics.median(select_ms),
        "other_median_ms": statistics.median([w - v - x for w, v, x in zip(wall, views_ms, select_ms)]),
        "select_p99_ms": _p99(select_ms),
        "views_p99_ms": _p99(views_ms),
        "plans_by_kind": kinds,
        # What a decision costs by what it chose: a decode-only decision against one that admits,
        # initializes or prefills (the loop replaces each finished request at once).
        "median_ms_by_kind": {k: statistics.median(v) for k, v in sorted(wall_by_kind.items())},
        "phases_at_end": phases,
    }
    return row


def load(subset: str) -> tuple[Catalog, dict]:
    """The benched catalog subset and the Scheduler arguments beside the mode."""
    if FLAGS.catalog in ENGINE_CONFIGS:
        return engine_catalog(subset)
    return subset_catalog(catalog_json(), FLAGS.slots, subset), {}


def main(argv):
    del argv
    mode = DecodeMode(FLAGS.mode)
    sizes = [int(x) for x in FLAGS.requests]
    results = []
    print(
        f"{'subset':14s} {'progs':>5s} {'reqs':>4s} {'median':>8s} {'p99':>8s} {'cpu med':>8s} "
        f"{'cpu p99':>8s} {'views':>7s} {'select':>7s} {'other':>7s}   (ms)"
    )
    for subset in FLAGS.subsets:
        catalog, kwargs = load(subset)
        for n in sizes:
            row = measure(catalog, mode, n, **kwargs)
            row["subset"] = subset
            results.append(row)
            print(
                f"{subset:14s} {row['programs']:5d} {n:4d} {row['median_ms']:8.3f} {row['p99_ms']:8.3f} "
                f"{row['cpu_median_ms']:8.3f} {row['cpu_p99_ms']:8.3f} {row['views_median_ms']:7.3f} "
                f"{row['select_median_ms']:7.3f} {row['other_median_ms']:7.3f}",
                flush=True,
            )
            by_kind = ", ".join(
                f"{k} {ms:.3f} ({row['plans_by_kind'][k]})" for k, ms in row["median_ms_by_kind"].items()
            )
            print(f"{'':14s} median by the kind chosen (decisions): {by_kind}", flush=True)
    profile = None
    if FLAGS.profile:
        catalog, kwargs = load(FLAGS.subsets[0])
        profile = profile_plan(catalog, mode, max(sizes), **kwargs)
        print(profile)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                {
                    "catalog": catalog.name,
                    "mode": mode.value,
                    "slots": FLAGS.slots,
                    "results": results,
                    "profile": profile,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    app.run(main)
