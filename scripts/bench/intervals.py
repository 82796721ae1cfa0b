"""Where the engine loop's time goes per frame, and how clean its device intervals are.

    python scripts/bench/intervals.py [--concurrency=1,16] [--new_tokens=128] [--prompt_tokens=64]
        [--repeats=2] [--speculation=off] [--decode_steps=1] [--bare_runs=30] [--readers=threads]
        [--dtype=float32] [--json_out=FILE]

Serves the embedded default model (``--dtype``, 16 request slots, greedy) with c concurrent requests
(each stream read by its own thread, or with ``--readers=loop`` all on one asyncio loop through
the server's ``next_event``, as the HTTP server reads them) and instruments the engine loop from
outside (wrappers around the executor's, the scheduler's and the engine's methods; the engine
is unchanged):

- **host time per frame**: loop wall time not spent blocked in ``Executor.wait_oldest``, divided
  by the frames completed (planning, packing, dispatch, completion, detokenization, publishing),
  and the share of four phases in it: completion (``HeliosEngine._complete``: outputs to records,
  the scheduler's completion, detokenization, publishing), planning (``Scheduler.plan``),
  packing (``Executor.pack``) and dispatch (``Executor.dispatch``, the program call), in wall
  time and in the loop thread's CPU time (``time.thread_time``: without the waits for a core or
  the interpreter lock that other threads and processes cause);
- **already queued**: the share of frames whose successor was already dispatched when the loop
  began to wait on them (the two-slot window overlapping host work with device work), and the
  waits without one by why (``alone``): the frame drains the window (prefills and state
  operations, by the spec), it had run past its expected end (an overrun suspends queueing), or
  neither (nothing runnable, or the best plan needed an empty window);
- **interval quality**: per prepared program, the median device interval the executor reported
  against the median bare execution of the same executable (call, then ``block_until_ready``,
  back to back, after the run, every call from the cursors of a run's mid-point). Their ratio
  minus one is the host share still in an interval; the share of frames reported with a missing
  interval (stamped too late to exclude host time) is given beside it;
- **decode batch widths**: the batch capacities of the decode frames, and the lanes of the
  generation frames committed while every resident request was decoding, against their number
  (``steady_lanes``, "lanes/decoding": at concurrency 16, "8/16" is a batch split in two);
- **tokens per second**: the run's output tokens over its wall time.

``--decode_steps`` sets the engine's decode programs' step counts (the server's default is 1, 4
and 8; this script's default, 1, is what its earlier figures measured).

Absolute times on this shared machine are context; the ratios are within one invocation.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import threading
import time

import jax
import numpy as np
from absl import app, flags
from bench_common import engine_bench_config, prompt_windows, read_on_one_loop, submit_greedy

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_list("concurrency", ["1", "16"], "concurrent requests")
flags.DEFINE_integer("new_tokens", 128, "new tokens per request")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt")
flags.DEFINE_integer("repeats", 2, "runs per concurrency (after one untimed warm-up run)")
flags.DEFINE_enum("speculation", "off", ["off", "fixed", "adaptive"], "the engine's speculation mode")
flags.DEFINE_integer("bare_runs", 30, "back-to-back executions per program for the bare baseline")
flags.DEFINE_list("decode_steps", ["1"], "steps K of the decode and width-one programs (the server: 1,4,8)")
flags.DEFINE_integer(
    "explain_splits", 0, "print the leading rows and the decoders' prices of the first N split decisions"
)
flags.DEFINE_integer("seed", 0, "seed of the prompt windows")
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "the model's and the programs' dtype")
flags.DEFINE_enum(
    "engine",
    "intervals",
    ["intervals", "bench"],
    "intervals: prefill chunks 64 and 128 of one row (this script's earlier figures); bench: the engine "
    "engine.py serves (bench_common.engine_bench_config: chunks 64-512, the server's prefill rows)",
)
flags.DEFINE_bool("show_frames", False, "print each run's programs in order (repeats run-length counted)")
flags.DEFINE_enum(
    "readers",
    "threads",
    ["threads", "loop"],
    "threads: a thread per stream; loop: every stream on one asyncio loop, as the server reads them",
)


# The loop's host phases timed by LoopProbe: (object attribute of the engine, method name).
PHASES = {
    "completion": (None, "_complete"),  # outputs to records, scheduler completion, publishing
    "planning": ("scheduler", "plan"),
    "packing": ("executor", "pack"),
    "dispatch": ("executor", "dispatch"),  # the program call (on a CPU it may run inside it)
}


class LoopProbe:
    """Wraps an engine's executor to time waits, count frames and queued successors, and the
    engine's phases (`PHASES`) to time the loop's host work by phase."""

    def __init__(self, engine):
        executor = engine.executor
        self.executor = executor
        self.wait_ns = 0
        self.frames = 0
        self.already_queued = 0
        # Waits with no successor queued, by why: the frame drains the window (prefill, state
        # operations), it ran past its expected end (an overrun suspends queueing), or neither
        # (nothing runnable, or the best plan needed an empty window).
        self.alone = collections.Counter()
        self.intervals = []  # (graph, ExecutionTiming) of every retired frame
        self.phase_ns = dict.fromkeys(PHASES, 0)
        self.phase_cpu_ns = dict.fromkeys(PHASES, 0)  # the loop thread's CPU time (thread_time)
        self.wrapped = []  # (object, name): instance attributes to delete afterwards
        for phase, (owner, name) in PHASES.items():
            target = engine if owner is None else getattr(engine, owner)
            setattr(target, name, self._timed(phase, getattr(target, name)))
            self.wrapped.append((target, name))
        wait_oldest, retire = executor.wait_oldest, executor.retire

        scheduler = engine.scheduler

        def timed_wait():
            self.already_queued += len(executor.inflight) > 1
            if len(executor.inflight) == 1:
                self.alone[self._why_alone(scheduler)] += 1
            t = time.perf_counter_ns()
            try:
                return wait_oldest()
            finally:
                self.wait_ns += time.perf_counter_ns() - t

        def counted_retire(frame):
            self.frames += 1
            self.intervals.append((frame.plan.graph, frame.timing()))
            retire(frame)

        executor.wait_oldest, executor.retire = timed_wait, counted_retire
        self.wrapped += [(executor, "wait_oldest"), (executor, "retire")]
        # Lanes of each generation frame committed while every resident request was decoding.
        self.steady_lanes = collections.Counter()
        self.splits = []  # explain() of the first --explain_splits split decisions
        commit = scheduler.commit

        def counted_commit(plan, fence):
            residents = [r for r in scheduler.requests.values() if r.active]
            if plan.kind.is_generation and residents and all(r.phase.value == "decode" for r in residents):
                self.steady_lanes[f"{len(plan.lanes)}/{len(residents)}"] += 1
                if len(plan.lanes) < len(residents) and len(self.splits) < FLAGS.explain_splits:
                    self.splits.append(explain(scheduler, plan))
            return commit(plan, fence)

        scheduler.commit = counted_commit
        self.wrapped.append((scheduler, "commit"))

    @staticmethod
    def _why_alone(scheduler):
        last = scheduler.frames[-1]
        if not last.plan.graph.kind.may_share_window:
            return "drains"
        if last.expected_end_ns is None or scheduler.now_ns > last.expected_end_ns:
            return "overrun"
        return "other"

    def _timed(self, phase, method):
        def timed(*args, **kwargs):
            t, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                self.phase_ns[phase] += time.perf_counter_ns() - t
                self.phase_cpu_ns[phase] += time.thread_time_ns() - cpu

        return timed

    def remove(self):
        """Back to the classes' methods."""
        for target, name in self.wrapped:
            delattr(target, name)


