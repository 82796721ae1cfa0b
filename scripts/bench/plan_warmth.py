"""What one decision costs in service against the same decision repeated back to back.

    python scripts/bench/plan_warmth.py [--concurrency=1,16] [--runs=4] [--replays=300]
        [--decode_steps=1,4,8] [--new_tokens=128] [--prompt_tokens=64] [--dtype=float32]
        [--cpu_compute_threads=0]

Serves the engine `intervals.py --engine=bench` serves (16 request slots, greedy, no speculation,
the given decode step counts) and times every ``Scheduler.plan()`` call in the engine loop in the
loop thread's CPU time (``time.thread_time``: without the waits for a core that other threads
cause), while all c requests decode. At the eighth such decision (early in the first timed
run), the loop stops once and calls ``plan()`` ``--replays`` more times on the same state, back
to back (the memo dropped before each: ``plan()`` is pure, so each call recomputes the same
plan). The two medians are
the same decision's code on the same data; their ratio is what serving interleaved with
the programs and the completions costs each decision beyond the decision itself (caches and
predictors left cold by the work between decisions), which a benchmark of ``plan()`` alone
(``plan_path.py``) cannot see.

Absolute times on this shared machine are context; the ratio is within one invocation.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import engine_bench_config, prompt_windows, read_on_one_loop, submit_greedy  # noqa: E402

from helios_jax.compilation_cache import enable_compilation_cache  # noqa: E402
from helios_jax.cpu_threads import limit_compute_threads  # noqa: E402

FLAGS = flags.FLAGS
REPLAYED_DECISION = 8  # which decision of the steady decode is replayed (early in the first run)

flags.DEFINE_list("concurrency", ["1", "16"], "concurrent requests")
flags.DEFINE_integer("runs", 4, "timed runs per concurrency (after one untimed warm-up run)")
flags.DEFINE_integer("replays", 300, "back-to-back plan() calls on one mid-run state")
flags.DEFINE_list("decode_steps", ["1", "4", "8"], "steps K of the decode programs")
flags.DEFINE_integer("new_tokens", 128, "new tokens per request")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt")
flags.DEFINE_integer("cpu_compute_threads", 0, "XLA's CPU compute pool (0: one thread per core)")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "the model's and the programs' dtype")


class PlanTimer:
    """Wraps one engine's ``scheduler.plan``: CPU time of each call while every resident request
    decodes, and once, `replays` back-to-back calls on the state of the `at`-th such call."""

    def __init__(self, engine, c: int, replays: int, at: int):
        self.scheduler = engine.scheduler
        self.c, self.replays, self.at = c, replays, at
        self.served_us: list[float] = []
        self.replayed_us: list[float] = []
        self.plan = self.scheduler.plan
        self.scheduler.plan = self._timed

    def _steady(self) -> bool:
        residents = [r for r in self.scheduler.requests.values() if r.active]
        return len(residents) == self.c and all(r.phase.value == "decode" for r in residents)

    def _timed(self):
        if not self._steady():
            return self.plan()
        t = time.thread_time_ns()
        plan = self.plan()
        self.served_us.append((time.thread_time_ns() - t) / 1e3)
        if len(self.served_us) == self.at and not self.replayed_us:
            for _ in range(self.replays):
                self.scheduler._plan_memo = None
                t = time.thread_time_ns()
                again = self.plan()
                self.replayed_us.append((time.thread_time_ns() - t) / 1e3)
                assert again == plan or repr(again) == repr(plan), "plan() is pure: the same plan"
        return plan

    def remove(self) -> None:
        del self.scheduler.plan  # back to the class's method


def serve(engine, prompts, new_tokens: int) -> None:
    """Submit every prompt at once and read the streams on one asyncio loop, as the server does."""
    read_on_one_loop(submit_greedy(engine, prompts, new_tokens, "pw"))


def measure(engine, prompts, c: int) -> dict:
    timer = PlanTimer(engine, c, FLAGS.replays, at=REPLAYED_DECISION)
    try:
        for _ in range(FLAGS.runs):
            serve(engine, prompts[:c], FLAGS.new_tokens)
    finally:
        timer.remove()
    served, replayed = statistics.median(timer.served_us), statistics.median(timer.replayed_us)
    return dict(
        concurrency=c,
        decisions=len(timer.served_us),
        served_us=served,
        replayed_us=replayed,
        ratio=served / replayed,
    )


def main(argv):
    del argv
    limit_compute_threads(FLAGS.cpu_compute_threads)  # before anything initialises the backend
    enable_compilation_cache()
    from helios_jax.prepare import load_engine_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_engine_model(None, dtype=FLAGS.dtype)
    steps = tuple(int(k) for k in FLAGS.decode_steps)
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=engine_bench_config(16, 512, decode_steps=steps, dtype=FLAGS.dtype),
    )
    windows = prompt_windows(model.tokenizer, 32, FLAGS.prompt_tokens, 0)
    prompts = [w["tokens"] for w in windows]
    concurrencies = [int(c) for c in FLAGS.concurrency]
    try:
        for c in concurrencies:  # untimed: the first duration estimates
            serve(engine, prompts[:c], FLAGS.new_tokens)
        rows = [measure(engine, prompts, c) for c in concurrencies]
    finally:
        engine.shutdown()
    for row in rows:
        print(
            f"c={row['concurrency']:2d} decisions {row['decisions']:4d} plan() CPU median in service "
            f"{row['served_us']:7.1f} us, replayed back to back {row['replayed_us']:7.1f} us, "
            f"ratio {row['ratio']:.2f}"
        )


if __name__ == "__main__":
    app.run(main)
