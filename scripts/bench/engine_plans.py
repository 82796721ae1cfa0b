"""What one `plan()` costs inside the engine, and the same decision's cost outside it.

    python scripts/bench/engine_plans.py [--concurrency=16] [--new_tokens=128] [--decode_steps=1,4,8]
        [--readers=loop] [--snapshots=3] [--runs=300] [--json_out=FILE]

Serves the engine ``engine.py`` measures (``bench_common.engine_bench_config``: 16 slots, no
speculation, K-step decode) with c concurrent greedy streams read on one asyncio loop (the
server's way; ``--readers=threads``: a thread each), after one untimed run, and records
the engine loop thread's CPU time (``time.thread_time``) of every ``Scheduler.plan`` call that
computed a plan (a reused one, ``reuse.py``, is not a decision). At a few decisions spread over the
run it copies the scheduler (``copy.deepcopy``, the memo dropped, the frozen program descriptors
shared): ``plan()`` is pure, so a copy decides what the engine decided, which is checked. After
the run it times ``plan()`` on each copy `--runs` times, the memo dropped before each, under
conditions that add one engine circumstance at a time:

- **warm**: the same decision over and over, nothing else running (every cache warm);
- **new estimate**: each call as the first after a changed duration estimate (the cost model's
  version bumped: what the engine's noisy measured durations do after most frames, where
  ``plan_path.py``'s synthetic ones rarely move a median), so the per-version caches (the
  programs' durations, reference intervals, normalizers) are rebuilt; in full, since the bump
  logs no key (``CostModel.changed_since``), where a real change rereads only its program's
  estimate: an upper bound of what a change costs;
- **cold**: that, and 8 MB of other memory touched between calls (the program, completion and
  readers run between two decisions in the engine);
- **beside the program**: that, while another thread runs the engine's ``decode[B=c]``
  executable back to back, as a frame in flight does while the loop plans the next (XLA's CPU
  compute pool takes one thread per core, and on a CPU the "device" is the loop's cores).

The in-engine median against the conditions' medians says how much of a decision's cost in the
engine is the decision's own and how much is where it runs.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import threading
import time

import jax
import numpy as np
from absl import app, flags
from bench_common import prompt_windows
from intervals import engine_config, serve

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_integer("snapshots", 3, "scheduler copies taken at decisions spread over the run")
flags.DEFINE_integer("runs", 300, "timed plan() calls per copy and condition")
# intervals.py's flags (imported with it) set the engine and its readers: --concurrency,
# --new_tokens, --prompt_tokens, --decode_steps, --engine, --dtype, --seed, --readers, --json_out.
# Here the engine is engine.py's and the streams are read on one asyncio loop, as the server
# reads them, unless the command line says otherwise.
FLAGS.set_default("engine", "bench")
FLAGS.set_default("readers", "loop")
FLAGS.set_default("decode_steps", ["1", "4", "8"])
FLAGS.set_default("concurrency", ["16"])


class PlanRecorder:
    """Wraps the engine's `Scheduler.plan`: the loop thread's CPU time per computed plan, and
    deep copies of the scheduler at the decisions numbered in `at`."""

    def __init__(self, scheduler, at: set[int]):
        self.scheduler, self.at = scheduler, at
        self.cpu_ms: list[float] = []
        self.copies: list = []
        self.plans: list = []  # the engine's plan at each copied decision
        self.kinds: list[str] = []  # each computed plan's program
        self.copied_ms: list[float] = []  # the engine's CPU time of each copied decision
        self._plan = scheduler.plan
        scheduler.plan = self

    def __call__(self):
        s = self.scheduler
        fresh = s._plan_memo is None
        t = time.thread_time_ns()
        plan = self._plan()
        elapsed = (time.thread_time_ns() - t) / 1e6
        if fresh and plan is not None:  # (the copies are taken at the numbered decisions)
            self.cpu_ms.append(elapsed)
            self.kinds.append(plan.graph.name)
            if len(self.cpu_ms) in self.at:
                memo, s._plan_memo = s._plan_memo, None
                # The programs' descriptors (frozen) stay shared: caches are keyed by their ids.
                self.copies.append(copy.deepcopy(s, {id(g): g for g in s.graphs.graphs}))
                self.plans.append(plan)
                self.copied_ms.append(elapsed)
                s._plan_memo = memo
        return plan

    def remove(self) -> None:
        del self.scheduler.plan  # the instance attribute: the class's method again


CONDITIONS = ("warm", "new_estimate", "cold", "beside_program")
_OTHER_MEMORY = np.ones(1 << 20)  # 8 MB of float64


def time_copy(s, plan, runs: int, condition: str) -> float:
    """Median thread CPU ms of a fresh plan() on copy `s` under `condition` (the program thread
    of "beside_program" is the caller's), checked to decide `plan`."""
    s.__dict__.pop("plan", None)  # copied with the recorder's attribute
    out = []
    for _ in range(runs):
        s._plan_memo = None
        if condition != "warm":
            s.costs.version += 1  # every per-version cache misses (rebuilt in full: no key logged)
        if condition in ("cold", "beside_program"):
            _OTHER_MEMORY[::8] += 1.0  # every cache line of it
        t = time.thread_time_ns()
        mine = s.plan()
        out.append((time.thread_time_ns() - t) / 1e6)
    if repr(mine) != repr(plan):
        raise AssertionError(f"a copy planned {mine!r}, the engine {plan!r}")
    return statistics.median(out)


class ProgramBeside:
    """Another thread running one executable back to back on its own copy of the engine state."""

    def __init__(self, engine, batch: int):
        from helios_jax.prepare.measurement import measurement_inputs

        executor = engine.executor
        key = next(
            k
            for k, p in executor.programs.items()
            if p.shape.kind.value == "decode" and p.shape.lanes == batch and p.shape.steps == 1
        )
        self.program, self.params = executor.programs[key], executor.params
        self.inputs = measurement_inputs(self.program, engine.config, FLAGS.prompt_tokens)
        self.state = jax.tree.map(lambda x: x.copy(), executor.state)
        self.stop = threading.Event()
        self.calls = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.state, out = self.program(self.params, self.state, self.inputs)
            jax.block_until_ready(out)
            self.calls += 1

    def __enter__(self):
        self.thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def main(argv):
    del argv
    enable_compilation_cache()
    from helios_jax.prepare import load_engine_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_engine_model(None, dtype=FLAGS.dtype)
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=engine_config(),
    )
    c = int(FLAGS.concurrency[0])
    prompts = [w["tokens"] for w in prompt_windows(model.tokenizer, c, FLAGS.prompt_tokens, FLAGS.seed)]
    try:
        serve(engine, prompts, FLAGS.new_tokens)  # untimed: estimates, allocators, compilations
        steps = max(FLAGS.new_tokens // 8, 8)  # a rough count of decisions: spread the copies early
        at = {1 + (i + 1) * steps // (FLAGS.snapshots + 1) for i in range(FLAGS.snapshots)}
        recorder = PlanRecorder(engine.scheduler, at)
        serve(engine, prompts, FLAGS.new_tokens)
        recorder.remove()
        pairs = list(zip(recorder.copies, recorder.plans))
        ms = {c: [time_copy(s, plan, FLAGS.runs, c) for s, plan in pairs] for c in CONDITIONS[:-1]}
        with ProgramBeside(engine, min(c, engine.config.request_slots)) as beside:
            ms["beside_program"] = [time_copy(s, plan, FLAGS.runs, "beside_program") for s, plan in pairs]
    finally:
        engine.shutdown()
    engine_ms = statistics.median(recorder.cpu_ms)
    row = dict(
        concurrency=c,
        decisions=len(recorder.cpu_ms),
        engine_cpu_median_ms=engine_ms,
        copies=[
            dict(
                program=recorder.plans[i].graph.name,
                engine_ms=recorder.copied_ms[i],
                requests=len(s.requests),
                frames=len(s.frames),
                **{f"{k}_ms": ms[k][i] for k in CONDITIONS},
            )
            for i, s in enumerate(recorder.copies)
        ],
        **{f"{k}_median_ms": statistics.median(ms[k]) for k in CONDITIONS},
        program_calls_beside=beside.calls,
    )
    medians = ", ".join(f"{k} {row[f'{k}_median_ms']:.3f}" for k in CONDITIONS)
    print(
        f"c={c}: {row['decisions']} decisions, in the engine {engine_ms:.3f} ms CPU a plan (median); "
        f"the copied decisions: {medians} ms ({beside.calls} program calls beside)"
    )
    by_program: dict[str, list[float]] = {}
    for name, t in zip(recorder.kinds, recorder.cpu_ms):
        by_program.setdefault(name, []).append(t)
    row["engine_by_program"] = {
        k: dict(n=len(v), median_ms=statistics.median(v)) for k, v in by_program.items()
    }
    for name, v in sorted(by_program.items(), key=lambda kv: -len(kv[1])):
        print(f"  in the engine, plans of {name}: {len(v)}, median {statistics.median(v):.3f} ms")
    for i, cp in enumerate(row["copies"]):
        each = ", ".join(f"{k} {cp[f'{k}_ms']:.3f}" for k in CONDITIONS)
        where = f"{cp['requests']} requests, {cp['frames']} frames in flight"
        print(f"  copy {i} ({cp['program']}; {where}): in the engine {cp['engine_ms']:.3f}; {each} ms")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(results=[row], argv=sys.argv), f, indent=1)


if __name__ == "__main__":
    app.run(main)
