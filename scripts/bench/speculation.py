"""Speculative decoding on the embedded default model: off, fixed and adaptive, in one process.

    python scripts/bench/speculation.py [--modes=off,fixed,adaptive] [--concurrency=1,16]
        [--draft_tokens=3] [--prompt_tokens=64] [--new_tokens=128] [--requests_at_one=2]
        [--repeats=3] [--dtype=float32] [--max_model_len=512] [--policy=balanced] [--seed=0]
        [--decode_steps=1,4,8] [--readers=loop] [--prefill_batch=1,4,16] [--measure_runs=5]
        [--json_out=FILE] [--plot_dir=DIR]

One `HeliosEngine` per mode (16 request slots, the same catalog planning the server uses, its
prefill rows included, the persistent compilation cache on), all alive at once. The streams are
read as the HTTP server reads them, all on one asyncio loop with its `next_event`
(`--readers=threads`: a thread per stream, this script's reading before 2026-12-05; sixteen
reader threads woken at every frame take the two cores from the program, see
docs/benchmarks-engine.md, twentieth stop). Prompts are --prompt_tokens-token windows of
the held-out standard-library files (training_info.json), greedy, --new_tokens new tokens each.
At concurrency 1 the engine serves --requests_at_one requests one after another; at concurrency
16 it serves 16 submitted at once. Modes are interleaved within every repeat (their order
alternates), and speedups are taken per repeat against `off` at the same concurrency (against
`off#N` for a mode measured with `#N` when both run), then summarised by their median.

Measured per run, from the engine's own counters (deltas over the run):
  - tokens per target forward: output tokens after the first (which prefill emits) divided by
    decode lane-rounds (one per request per frame, counted from the stream's events);
  - acceptance per draft position k from `scheduler.accepted_by_position` /
    `scheduler.offered_by_position` (the fraction of rounds that offered position k whose first
    k drafts were all accepted), the conditional acceptance alpha_k = reached_k / reached_{k-1},
    the pooled alpha = sum_k accepted_k / sum_k accepted_{k-1} (the estimate of a constant
    per-position acceptance), and the prediction (1 - alpha^(gamma+1)) / (1 - alpha) for
    gamma drafts against the measured 1 + sum_k reached_k;
  - what the adaptive selector chose: `scheduler.selections`, `executor.graph_counts`,
    `scheduler.speculative`, and the plans of the scheduler's trace by (program, reason), with
    the lanes they served; the mean device time of each program as the executor measured it and
    the scheduler's current duration estimates.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
from absl import app, flags
from bench_common import DEFAULT_CACHE_DIR, machine, percentile, prompt_windows

from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.engine_options import MEASURE_RUNS_DEFAULT

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "modes",
    ["off", "fixed", "adaptive"],
    "speculation modes; 'MODE@K+K' gives one its own step counts (adaptive@1 beside --decode_steps=1,4,8)",
)
flags.DEFINE_list("concurrency", ["1", "16"], "concurrent requests")
flags.DEFINE_integer("draft_tokens", 3, "gamma: drafts per speculative round (the catalog's depth)")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt")
flags.DEFINE_integer("new_tokens", 128, "new tokens per request")
flags.DEFINE_integer("requests_at_one", 2, "requests served one after another per run at concurrency 1")
flags.DEFINE_integer("repeats", 3, "interleaved repeats")
flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16"], "compute dtype (the same bf16-rounded weights)"
)
flags.DEFINE_integer("max_model_len", 512, "engine context length (the CPU attention window)")
flags.DEFINE_enum("policy", "balanced", ["balanced", "throughput"], "scheduler policy preset of every engine")
flags.DEFINE_list(
    "decode_steps",
    ["1", "4", "8"],
    "step counts K of every mode's width-one programs (decode with speculation off, width-one "
    "speculative rounds otherwise); 1,4,8 is the server's default in every mode (1: the figures "
    "of docs/benchmarks-engine.md section 3, measured before K-step programs)",
)
flags.DEFINE_enum(
    "readers",
    "loop",
    ["loop", "threads"],
    "how the streams are read: all on one asyncio loop with the server's next_event (as the HTTP "
    "server reads them), or a thread per stream",
)
flags.DEFINE_list(
    "prefill_batch",
    None,
    "prompt rows B of every mode's prefill programs (1: one prompt each); unset: the server's "
    "default for 16 slots (engine_options.default_prefill_batch)",
)
flags.DEFINE_integer("seed", 0, "seed of the prompt windows")
flags.DEFINE_integer(
    "measure_runs",
    MEASURE_RUNS_DEFAULT,
    "timed runs of every program before serving, seeding its duration estimate (the server's "
    "--measure_runs default; 0: measured on first use); a mode may set its own after '#'",
)
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_string("plot_dir", None, "write PNG plots here (e.g. docs/img)")
flags.DEFINE_string(
    "compilation_cache_dir",
    DEFAULT_CACHE_DIR,
    "persistent compilation cache (the server's default); empty disables it",
)


def build(model, tokenizer, name: str):
    """The engine of one --modes entry: a speculation mode, optionally with its own step counts
    after an '@' ('adaptive@1' or 'adaptive@1+4+8'; otherwise --decode_steps) and its own
    start-up measurement runs after a '#' ('off#0', 'adaptive@1+4#5'; otherwise --measure_runs)."""
    from helios_jax.engine_config import EngineConfig
    from helios_jax.engine_options import default_prefill_batch
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    chunks = tuple(c for c in (64, 128) if c <= FLAGS.max_model_len and c >= FLAGS.prompt_tokens)[:1] or (
        FLAGS.max_model_len,
    )
    spec, _, runs = name.partition("#")
    mode, _, steps = spec.partition("@")
    steps = steps.split("+") if steps else FLAGS.decode_steps
    rows = [int(b) for b in FLAGS.prefill_batch] if FLAGS.prefill_batch else default_prefill_batch(16)
    ec = EngineConfig(
        request_slots=16,
        prefill_chunks=chunks,
        speculation=mode,
        draft_tokens=FLAGS.draft_tokens if mode != "off" else 0,
        max_model_len=FLAGS.max_model_len,
        dtype=FLAGS.dtype,
        decode_steps=tuple(int(k) for k in steps),
        prefill_batch=tuple(rows),
    )
    t = time.perf_counter()
    from helios_jax.scheduler.config import PolicyConfig

    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(tokenizer),
        engine_config=ec,
        policy_config=PolicyConfig.preset(FLAGS.policy),
        model_name="helios-default",
        measure_runs=int(runs) if runs else FLAGS.measure_runs,
    )
    return engine, ec, time.perf_counter() - t


def baseline(name: str, names: list[str]) -> str:
    """The `off` engine a mode is compared with: the one of the same start-up measurement
    ('adaptive#0' against 'off#0') where there is one, else 'off'."""
    runs = name.partition("#")[2]
    return f"off#{runs}" if runs and f"off#{runs}" in names else "off"


def counters(engine) -> dict:
    s, ex = engine.scheduler, engine.executor
    return dict(
        selections=collections.Counter(s.selections),
        speculative=collections.Counter(s.speculative),
        offered=collections.Counter(s.offered_by_position),
        accepted=collections.Counter(s.accepted_by_position),
        graph_counts=collections.Counter(ex.graph_counts),
        graph_ns=collections.Counter(ex.graph_ns),
        executions=collections.Counter(s.executions),
        last_fence=s.trace[-1].fence if s.trace else 0,
    )


def delta(after: dict, before: dict) -> dict:
    return {
        k: (after[k] - before[k]) if isinstance(after[k], collections.Counter) else after[k] for k in after
    }


def serve_requests(engine, prompts, new_tokens, concurrent: bool):
    """Runs the prompts (all at once, or one after another), the streams read as `--readers`
    says. Returns the wall time and per-request records."""
    records = [None] * len(prompts)
    read = _read_on_one_loop if FLAGS.readers == "loop" else _read_on_threads
    start = time.perf_counter()
    if concurrent:
        read(engine, list(enumerate(prompts)), new_tokens, records)
    else:
        for i, p in enumerate(prompts):
            read(engine, [(i, p)], new_tokens, records)
    return time.perf_counter() - start, records


def _request(i, prompt, new_tokens):
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    return GenerationRequest(
        f"spec-{time.perf_counter_ns()}-{i}",
        tuple(prompt),
        SamplingParams(max_tokens=new_tokens, temperature=0.0),
    )


class _Record:
    """One stream's tokens, token events and their arrival times."""

    def __init__(self, submitted: float):
        self.submitted, self.tokens, self.events, self.stamps = submitted, [], [], []

    def add(self, event) -> None:
        if event.finish_reason == "error":
            raise RuntimeError(event.error)
        if event.token_ids:
            self.stamps.append(time.perf_counter())
            self.events.append(len(event.token_ids))
            self.tokens.extend(event.token_ids)

    def result(self) -> dict:
        return dict(
            tokens=self.tokens,
            events=self.events,
            ttft_ms=(self.stamps[0] - self.submitted) * 1e3,
            gaps_ms=list(np.diff(self.stamps) * 1e3),
        )