def explain(scheduler, plan, rows=5):
    """Why a decision served fewer lanes than decode: its leading rows (recomputed from the same
    state: plan() is pure) and every decoder's log output price and output age, served or not."""
    from helios_jax.scheduler import policy

    views = scheduler.views(plan.planning_start_ns, optimistic=False)
    inp = policy.SelectionInput(
        views, scheduler.graphs, scheduler.costs, scheduler.now_ns, scheduler.policy, scheduler.mode
    )
    _, found = policy.selection_rows(inp)
    served = {lane.handle.rid for lane in plan.lanes}
    return dict(
        chosen=plan.graph.name,
        rows=[(r.graph.name, r.score, r.duration_ms) for r in sorted(found, key=lambda r: -r.score)[:rows]],
        decoders=[
            (v.rid in served, v.log_output_price, v.age_ms) for v in views if v.phase.value == "decode"
        ],
    )


def serve(engine, prompts, new_tokens):
    streams = submit_greedy(engine, prompts, new_tokens, "iv")
    if FLAGS.readers == "loop":
        read_on_one_loop(streams)
        return
    readers = [threading.Thread(target=lambda s=s: list(s)) for s in streams]
    for t in readers:
        t.start()
    for t in readers:
        t.join()


def bare_ms(engine, graph_key, runs):
    """Median call-to-ready time of one executable, back to back, on `measurement_inputs`, every
    run from the same cursors (a run's mid-point context: a program of K steps would otherwise
    lengthen every lane's context by K per call), reset outside the timing."""
    from helios_jax.prepare.measurement import measurement_inputs, set_cursors

    executor = engine.executor
    program = executor.programs[graph_key]
    context = FLAGS.prompt_tokens + FLAGS.new_tokens // 2
    inputs = measurement_inputs(program, engine.config, context)
    cursors = executor.state.cursor
    start = jax.numpy.full(cursors.shape, context, cursors.dtype)
    if program.shape.kind.is_prefill:
        start = start.at[: program.shape.lanes].set(0)
    times = []
    for _ in range(runs + 3):
        executor.state = set_cursors(executor.state, start)
        jax.block_until_ready(executor.state)
        t = time.perf_counter_ns()
        executor.state, out = program(executor.params, executor.state, inputs)
        jax.block_until_ready(out)
        times.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(times[3:])


