"""Mixed prefill/verification programs on and off, with prompts arriving while streams decode.

    python scripts/bench/mixed_prefill.py [--speculation=off,adaptive] [--streams=8]
        [--stream_prompt_tokens=32] [--stream_new_tokens=200] [--arrivals=8]
        [--arrival_prompt_tokens=192] [--arrival_new_tokens=32] [--arrival_gap_ms=100]
        [--repeats=2] [--compilation_cache_dir=] [--seed=0] [--json_out=FILE]

One engine per (speculation, mixed) setting, built as ``python -m helios_jax.serve`` builds it
(`EngineOptions(...).engine_config(model_config)` on the embedded default model, float32 on a
CPU) with `--concurrency` = streams + arrivals, all alive at once. Compilation is cold by default
(the persistent cache disabled), so the prepare cost of each setting is what a first start pays.

Workload per run: `--streams` greedy requests start together and decode; once every one has
its first token, `--arrivals` prompts of `--arrival_prompt_tokens` tokens are submitted
`--arrival_gap_ms` apart. Measured: time to first token of the arrivals, the gaps between the
running streams' deliveries while the arrivals are being admitted (from the first arrival's
submission to the last arrival's first token), per delivery and per token, the output tokens per
second of the whole run, and the programs each frame ran. Settings are interleaved within each
repeat (order alternated); ratios mixed / plain are taken per repeat and summarised by their
median. The greedy outputs of the two settings are compared token for token.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import sys
import threading
import time

import numpy as np
from absl import app, flags
from bench_common import machine, prompt_windows, summary

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_list("speculation", ["off", "adaptive"], "speculation modes (each measured mixed on and off)")
flags.DEFINE_integer("streams", 8, "requests decoding when the prompts arrive")
flags.DEFINE_integer("stream_prompt_tokens", 32, "prompt tokens of each running stream")
flags.DEFINE_integer("stream_new_tokens", 200, "new tokens of each running stream")
flags.DEFINE_integer("arrivals", 8, "prompts arriving while the streams decode")
flags.DEFINE_integer("arrival_prompt_tokens", 192, "prompt tokens of each arrival")
flags.DEFINE_integer("arrival_new_tokens", 32, "new tokens of each arrival")
flags.DEFINE_float("arrival_gap_ms", 100.0, "time between arrivals")
flags.DEFINE_integer("repeats", 2, "interleaved repeats")
flags.DEFINE_integer("seed", 0, "seed of the prompt windows")
flags.DEFINE_string("compilation_cache_dir", "", "persistent compilation cache; empty: cold compiles")
flags.DEFINE_string("json_out", None, "write the results as JSON here")

COMPILED = re.compile(r"\d+/\d+ (\S+) compiled in ([0-9.]+) s")


def build(model, speculation: str, mixed: bool) -> tuple[object, dict]:
    """The engine the server builds for these flags; its prepare cost from the progress lines."""
    from helios_jax.engine_options import MULTI_STEP_DEFAULT, EngineOptions
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    options = EngineOptions(
        concurrency=FLAGS.streams + FLAGS.arrivals,
        speculation=speculation,
        mixed_prefill=mixed,
        decode_steps=MULTI_STEP_DEFAULT if speculation == "off" else (1,),
    )
    compiled = {}

    def progress(line: str) -> None:
        m = COMPILED.search(line)
        if m:
            compiled[m.group(1)] = float(m.group(2))

    start = time.perf_counter()
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=options.engine_config(model.config),
        policy_config=options.policy_config(),
        model_name="helios-default",
        progress=progress,
    )
    mixed_s = sum(s for name, s in compiled.items() if name.startswith("mixed"))
    return engine, dict(
        programs=len(engine.catalog.graphs),
        mixed_programs=sum(1 for g in engine.catalog.graphs if g.name.startswith("mixed")),
        compile_s=round(sum(compiled.values()), 2),
        mixed_compile_s=round(mixed_s, 2),
        build_s=round(time.perf_counter() - start, 2),
    )


def consume(stream, submitted: float, record: dict) -> None:
    """Reads one request's stream: (stamp, token count) per delivery, the tokens."""
    for event in stream:
        if event.finish_reason == "error":
            record["error"] = event.error
            return
        if event.token_ids:
            record["stamps"].append((time.perf_counter(), len(event.token_ids)))
            record["tokens"].extend(event.token_ids)
    record["submitted"] = submitted


