"""The start of a burst as a server's reader sees it: time to first token and the decisions before it.

    python scripts/bench/first_token.py [--concurrency=1,16] [--bursts=40] [--new_tokens=32]
        [--prompt_tokens=64] [--json_out=FILE]

One engine as `engine.py` builds it (`bench_common.engine_bench_config`: 16 slots, float32, no
speculation, K-step decode, prompt rows 1, 4, 16), greedy requests of held-out text. Each burst
submits `c` requests at once and reads every stream on one asyncio loop with the server's
``next_event`` (the HTTP server's reader, in its own thread); a request's time to first token is
its first event's arrival on that loop less the burst's submission. Three untimed bursts per
concurrency first, then `--bursts` timed ones, concurrencies interleaved burst by burst. Reported
per concurrency: TTFT p50 and p90 over the bursts' medians, and the median time of the engine's
decisions by the kind of program each chose (``Scheduler.plan``, wrapped from outside), and how
many of each program other than decode a burst ran (initializations, prefills, snapshots).

Run it from two checkouts with `ab_checkouts.py --fields='p50|p90|_ms'` to compare them.
"""

from __future__ import annotations

import asyncio
import collections
import statistics
import time

from absl import flags
from bench_common import engine_bench_config, percentile, prompt_windows
from program_variants import run_main

FLAGS = flags.FLAGS
flags.DEFINE_list("concurrency", ["1", "16"], "requests per burst (one case each)")
flags.DEFINE_integer("bursts", 40, "timed bursts per concurrency")
flags.DEFINE_integer("new_tokens", 32, "new tokens per request")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt")
flags.DEFINE_integer("seed", 0, "seed of the prompt windows")
flags.DEFINE_string("json_out", None, "write the figures as JSON here")


class DecisionTimes:
    """Wraps the scheduler's `plan` to time each decision by the kind of program it chose."""

    def __init__(self, scheduler):
        self.by_kind: dict[str, list[float]] = collections.defaultdict(list)
        self.on = False
        plan = scheduler.plan

        def timed():
            t = time.perf_counter_ns()
            chosen = plan()
            if self.on and chosen is not None:
                self.by_kind[chosen.graph.kind.value].append((time.perf_counter_ns() - t) / 1e6)
            return chosen

        scheduler.plan = timed


def burst(engine, prompts) -> float:
    """One burst's median time to first token (ms), every stream read on one asyncio loop."""
    from helios_jax.runtime.api import GenerationRequest, SamplingParams
    from helios_jax.serve.events import next_event

    async def serve():
        start = time.perf_counter()
        firsts = []

        async def read(stream):
            first = True
            while True:
                event = await next_event(stream)
                if first and event.token_ids:
                    firsts.append((time.perf_counter() - start) * 1e3)
                    first = False
                if event.finish_reason is not None:
                    return

        sampling = SamplingParams(max_tokens=FLAGS.new_tokens, temperature=0)
        streams = [
            engine.submit(GenerationRequest(f"ft-{time.perf_counter_ns()}-{i}", tuple(p), sampling))
            for i, p in enumerate(prompts)
        ]
        await asyncio.gather(*(read(s) for s in streams))
        return statistics.median(firsts)

    return asyncio.run(serve())


def run() -> dict:
    from helios_jax.compilation_cache import enable_compilation_cache
    from helios_jax.model.default import load_default_model
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    enable_compilation_cache()
    model = load_default_model("float32")
    concurrencies = [int(c) for c in FLAGS.concurrency]
    windows = prompt_windows(model.tokenizer, max(concurrencies), FLAGS.prompt_tokens, FLAGS.seed)
    prompts = [w["tokens"] for w in windows]
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=engine_bench_config(16, 512),
        model_name="helios-default",
    )
    decisions = DecisionTimes(engine.scheduler)
    ttft: dict[int, list[float]] = {c: [] for c in concurrencies}
    plans: dict[int, dict[str, list[float]]] = {c: {} for c in concurrencies}
    starts: dict[int, collections.Counter] = {c: collections.Counter() for c in concurrencies}
    try:
        for i in range(FLAGS.bursts + 3):
            for c in concurrencies:
                decisions.by_kind.clear()
                decisions.on = i >= 3
                before = dict(engine.executor.graph_counts)
                value = burst(engine, prompts[:c])
                if i >= 3:
                    for name, n in engine.executor.graph_counts.items():
                        if not name.startswith("decode") and n > before.get(name, 0):
                            starts[c][name] += n - before.get(name, 0)
                    ttft[c].append(value)
                    for kind, times in decisions.by_kind.items():
                        plans[c].setdefault(kind, []).extend(times)
    finally:
        engine.shutdown()
    cases = []
    for c in concurrencies:
        cases.append(
            dict(
                concurrency=c,
                ttft_p50=round(percentile(ttft[c], 50), 3),
                ttft_p90=round(percentile(ttft[c], 90), 3),
                decision_ms={k: round(statistics.median(v), 4) for k, v in sorted(plans[c].items())},
                programs_per_burst={k: round(n / FLAGS.bursts, 2) for k, n in sorted(starts[c].items())},
            )
        )
        print(cases[-1], flush=True)
    figures = dict(bursts=FLAGS.bursts, new_tokens=FLAGS.new_tokens, prompt_tokens=FLAGS.prompt_tokens)
    return dict(cases=cases, **figures)


if __name__ == "__main__":
    run_main(run)
