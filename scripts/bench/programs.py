"""Compile and execution time of every prepared program kind on this machine.

    python scripts/bench/programs.py [--concurrency=4] [--prefill_chunks=64,128] [--draft_tokens=3]
        [--speculative_token_capacity=16] [--speculation=adaptive] [--mixed_prefill=true]
        [--max_model_len=256] [--page_size=16] [--runs=10] [--model=FOLDER] [--use_cache]
        [--json_out=FILE]

Plans the catalog with `EngineConfig.catalog`, compiles every program ahead of time with the
persistent compilation cache disabled (cold compile times; --use_cache to reuse it), then times
each program with `helios_jax.prepare.measure` (median of --runs executions after one warm-up,
dispatch to block_until_ready, full occupancy: every lane active). The default model is the
tiny random one (2 layers, hidden 32, vocab 256, one MTP block), so the numbers measure the
programs' structure and dispatch overhead, not a real model's arithmetic. Prints a table and,
with --json_out, writes {"engine", "model", "machine", "programs": [...], "by_kind": {...}}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys

import jax
from absl import app, flags

from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.engine_config import SPECULATION_MODES, EngineConfig, parse_int_list
from helios_jax.prepare import load_engine_model, prepare, random_model

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "checkpoint folder (default: the tiny random model)")
flags.DEFINE_integer("concurrency", 4, "request slots")
flags.DEFINE_list("prefill_chunks", ["64", "128"], "prefill chunk sizes")
flags.DEFINE_enum("speculation", "adaptive", list(SPECULATION_MODES), "speculation mode")
flags.DEFINE_integer("draft_tokens", 3, "proposal depth D")
flags.DEFINE_integer("speculative_token_capacity", 16, "R")
flags.DEFINE_bool("mixed_prefill", True, "capture mixed graphs")
flags.DEFINE_integer("max_model_len", 256, "context length")
flags.DEFINE_integer("page_size", 16, "tokens per page")
flags.DEFINE_integer("runs", 10, "timed executions per program")
flags.DEFINE_bool("use_cache", False, "use the persistent compilation cache (warm compile times)")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def engine_from_flags() -> EngineConfig:
    speculative = FLAGS.speculation != "off"
    return EngineConfig(
        request_slots=FLAGS.concurrency,
        prefill_chunks=parse_int_list(FLAGS.prefill_chunks),
        speculation=FLAGS.speculation,
        draft_tokens=FLAGS.draft_tokens if speculative else 0,
        speculative_token_capacity=FLAGS.speculative_token_capacity,
        mixed_prefill=FLAGS.mixed_prefill,
        max_model_len=FLAGS.max_model_len,
        page_size=FLAGS.page_size,
    )


def run() -> dict:
    enable_compilation_cache(None if FLAGS.use_cache else "")  # "": disabled, cold compile times
    engine = engine_from_flags()
    if FLAGS.model:
        model = load_engine_model(FLAGS.model, dtype="float32")
        config, params = model.config, model.params
    else:
        config, params = random_model()
    prepared = prepare(config, params, engine, name="bench", do_measure=True, runs=FLAGS.runs, progress=None)
    rows = []
    for program in prepared.programs.values():
        g = program.descriptor
        measured = next(x for x in prepared.catalog.graphs if x.key == g.key)
        rows.append(
            dict(
                name=program.name,
                kind=g.kind.value,
                batch=g.batch_capacity,
                width=g.token_capacity,
                depth=g.proposal_depth,
                target=g.target_capacity,
                prompt=g.prefill_capacity,
                allocation=g.allocation.value if g.allocation else None,
                compile_s=round(program.compile_seconds, 3),
                execute_ms=measured.duration_ms,
            )
        )
    by_kind = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        by_kind[kind] = dict(
            programs=len(mine),
            compile_s_total=round(sum(r["compile_s"] for r in mine), 2),
            compile_s_median=round(statistics.median(r["compile_s"] for r in mine), 3),
            execute_ms_median=round(statistics.median(r["execute_ms"] for r in mine), 3),
            execute_ms_max=round(max(r["execute_ms"] for r in mine), 3),
        )
    return dict(
        engine={k: v for k, v in dataclasses.asdict(engine).items()},
        model=dict(
            folder=FLAGS.model,
            layers=config.num_layers,
            hidden=config.hidden_size,
            vocab=config.vocab_size,
            mtp_layers=config.mtp_num_layers,
            dtype=config.dtype,
        ),
        machine=dict(
            backend=jax.default_backend(),
            devices=[str(d) for d in jax.devices()],
            cpus=os.cpu_count(),
            python=platform.python_version(),
            jax=jax.__version__,
        ),
        compile_cache=FLAGS.use_cache,
        headroom=dataclasses.asdict(prepared.headroom),
        programs=rows,
        by_kind=by_kind,
    )


def main(argv) -> int:
    del argv
    result = run()
    print(f"{'program':44s} {'compile s':>10s} {'execute ms':>11s}")
    for r in result["programs"]:
        print(f"{r['name']:44s} {r['compile_s']:10.2f} {r['execute_ms']:11.3f}")
    print()
    print(
        f"{'kind':16s} {'n':>3s} {'compile s (sum)':>16s} {'compile s (median)':>19s} "
        f"{'execute ms (median)':>20s}"
    )
    for kind, k in result["by_kind"].items():
        print(
            f"{kind:16s} {k['programs']:3d} {k['compile_s_total']:16.2f} {k['compile_s_median']:19.3f} "
            f"{k['execute_ms_median']:20.3f}"
        )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
