"""One decode program compiled under several sets of XLA compiler options, run interleaved.

    python scripts/bench/xla_options.py [--batch=16] [--speculative] [--steps=1] [--runs=40]
        [--context=64] [--options=NAME=JSON;NAME=JSON...] [--json_out=FILE]

XLA's CPU compiler takes its debug options per compilation (``Lowered.compile(compiler_options=)``),
so every variant is compiled in this one process from one lowering of the embedded default
model's decode program, or with --speculative its widest speculative one (float32,
`program_variants.bench_engine` and `timed_program`), and timed by
`program_variants.interleave` from the same cursors; every variant must emit the base variant's
tokens. The first variant (``base``: no options) is the baseline. The default set covers the
choices this jaxlib offers for the products and fusions: YNNPACK (its default for dots) switched
off, XNNPACK and oneDNN fusions, XNNPACK graph fusion, the concurrency-optimised scheduler, the
preferred vector width and the fusion emitters.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from absl import flags
from program_variants import bench_engine, define_flags, interleave, run_main, timed_program

from helios_jax.prepare import load_engine_model
from helios_jax.programs import build_programs

DEFAULT_OPTIONS = {
    "base": {},
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "xnn_dot": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "xnn_eltwise": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_ELTWISE"},
    "onednn_dot": {"xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "xnn_graph": {"xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY"},
    "concurrency_scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    "vector_512": {"xla_cpu_prefer_vector_width": 512},
    "no_fusion_emitters": {"xla_cpu_use_fusion_emitters": False},
}

define_flags()
flags.DEFINE_integer("steps", 1, "steps K of the program")
flags.DEFINE_string("options", None, "NAME=JSON;... variants (default: the module's set; base first)")
FLAGS = flags.FLAGS


def option_sets() -> dict[str, dict]:
    if not FLAGS.options:
        return DEFAULT_OPTIONS
    out = {"base": {}}
    for item in FLAGS.options.split(";"):
        name, _, value = item.partition("=")
        out[name.strip()] = json.loads(value)
    return out


def run() -> dict:
    model = load_engine_model(None, dtype="float32")
    engine = bench_engine(FLAGS.batch, FLAGS.speculative, decode_steps=(FLAGS.steps,))
    programs = build_programs(model.config, model.params, engine, engine.catalog())
    program = timed_program(programs, engine, speculative=FLAGS.speculative, steps=FLAGS.steps)
    lowered = program.lower(programs.params_spec, programs.state_spec)
    sets = option_sets()
    variants, refused = {}, {}
    for name, options in sets.items():
        try:
            compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # an option this jaxlib does not know: reported, not timed
            refused[name] = str(e)[:200]
            continue
        variants[name] = (programs, dataclasses.replace(program, compiled=compiled))
    medians, outs = interleave(
        variants, model.params, engine, runs=FLAGS.runs, context=FLAGS.context, row_state=lambda n, s: s
    )
    base_tokens = np.asarray(outs["base"].tokens)
    for name in variants:
        if not np.array_equal(np.asarray(outs[name].tokens), base_tokens):
            raise AssertionError(f"{name} emitted other tokens than base")
    return dict(
        program=program.name,
        options={name: sets[name] for name in variants},
        median_ms={name: round(ms, 4) for name, ms in medians.items()},
        over_base={name: round(ms / medians["base"], 4) for name, ms in medians.items()},
        refused=refused,
    )


if __name__ == "__main__":
    run_main(run)