def measure(engine, prompts, c):
    probe = LoopProbe(engine)
    observations = dict(engine.executor.observations)
    t = time.perf_counter_ns()
    serve(engine, prompts, FLAGS.new_tokens)
    wall = time.perf_counter_ns() - t
    probe.remove()
    history = probe.intervals
    obs = {k: engine.executor.observations[k] - observations[k] for k in observations}
    decode = [g for g, _ in history if g.kind.value in ("decode", "speculative")]
    widths = collections.Counter(g.batch_capacity for g in decode)
    return dict(
        concurrency=c,
        frames=probe.frames,
        wall_ms=wall / 1e6,
        tokens_per_s=len(prompts) * FLAGS.new_tokens / (wall / 1e9),
        host_ms_per_frame=(wall - probe.wait_ns) / 1e6 / max(probe.frames, 1),
        already_queued=probe.already_queued / max(probe.frames, 1),
        alone={why: probe.alone[why] for why in ("drains", "overrun", "other")},
        phase_ms_per_frame={k: v / 1e6 / max(probe.frames, 1) for k, v in probe.phase_ns.items()},
        phase_cpu_ms_per_frame={k: v / 1e6 / max(probe.frames, 1) for k, v in probe.phase_cpu_ns.items()},
        completion_us_per_token=probe.phase_ns["completion"] / 1e3 / (len(prompts) * FLAGS.new_tokens),
        completion_cpu_us_per_token=probe.phase_cpu_ns["completion"] / 1e3 / len(prompts) / FLAGS.new_tokens,
        observations=obs,
        missing_share=sum(1 for _, tm in history if not tm.device_ns) / max(len(history), 1),
        decode_widths={str(k): v for k, v in sorted(widths.items())},
        steady_lanes=dict(probe.steady_lanes),
        splits=probe.splits,
        sequence=frame_sequence(history),
        intervals=history,
    )


def interval_quality(engine, runs):
    by_graph = collections.defaultdict(list)
    for row in runs:
        for g, tm in row.pop("intervals"):
            if tm.device_ns and g.kind.value in ("decode", "speculative", "prefill"):
                by_graph[g].append(tm.device_ns / 1e6)
    out = {}
    for g, values in sorted(by_graph.items(), key=lambda kv: -len(kv[1])):
        if len(values) < 5:
            continue
        bare = bare_ms(engine, g.key, FLAGS.bare_runs)
        reported = statistics.median(values)
        out[g.name] = dict(
            samples=len(values), reported_ms=reported, bare_ms=bare, host_share=reported / bare - 1
        )
    return out