def _read_on_one_loop(engine, prompts, new_tokens, records) -> None:
    """Every stream read on one asyncio loop with the server's `next_event`."""
    import asyncio

    from helios_jax.serve.events import next_event

    async def read(i, stream, record):
        while True:
            event = await next_event(stream)
            record.add(event)
            if event.finish_reason is not None:
                break
        records[i] = record.result()

    async def serve():
        readers = []
        for i, p in prompts:
            record = _Record(time.perf_counter())
            readers.append(read(i, engine.submit(_request(i, p, new_tokens)), record))
        await asyncio.gather(*readers)

    asyncio.run(serve())


def _read_on_threads(engine, prompts, new_tokens, records) -> None:
    """A thread per stream."""

    def consume(i, stream, record):
        for event in stream:
            record.add(event)
        records[i] = record.result()

    threads = []
    for i, p in prompts:
        record = _Record(time.perf_counter())
        stream = engine.submit(_request(i, p, new_tokens))
        t = threading.Thread(target=consume, args=(i, stream, record), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def acceptance(d: dict, gamma: int) -> dict:
    offered = [d["offered"][k] for k in range(1, gamma + 1)]
    accepted = [d["accepted"][k] for k in range(1, gamma + 1)]
    if not offered[0]:
        return dict(rounds_with_drafts=0)
    reached = [a / o if o else None for a, o in zip(accepted, offered)]
    conditional = []
    previous = 1.0
    for r in reached:
        conditional.append(r / previous if r is not None and previous else None)
        previous = r if r is not None else previous
    below = [offered[0]] + accepted[:-1]
    alpha = sum(accepted) / sum(below) if sum(below) else None
    predicted = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha is not None and alpha < 1 else gamma + 1
    measured = 1 + sum(r for r in reached if r is not None)
    return dict(
        rounds_with_drafts=offered[0],
        offered_by_position=offered,
        accepted_by_position=accepted,
        reached=reached,
        conditional=conditional,
        alpha=alpha,
        predicted_tokens_per_round=predicted,
        measured_tokens_per_round=measured,
    )


def trace_summary(engine, after_fence: int) -> dict:
    """Plans committed after `after_fence`: (program, reason) -> plans, lanes."""
    out = collections.defaultdict(lambda: [0, 0])
    for r in engine.scheduler.trace:
        if r.fence <= after_fence or r.kind.value not in ("speculative", "decode"):
            continue
        key = f"{r.kind.value}[B={r.batch_capacity},W={r.token_capacity}] {r.reason.value}"
        out[key][0] += 1
        out[key][1] += r.served
    return {k: dict(plans=v[0], lanes=v[1]) for k, v in sorted(out.items())}


def run_once(name, engine, prompts, c, gamma):
    before = counters(engine)
    wall, records = serve_requests(engine, prompts, FLAGS.new_tokens, concurrent=c > 1)
    d = delta(counters(engine), before)
    tokens = sum(len(r["tokens"]) for r in records)
    lane_rounds = sum(len(r["events"]) - 1 for r in records)
    return dict(
        mode=name,
        concurrency=c,
        wall_s=wall,
        output_tokens=tokens,
        tokens_per_s=tokens / wall,
        tokens_per_target_forward=(tokens - len(records)) / max(lane_rounds, 1),
        lane_rounds=lane_rounds,
        ttft_ms=[r["ttft_ms"] for r in records],
        gaps_ms=[g for r in records for g in r["gaps_ms"]],
        outputs=[r["tokens"] for r in records],
        acceptance=acceptance(d, gamma),
        selections=dict(d["selections"]),
        graph_counts={k: v for k, v in d["graph_counts"].items() if v},
        speculative=dict(d["speculative"]),
        executions={k: v for k, v in d["executions"].items() if v},
        plans=trace_summary(engine, before["last_fence"]),
    )


def program_costs(engine) -> dict:
    ex, s = engine.executor, engine.scheduler
    out = {}
    for name in sorted(ex.graph_counts):
        if not name.startswith(("decode", "speculative")):
            continue
        key = next((g.key for g in engine.catalog.graphs if g.name == name), None)
        est = s.costs.estimate_ms(key) if key is not None else None
        out[name] = dict(
            executions=ex.graph_counts[name],
            timed=ex.graph_timed[name],  # executions with a device interval (the mean's)
            device_ms_mean=ex.graph_ns[name] / 1e6 / ex.graph_timed[name] if ex.graph_timed[name] else None,
            scheduler_estimate_ms=est,
        )
    return out


def main(argv) -> int:
    del argv
    enable_compilation_cache(FLAGS.compilation_cache_dir)
    started = time.perf_counter()
    from helios_jax.model.default import load_default_model

    model = load_default_model(FLAGS.dtype)
    tokenizer = model.tokenizer
    gamma = FLAGS.draft_tokens
    concurrencies = [int(c) for c in FLAGS.concurrency]
    prompts = prompt_windows(tokenizer, 32, FLAGS.prompt_tokens, FLAGS.seed)
    token_lists = [p["tokens"] for p in prompts]
    results = dict(
        command=" ".join(sys.argv),
        machine=machine(),
        flags={
            k: FLAGS[k].value
            for k in (
                "modes",
                "concurrency",
                "draft_tokens",
                "prompt_tokens",
                "new_tokens",
                "requests_at_one",
                "repeats",
                "dtype",
                "max_model_len",
                "policy",
                "seed",
                "readers",
                "prefill_batch",
                "measure_runs",
            )
        },
        prompts=[dict(file=p["file"], offset=p["offset"]) for p in prompts],
    )
    engines, setup = {}, {}
    names = list(FLAGS.modes)
    for name in names:
        engine, ec, seconds = build(model, tokenizer, name)
        engines[name] = engine
        setup[name] = dict(
            build_and_compile_s=round(seconds, 1),
            programs=len(ec.catalog().graphs),
            engine_config=dataclasses.asdict(ec),
        )
        print(f"{name}: built in {seconds:.1f} s ({len(ec.catalog().graphs)} programs)", flush=True)
    results["setup"] = setup
    # Warm-up (untimed): allocators and the scheduler's first duration estimates / exploration.
    for engine in engines.values():
        for c in concurrencies:
            n = c if c > 1 else FLAGS.requests_at_one
            serve_requests(engine, token_lists[:n], FLAGS.new_tokens, concurrent=c > 1)
    print("warm", flush=True)
    runs = []
    for rep in range(FLAGS.repeats):
        for c in concurrencies:
            n = c if c > 1 else FLAGS.requests_at_one
            chosen = [token_lists[(rep * n + i) % len(token_lists)] for i in range(n)]
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                r = run_once(name, engines[name], chosen, c, gamma)
                r["repeat"] = rep
                runs.append(r)
                a = r["acceptance"]
                print(
                    f"rep {rep} c={c:2d} {name:16s} {r['tokens_per_s']:8.1f} tok/s  tokens/forward "
                    f"{r['tokens_per_target_forward']:.3f}  spec rounds {a.get('rounds_with_drafts', 0):5d}  "
                    f"graphs {r['graph_counts']}",
                    flush=True,
                )
    # Summaries.
    table = []
    for c in concurrencies:
        for name in names:
            base_mode = baseline(name, names)
            base = {r["repeat"]: r for r in runs if r["mode"] == base_mode and r["concurrency"] == c}
            mine = [r for r in runs if r["mode"] == name and r["concurrency"] == c]
            pooled = collections.Counter()
            for r in mine:
                a = r["acceptance"]
                if a.get("rounds_with_drafts"):
                    for k in range(gamma):
                        pooled[("o", k + 1)] += a["offered_by_position"][k]
                        pooled[("a", k + 1)] += a["accepted_by_position"][k]
            acc = acceptance(
                dict(
                    offered={k: pooled[("o", k)] for k in range(1, gamma + 1)},
                    accepted={k: pooled[("a", k)] for k in range(1, gamma + 1)},
                ),
                gamma,
            )
            row = dict(
                mode=name,
                concurrency=c,
                tokens_per_s=statistics.median(r["tokens_per_s"] for r in mine),
                tokens_per_target_forward=statistics.median(r["tokens_per_target_forward"] for r in mine),
                ttft_ms_p50=percentile([x for r in mine for x in r["ttft_ms"]], 50),
                gap_ms_p50=percentile([x for r in mine for x in r["gaps_ms"]], 50),
                gap_ms_p90=percentile([x for r in mine for x in r["gaps_ms"]], 90),
                acceptance=acc,
            )
            if base:
                sp = [
                    r["tokens_per_s"] / base[r["repeat"]]["tokens_per_s"] for r in mine if r["repeat"] in base
                ]
                row["speedup_vs_off"] = dict(median=statistics.median(sp), per_repeat=sp)
            plans = collections.Counter()
            lanes = collections.Counter()
            graphs = collections.Counter()
            for r in mine:
                graphs.update(r["graph_counts"])
                for k, v in r["plans"].items():
                    plans[k] += v["plans"]
                    lanes[k] += v["lanes"]
            row["graph_counts"] = dict(sorted(graphs.items()))
            row["plans"] = {k: dict(plans=plans[k], lanes=lanes[k]) for k in sorted(plans)}
            table.append(row)
    results["table"] = table
    # Greedy outputs should not depend on the mode (speculation preserves greedy decoding; float
    # differences between verification widths may flip near-ties).
    agreement = {}
    for name in names:
        same = total = 0
        for r in runs:
            if r["mode"] != name:
                continue
            ref = (
                next(
                    x
                    for x in runs
                    if x["mode"] == baseline(name, names)
                    and x["repeat"] == r["repeat"]
                    and x["concurrency"] == r["concurrency"]
                )
                if baseline(name, names) in names
                else None
            )
            if ref is None:
                continue
            for a, b in zip(r["outputs"], ref["outputs"]):
                same += a == b
                total += 1
        agreement[name] = dict(identical_to_off=same, of=total)
    results["greedy_agreement"] = agreement
    results["counters_at_end"] = {
        name: dict(
            selections=dict(e.scheduler.selections),
            speculative=dict(e.scheduler.speculative),
            graph_counts=dict(sorted(e.executor.graph_counts.items())),
            executions=dict(e.scheduler.executions),
        )
        for name, e in engines.items()
    }
    results["program_costs"] = {name: program_costs(e) for name, e in engines.items()}
    for r in runs:
        del r["outputs"]
    results["runs"] = runs
    for e in engines.values():
        e.shutdown()
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print_tables(results)
    if FLAGS.plot_dir:
        results["plots"] = plots(results, FLAGS.plot_dir)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(results, f, indent=1, default=float)
            f.write("\n")
    return 0


def print_tables(results):
    print()
    print(
        f"{'mode':16s} {'c':>3s} {'tok/s':>8s} {'speedup':>8s} {'tok/fwd':>8s} {'alpha':>6s} {'pred':>6s} "
        f"{'meas':>6s}  conditional acceptance"
    )
    for row in results["table"]:
        a = row["acceptance"]
        sp = row.get("speedup_vs_off", {}).get("median")
        print(
            f"{row['mode']:16s} {row['concurrency']:3d} {row['tokens_per_s']:8.1f} "
            f"{(f'{sp:.2f}x' if sp else '-'):>8s} {row['tokens_per_target_forward']:8.3f} "
            f"{(a.get('alpha') or 0):6.3f} {(a.get('predicted_tokens_per_round') or 0):6.3f} "
            f"{(a.get('measured_tokens_per_round') or 0):6.3f}  {a.get('conditional')}"
        )
    print()
    for name, costs in results["program_costs"].items():
        print(name)
        for prog, c in costs.items():
            est = c["scheduler_estimate_ms"]
            print(
                f"  {prog:44s} runs {c['executions']:6d} device {c['device_ms_mean'] or 0:8.2f} ms  "
                f"estimate {est if est is None else round(est, 2)}"
            )
    print(f"wall {results['wall_s']} s")


def plots(results, folder):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    table = results["table"]
    names = list(dict.fromkeys(r["mode"] for r in table))
    cs = sorted({r["concurrency"] for r in table})
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.2))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        rows = [next(r for r in table if r["mode"] == name and r["concurrency"] == c) for c in cs]
        xs = np.arange(len(cs)) + j * width
        axes[0].bar(xs, [r["tokens_per_s"] for r in rows], width, label=name)
        axes[1].bar(xs, [r["tokens_per_target_forward"] for r in rows], width, label=name)
    for ax, title in zip(axes, ("output tokens/s", "tokens per target forward")):
        ax.set_xticks(np.arange(len(cs)) + width * (len(names) - 1) / 2, [f"c={c}" for c in cs])
        ax.set_title(title, fontsize=10)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(
        folder, "speculation.png" if FLAGS.policy == "balanced" else f"speculation_{FLAGS.policy}.png"
    )
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [path]


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
