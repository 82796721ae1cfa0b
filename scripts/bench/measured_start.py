"""A fresh engine's first bursts, with and without the start-up measurement (`--measure_runs`).

    python scripts/bench/measured_start.py [--pairs=4] [--measure_runs=5] [--bursts=3]
        [--concurrency=1,16] [--new_tokens=32] [--prompt_tokens=64] [--json_out=FILE]

The programs of `engine.py`'s engine (`bench_common.engine_bench_config`: 16 slots, float32, no
speculation, K-step decode, prompt rows 1, 4, 16) are prepared and warmed once; then `--pairs`
times, two fresh engines are built over them, one measured before serving (`HeliosEngine(
measure_runs=N)`: every program timed N times, its duration estimate seeded with the samples) and
one not (each program measured on its first use in service, as the spec does without a measured
catalog), in alternating order. Each engine serves its first `--bursts` bursts at every
concurrency (as `first_token.py` does: `c` greedy requests of held-out text at once, every stream
read on one asyncio loop with the server's `next_event`), then is shut down.

Reported per setting and burst: the burst's median time to first token and its wall time
(medians over the pairs), the discovery executions it ran (first uses of unmeasured programs)
and the prefill and initialization programs it ran; and what building the measured engine cost
beside the other (the measurement's seconds).
"""

from __future__ import annotations

import collections
import statistics
import time

from absl import flags
from bench_common import engine_bench_config, prompt_windows
from first_token import burst  # noqa: F401 (its flags: concurrency, bursts, new_tokens, ...)
from program_variants import run_main

from helios_jax.engine_options import MEASURE_RUNS_DEFAULT

FLAGS = flags.FLAGS
flags.DEFINE_integer("pairs", 4, "fresh engines per setting, built in alternating order")
flags.DEFINE_integer(
    "measure_runs", MEASURE_RUNS_DEFAULT, "timed runs per program of the measured engine (server default)"
)
FLAGS.set_default("bursts", 3)


def serve_first_bursts(engine, prompts, concurrencies) -> list[dict]:
    """The engine's first bursts, every concurrency in turn: TTFT median, wall, discoveries."""
    out = []
    for i in range(FLAGS.bursts):
        for c in concurrencies:
            executions = engine.scheduler.counters.executions
            before, graphs = executions["discovery"], dict(engine.executor.graph_counts)
            t = time.perf_counter()
            ttft = burst(engine, prompts[:c])
            starts = {
                k: n - graphs.get(k, 0)
                for k, n in engine.executor.graph_counts.items()
                if not k.startswith("decode") and n > graphs.get(k, 0)
            }
            out.append(
                dict(
                    burst=i,
                    concurrency=c,
                    ttft_ms=ttft,
                    wall_ms=(time.perf_counter() - t) * 1e3,
                    discovery=executions["discovery"] - before,
                    programs=starts,
                )
            )
    return out


def run() -> dict:
    from helios_jax.compilation_cache import enable_compilation_cache
    from helios_jax.model.default import load_default_model
    from helios_jax.prepare import prepare, warm_up
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    enable_compilation_cache()
    model = load_default_model("float32")
    concurrencies = [int(c) for c in FLAGS.concurrency]
    windows = prompt_windows(model.tokenizer, max(concurrencies), FLAGS.prompt_tokens, FLAGS.seed)
    prompts = [w["tokens"] for w in windows]
    config = engine_bench_config(16, 512)
    prepared = prepare(model.config, model.params, config, name="helios-default")
    warm_up(prepared.programs, prepared.params)
    rows, build_s = [], collections.defaultdict(list)
    for pair in range(FLAGS.pairs):
        settings = [FLAGS.measure_runs, 0] if pair % 2 == 0 else [0, FLAGS.measure_runs]
        for runs in settings:
            t = time.perf_counter()
            engine = HeliosEngine(
                model_config=model.config,
                params=prepared.params,
                tokenizer=HFTokenizer(model.tokenizer),
                engine_config=config,
                programs=prepared.programs,
                measure_runs=runs,
            )
            build_s[runs].append(time.perf_counter() - t)
            try:
                for row in serve_first_bursts(engine, prompts, concurrencies):
                    rows.append(dict(pair=pair, measure_runs=runs, **row))
            finally:
                engine.shutdown()
            print(f"pair {pair} measure_runs={runs}: {rows[-1]}", flush=True)
    return dict(
        pairs=FLAGS.pairs,
        measure_runs=FLAGS.measure_runs,
        build_s={runs: round(statistics.median(v), 3) for runs, v in build_s.items()},
        summary=summarise(rows, concurrencies),
        rows=rows,
    )


def summarise(rows: list[dict], concurrencies: list[int]) -> list[dict]:
    out = []
    for runs in (FLAGS.measure_runs, 0):
        for i in range(FLAGS.bursts):
            for c in concurrencies:
                mine = [r for r in rows if (r["measure_runs"], r["burst"], r["concurrency"]) == (runs, i, c)]
                programs = collections.Counter()
                for r in mine:
                    programs.update(r["programs"])
                out.append(
                    dict(
                        measure_runs=runs,
                        burst=i,
                        concurrency=c,
                        ttft_ms=round(statistics.median(r["ttft_ms"] for r in mine), 2),
                        wall_ms=round(statistics.median(r["wall_ms"] for r in mine), 1),
                        discovery=sum(r["discovery"] for r in mine) / len(mine),
                        programs={k: n / len(mine) for k, n in sorted(programs.items())},
                    )
                )
                print(out[-1], flush=True)
    return out


if __name__ == "__main__":
    run_main(run)