def engine_config():
    """The engine measured (`--engine`, `--speculation`, `--decode_steps`)."""
    import dataclasses

    from helios_jax.engine_config import EngineConfig

    steps = tuple(int(k) for k in FLAGS.decode_steps)
    speculative = FLAGS.speculation != "off"
    if FLAGS.engine == "bench":
        ec = engine_bench_config(16, 512, decode_steps=steps, dtype=FLAGS.dtype)
        return dataclasses.replace(ec, speculation=FLAGS.speculation, draft_tokens=3 if speculative else 0)
    return EngineConfig(
        request_slots=16,
        prefill_chunks=(64, 128),
        speculation=FLAGS.speculation,
        draft_tokens=3 if speculative else 0,
        max_model_len=512,
        dtype=FLAGS.dtype,
        decode_steps=steps,
    )


def frame_sequence(history) -> str:
    """The programs of a run in order, each run of repeats counted: 'prefill[B=16,...] x1, ...'."""
    out = []
    for graph, _ in history:
        if out and out[-1][0] == graph.name:
            out[-1][1] += 1
        else:
            out.append([graph.name, 1])
    return ", ".join(f"{name} x{n}" for name, n in out)


def main(argv):
    del argv
    enable_compilation_cache()
    from helios_jax.prepare import load_engine_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_engine_model(None, dtype=FLAGS.dtype)
    ec = engine_config()
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=ec,
    )
    windows = prompt_windows(model.tokenizer, 32, FLAGS.prompt_tokens, FLAGS.seed)
    prompts = [w["tokens"] for w in windows]
    concurrencies = [int(c) for c in FLAGS.concurrency]
    try:
        for c in concurrencies:  # untimed: the first duration estimates, allocators
            serve(engine, prompts[:c], FLAGS.new_tokens)
        runs = [measure(engine, prompts[:c], c) for _ in range(FLAGS.repeats) for c in concurrencies]
        quality = interval_quality(engine, runs)
    finally:
        engine.shutdown()
    for row in runs:
        print(
            f"c={row['concurrency']:2d} frames {row['frames']:4d} {row['tokens_per_s']:7.0f} tok/s "
            f"host/frame {row['host_ms_per_frame']:.3f} ms "
            f"queued {row['already_queued']:.0%} alone {row['alone']} missing {row['missing_share']:.0%} "
            f"decode widths {row['decode_widths']} (lanes/decoding, all decoding: {row['steady_lanes']}) "
            f"{row['observations']}"
        )
        phases = ", ".join(f"{k} {v:.3f}" for k, v in row["phase_ms_per_frame"].items())
        cpu = ", ".join(f"{k} {v:.3f}" for k, v in row["phase_cpu_ms_per_frame"].items())
        per_token = row["completion_us_per_token"], row["completion_cpu_us_per_token"]
        print(f"      host ms per frame by phase: {phases} (thread CPU time: {cpu})")
        print(f"      completion per token: {per_token[0]:.1f} us ({per_token[1]:.1f} us CPU)")
        if FLAGS.show_frames:
            print(f"      frames: {row['sequence']}")
        for split in row["splits"]:
            rows = "; ".join(f"{name} {score:.3f} ({ms or 0:.1f} ms)" for name, score, ms in split["rows"])
            prices = " ".join(f"{'*' if s else ''}{p:.1f}" for s, p, _ in split["decoders"])
            print(f"      split: {split['chosen']}; rows {rows}; log output prices (* served) {prices}")
    for name, q in quality.items():
        print(
            f"{name:40s} n={q['samples']:4d} reported {q['reported_ms']:.3f} ms bare {q['bare_ms']:.3f} ms "
            f"host share {q['host_share']:+.1%}"
        )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(runs=runs, interval_quality=quality, argv=sys.argv), f, indent=1, default=float)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    app.run(main)
