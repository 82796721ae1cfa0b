"""Decode programs with q/k/v and gate/up fused (`model/fused.py`) against the separate products.

    python scripts/bench/fused_projections.py [--batch=16] [--steps=1,4] [--runs=40] [--context=128]
        [--json_out=FILE]

Compiles the decode program of the embedded default model (float32) at B = --batch, for each K
in --steps, twice: on the checkpoint's parameters (five products a block) and on the same
parameters fused as `prepare` fuses them (two). The variants run in rotated order from the same
cursors (`program_variants.interleave`) and must emit the same tokens. Prints the medians and
fused / separate per program.
"""

from __future__ import annotations

import jax
from absl import flags
from program_variants import bench_engine, compile_variant, define_flags, paired_medians, run_main

from helios_jax.model.fused import fuse_projections
from helios_jax.prepare import load_engine_model

define_flags()
flags.DEFINE_list("steps", ["1", "4"], "step counts K of the decode programs compared")
FLAGS = flags.FLAGS


def run() -> dict:
    model = load_engine_model(None, dtype="float32")
    fused_config, fused_params = fuse_projections(model.config, model.params)
    steps = tuple(int(k) for k in FLAGS.steps)
    engine = bench_engine(FLAGS.batch, False, decode_steps=steps)
    out = dict(batch=FLAGS.batch, runs=FLAGS.runs, backend=jax.default_backend(), programs={})
    for k in steps:
        variants = {
            "separate": compile_variant(engine, model.config, model.params, speculative=False, steps=k),
            "fused": compile_variant(engine, fused_config, fused_params, speculative=False, steps=k),
        }
        out["programs"][variants["fused"][1].name] = paired_medians(
            variants,
            model.params,
            engine,
            runs=FLAGS.runs,
            context=FLAGS.context,
            params_of={"fused": fused_params},
        )
    return out


if __name__ == "__main__":
    run_main(run)
