"""The engine on fused projections against the same engine on separate ones, in one process.

    python scripts/bench/fused_engine.py [--concurrency=1,16] [--repeats=5] [--new_tokens=128]
        [--json_out=FILE]

Builds the engine `engine.py` serves (`bench_common.engine_bench_config`: 16 request slots, the
default model in float32, decode programs of 1, 4 and 8 steps) twice: as `prepare` builds it
(q/k/v and gate/up fused, `model/fused.py`) and with `prepare(..., fused_projections=False)`.
For each concurrency c, each engine serves c greedy 128-token requests on engine.py's prompts
(64-token windows of held-out text) once untimed, then --repeats times, the two engines
alternating and their order swapped every repeat; one reader thread per stream. Prints each
side's median output tokens per second and fused / separate, and fails unless both engines
emit the same tokens.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import threading
import time

from absl import app, flags
from bench_common import engine_bench_config, prompt_windows

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_list("concurrency", ["1", "16"], "concurrent requests")
flags.DEFINE_integer("repeats", 5, "timed runs per engine and concurrency")
flags.DEFINE_integer("new_tokens", 128, "new tokens per request")
flags.DEFINE_enum("build_first", "fused", ["fused", "separate"], "which engine is built (and served) first")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def serve(engine, prompts) -> tuple[float, list[list[int]]]:
    """(wall seconds, tokens per request) of one burst."""
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    outs: list[list[int]] = [[] for _ in prompts]
    start = time.perf_counter()
    streams = [
        engine.submit(
            GenerationRequest(
                f"fe-{time.perf_counter_ns()}-{i}",
                tuple(p),
                SamplingParams(max_tokens=FLAGS.new_tokens, temperature=0.0),
            )
        )
        for i, p in enumerate(prompts)
    ]

    def read(i, stream):
        for event in stream:
            if event.finish_reason == "error":
                raise RuntimeError(event.error)
            outs[i].extend(event.token_ids)

    readers = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(streams)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    return time.perf_counter() - start, outs


def build(model, fused: bool):
    from helios_jax.prepare import prepare, warm_up
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    ec = engine_bench_config(16, 512, decode_steps=(1, 4, 8))
    prepared = prepare(
        model.config, model.params, ec, name="helios-default", fused_projections=fused, progress=None
    )
    warm_up(prepared.programs, prepared.params)
    return HeliosEngine(
        model_config=model.config,
        params=prepared.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=ec,
        programs=prepared.programs,
        model_name="helios-default",
    )


def main(argv):
    del argv
    enable_compilation_cache()
    from helios_jax.prepare import load_engine_model

    model = load_engine_model(None, dtype="float32")
    order = ["fused", "separate"] if FLAGS.build_first == "fused" else ["separate", "fused"]
    engines = {name: build(model, name == "fused") for name in order}
    prompts = [w["tokens"] for w in prompt_windows(model.tokenizer, 32, 64, 0)]
    results = {}
    try:
        for c in (int(x) for x in FLAGS.concurrency):
            burst = prompts[:c]
            tokens = {name: serve(e, burst)[1] for name, e in engines.items()}  # untimed
            if tokens["fused"] != tokens["separate"]:
                raise AssertionError(f"c={c}: the engines emitted different tokens")
            rates: dict[str, list[float]] = {name: [] for name in engines}
            frames: dict[str, collections.Counter] = {name: collections.Counter() for name in engines}
            for r in range(FLAGS.repeats):
                for name in list(engines)[:: 1 if r % 2 == 0 else -1]:
                    history = engines[name].executor.history
                    history.clear()
                    wall, outs = serve(engines[name], burst)
                    rates[name].append(sum(map(len, outs)) / wall)
                    frames[name].update(graph.name for graph, _ in history)
            med = {name: statistics.median(v) for name, v in rates.items()}
            per_repeat = [round(f / s, 3) for f, s in zip(rates["fused"], rates["separate"])]
            results[c] = dict(
                fused_tokens_per_s=round(med["fused"], 1),
                separate_tokens_per_s=round(med["separate"], 1),
                fused_over_separate=round(med["fused"] / med["separate"], 3),
                per_repeat=per_repeat,
                frames={name: dict(counts) for name, counts in frames.items()},
            )
            print(
                f"c={c:2d} fused {med['fused']:7.0f} tok/s separate {med['separate']:7.0f} tok/s "
                f"fused/separate {med['fused'] / med['separate']:.3f} (per repeat {per_repeat})",
                flush=True,
            )
            for name, counts in frames.items():  # the programs each engine ran, over its repeats
                print(f"      {name:8s} frames: " + ", ".join(f"{g} x{n}" for g, n in counts.most_common(6)))
    finally:
        for e in engines.values():
            e.shutdown()
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(results=results, argv=sys.argv), f, indent=1)


if __name__ == "__main__":
    app.run(main)
