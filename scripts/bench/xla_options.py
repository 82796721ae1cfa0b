"""One decode program compiled under several sets of XLA compiler options, run interleaved.

    python scripts/bench/xla_options.py [--batch=16] [--steps=1] [--runs=30] [--context=128]
        [--options=NAME=JSON;NAME=JSON...] [--json_out=FILE]

XLA's CPU compiler takes its debug options per compilation (``Lowered.compile(compiler_options=)``),
so every variant is compiled in this one process from the same lowering of the embedded default
model's decode program (float32, `program_variants.bench_engine`) and timed by
`program_variants.interleave` from the same cursors; every variant must emit the base variant's
tokens. The first variant (``base``: no options) is the baseline. The default set covers the
choices this jaxlib offers for the products and fusions: YNNPACK (its default for dots) switched
off, XNNPACK and oneDNN fusions, XNNPACK graph fusion, the concurrency-optimised scheduler, the
preferred vector width and the fusion emitters.
"""

from __future__ import annotations

import json

import numpy as np
from absl import flags
from program_variants import bench_engine, interleave, run_main

from helios_jax.catalog import GraphKind
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

flags.DEFINE_integer("batch", 16, "lanes (request slots)")
flags.DEFINE_integer("steps", 1, "decode steps K of the program")
flags.DEFINE_integer("runs", 30, "timed executions per variant")
flags.DEFINE_integer("context", 128, "decode cursor")
flags.DEFINE_string("options", None, "NAME=JSON;... variants (default: the module's set; base first)")
flags.DEFINE_string("json_out", None, "write the figures as JSON here")
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
    engine = bench_engine(FLAGS.batch, False, decode_steps=(FLAGS.steps,))
    variants, refused = {}, {}
    for name, options in option_sets().items():
        programs = build_programs(model.config, model.params, engine, engine.catalog())
        program = next(
            p
            for p in programs.values()
            if p.descriptor.kind is GraphKind.DECODE
            and p.shape.lanes == FLAGS.batch
            and p.shape.steps == FLAGS.steps
        )
        try:
            lowered = program.lower(programs.params_spec, programs.state_spec)
            program.compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # an option this jaxlib does not know: reported, not timed
            refused[name] = str(e)[:200]
            continue
        variants[name] = (programs, program)
    medians, outs = interleave(
        variants, model.params, engine, runs=FLAGS.runs, context=FLAGS.context, row_state=lambda n, s: s
    )
    base_tokens = np.asarray(outs["base"].tokens)
    for name in variants:
        if not np.array_equal(np.asarray(outs[name].tokens), base_tokens):
            raise AssertionError(f"{name} emitted other tokens than base")
    return dict(
        program=variants["base"][1].name,
        options={name: option_sets()[name] for name in variants},
        median_ms={name: round(ms, 4) for name, ms in medians.items()},
        over_base={name: round(ms / medians["base"], 4) for name, ms in medians.items()},
        refused=refused,
    )


if __name__ == "__main__":
    run_main(run)