def submit(engine, prompt, new_tokens: int, tag: str) -> tuple[threading.Thread, dict]:
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0)
    request = GenerationRequest(f"{tag}-{time.perf_counter_ns()}", tuple(prompt), params)
    record = dict(stamps=[], tokens=[])
    now = time.perf_counter()
    thread = threading.Thread(target=consume, args=(engine.submit(request), now, record), daemon=True)
    thread.start()
    return thread, record


def wait_first_tokens(records, timeout_s: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while any(not r["stamps"] and "error" not in r for r in records):
        if time.perf_counter() > deadline:
            raise TimeoutError("the running streams produced no first token")
        time.sleep(0.001)


def run_once(engine, streams, arrivals) -> dict:
    """One run of the workload; the raw records and the counters' deltas."""
    before = collections.Counter(engine.executor.graph_counts)
    start = time.perf_counter()
    running = [submit(engine, p, FLAGS.stream_new_tokens, "stream") for p in streams]
    wait_first_tokens([r for _, r in running])
    arriving = []
    for i, p in enumerate(arrivals):
        if i:
            time.sleep(FLAGS.arrival_gap_ms / 1e3)
        arriving.append(submit(engine, p, FLAGS.arrival_new_tokens, "arrival"))
    for thread, _ in running + arriving:
        thread.join()
    wall = time.perf_counter() - start
    records = [r for _, r in running + arriving]
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        raise RuntimeError(errors[0])
    counts = collections.Counter(engine.executor.graph_counts) - before
    return dict(
        wall=wall,
        streams=[r for _, r in running],
        arrivals=[r for _, r in arriving],
        graph_counts=dict(sorted(counts.items())),
    )


def measures(raw: dict) -> dict:
    """TTFT of the arrivals, the streams' delivery gaps inside the arrival window, throughput."""
    arrivals, streams = raw["arrivals"], raw["streams"]
    ttft = [(r["stamps"][0][0] - r["submitted"]) * 1e3 for r in arrivals]
    window = (min(r["submitted"] for r in arrivals), max(r["stamps"][0][0] for r in arrivals))
    gaps, per_token = [], []
    for r in streams:
        for (t0, _), (t1, n) in zip(r["stamps"], r["stamps"][1:]):
            if window[0] <= t1 <= window[1]:
                gaps.append((t1 - t0) * 1e3)
                per_token.append((t1 - t0) * 1e3 / n)
    tokens = sum(len(r["tokens"]) for r in streams + arrivals)
    mixed_frames = sum(n for name, n in raw["graph_counts"].items() if name.startswith("mixed"))
    return dict(
        wall_s=raw["wall"],
        tokens_per_s=tokens / raw["wall"],
        arrival_ttft_ms=summary(ttft),
        stream_gap_ms=summary(gaps),
        stream_per_token_ms=summary(per_token),
        window_ms=(window[1] - window[0]) * 1e3,
        mixed_frames=mixed_frames,
        graph_counts=raw["graph_counts"],
    )


RATIO_KEYS = (
    ("tokens_per_s", None),
    ("arrival_ttft_ms", "p50"),
    ("arrival_ttft_ms", "p99"),
    ("stream_gap_ms", "p50"),
    ("stream_gap_ms", "p99"),
    ("stream_per_token_ms", "p50"),
    ("stream_per_token_ms", "p99"),
    ("window_ms", None),
)


def value(m: dict, key: str, q: str | None) -> float:
    return m[key] if q is None else m[key][q]


def ratios(on: list[dict], off: list[dict]) -> dict:
    """mixed / plain per repeat, then the median and the range, for every figure."""
    out = {}
    for key, q in RATIO_KEYS:
        per = [value(a, key, q) / value(b, key, q) for a, b in zip(on, off)]
        out[f"{key}{'.' + q if q else ''}"] = dict(
            median=statistics.median(per), min=min(per), max=max(per), repeats=per
        )
    return out


def workload(model) -> tuple[list, list]:
    streams = prompt_windows(model.tokenizer, FLAGS.streams, FLAGS.stream_prompt_tokens, FLAGS.seed)
    arrivals = prompt_windows(model.tokenizer, FLAGS.arrivals, FLAGS.arrival_prompt_tokens, FLAGS.seed + 1)
    return [p["tokens"] for p in streams], [p["tokens"] for p in arrivals]


def measure_mode(model, speculation: str, streams, arrivals) -> dict:
    """Both settings of one speculation mode, interleaved over the repeats."""
    engines, prep = {}, {}
    for mixed in (False, True):
        engines[mixed], prep[mixed] = build(model, speculation, mixed)
        print(f"{speculation} mixed={mixed}: {prep[mixed]}", flush=True)
    runs = {False: [], True: []}
    outputs = {False: [], True: []}
    try:
        for repeat in range(FLAGS.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for mixed in order:
                raw = run_once(engines[mixed], streams, arrivals)
                outputs[mixed].append([r["tokens"] for r in raw["streams"] + raw["arrivals"]])
                runs[mixed].append(measures(raw))
                m = runs[mixed][-1]
                ttft, gap = m["arrival_ttft_ms"], m["stream_gap_ms"]
                print(
                    f"  repeat {repeat} mixed={mixed}: {m['tokens_per_s']:.0f} tok/s, arrival TTFT p50 "
                    f"{ttft['p50']:.1f} ms, stream gap p50/p99 {gap['p50']:.1f}/{gap['p99']:.1f} ms, "
                    f"mixed frames {m['mixed_frames']}",
                    flush=True,
                )
    finally:
        for engine in engines.values():
            engine.shutdown()
    same = sum(a == b for a, b in zip(outputs[False][0], outputs[True][0]))
    return dict(
        speculation=speculation,
        prepare={"plain": prep[False], "mixed": prep[True]},
        plain=runs[False],
        mixed=runs[True],
        mixed_over_plain=ratios(runs[True], runs[False]),
        identical_outputs=f"{same}/{len(outputs[False][0])}",
    )


def print_table(rows: list[dict]) -> None:
    print()
    for row in rows:
        plain, mixed = row["prepare"]["plain"], row["prepare"]["mixed"]
        print(
            f"speculation={row['speculation']}: programs {plain['programs']} -> {mixed['programs']}, "
            f"compile {plain['compile_s']} -> {mixed['compile_s']} s (mixed programs "
            f"{mixed['mixed_compile_s']} s); outputs identical {row['identical_outputs']}"
        )
        for name, r in row["mixed_over_plain"].items():
            reps = ", ".join(f"{x:.2f}" for x in r["repeats"])
            print(f"  mixed/plain {name:28s} {r['median']:.2f}x  (repeats {reps})")


def main(argv) -> int:
    del argv
    from helios_jax.prepare import load_engine_model

    enable_compilation_cache(FLAGS.compilation_cache_dir)
    model = load_engine_model(None)
    streams, arrivals = workload(model)
    results = dict(command=" ".join(sys.argv), machine=machine(), rows=[])
    for speculation in FLAGS.speculation:
        results["rows"].append(measure_mode(model, speculation, streams, arrivals))
        if FLAGS.json_out:  # after every mode, so that a long run keeps what it measured
            with open(FLAGS.json_out, "w") as f:
                json.dump(results, f, indent=1, default=float)
                f.write("\n")
    print_table(results["rows"])
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    app.run(lambda argv: sys.exit(main(argv)))
