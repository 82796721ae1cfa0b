"""Compile time and decode step time of one prepared decode program per tensor-parallel degree.

    python scripts/bench/tensor_parallel.py [--model=default|kv4] [--degrees=1,2] [--lanes=4]
        [--steps=20] [--devices=8] [--json_out=FILE]

Sets XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES before jax starts, so on a CPU
the mesh's devices are host "devices" sharing the same cores: the figures show what sharding
costs in compilation and in collectives there, as context, not a speedup (docs/distributed.md).
On a GPU host the real devices are used and --devices is ignored.

Models: `default` is the embedded model in float32 (6 heads, 2 KV heads: degrees 1 and 2);
`kv4` a seeded random tiny config with 8 heads and 4 KV heads (degrees 1, 2 and 4). For each
degree it builds the speculation-off catalog's decode program at --lanes lanes, compiles it
ahead of time (timed), prefills --lanes prompts of 16 tokens and times --steps decode steps
(each waited for), reporting the median.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

flags.DEFINE_enum("model", "default", ["default", "kv4"], "model to shard")
flags.DEFINE_list("degrees", ["1", "2"], "tensor-parallel degrees")
flags.DEFINE_integer("lanes", 4, "request lanes of the decode program")
flags.DEFINE_integer("steps", 20, "timed decode steps")
flags.DEFINE_integer("devices", 8, "forced host devices on a CPU")
flags.DEFINE_string("json_out", None, "write the figures here as JSON")
FLAGS = flags.FLAGS


def _model():
    from helios_jax.model import init_params, tiny_config
    from helios_jax.model.default import load_default_model

    if FLAGS.model == "default":
        loaded = load_default_model(dtype="float32")
        return loaded.config, loaded.params
    config = tiny_config(num_heads=8, num_kv_heads=4, mtp_num_layers=1)
    import jax

    return config, init_params(config, jax.random.key(0))


def _measure(config, params, degree: int) -> dict:
    import time

    import jax
    import numpy as np

    from helios_jax.catalog import GraphKind
    from helios_jax.engine_config import EngineConfig
    from helios_jax.programs import build_programs

    lanes = FLAGS.lanes
    engine = EngineConfig(
        request_slots=lanes,
        prefill_chunks=(16,),
        speculation="off",
        draft_tokens=0,
        max_model_len=256,
        page_size=16,
        snapshot_rows=0,
        tensor_parallel=degree,
    )
    programs = build_programs(config, params, engine, engine.catalog())
    params = programs.place_params(params)
    decode = programs.find(GraphKind.DECODE, batch_capacity=lanes)
    start = time.perf_counter()
    decode.compile(programs.params_spec, programs.state_spec)
    compile_s = time.perf_counter() - start
    state = programs.init_state()
    init = programs.find(GraphKind.INITIALIZE, batch_capacity=lanes)
    host = dict(temperature=[0.0] * lanes, top_p=[1.0] * lanes, top_k=[0] * lanes, seeds=list(range(lanes)))
    state, _ = init(params, state, init.pack(slots=list(range(lanes)), **host))
    prefill = programs.find(GraphKind.PREFILL, batch_capacity=1, token_capacity=16)
    n = engine.pages_per_row
    tables = [list(range(s * n, (s + 1) * n)) for s in range(lanes)]
    for slot in range(lanes):
        inputs = prefill.pack(slot=slot, tokens=list(range(1, 17)), page_table=tables[slot], prompt_ends=True)
        state, _ = prefill(params, state, inputs)
    inputs = decode.pack(slots=list(range(lanes)), page_tables=tables)
    times, tokens = [], []
    for _ in range(FLAGS.steps + 2):
        start = time.perf_counter()
        state, out = decode(params, state, inputs)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        tokens.append(np.asarray(out.tokens)[:, 0].tolist())
    return dict(
        degree=degree,
        compile_s=round(compile_s, 2),
        decode_step_ms_median=round(1000 * float(np.median(times[2:])), 2),
        tokens=tokens,
    )


def main(argv) -> None:
    del argv
    import json

    import jax

    config, params = _model()
    results = [_measure(config, params, int(d)) for d in FLAGS.degrees]
    for r in results:
        print(
            f"{FLAGS.model} tp={r['degree']}: compile {r['compile_s']:.2f} s, "
            f"decode step {r['decode_step_ms_median']:.2f} ms (median of {FLAGS.steps}, {FLAGS.lanes} lanes)"
        )
    same = all(r["tokens"] == results[0]["tokens"] for r in results)
    print(f"greedy tokens identical across degrees: {same}; backend {jax.default_backend()}")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(model=FLAGS.model, lanes=FLAGS.lanes, results=results), f)


def _force_devices(argv) -> None:
    count = next((a.split("=", 1)[1] for a in argv if a.startswith("--devices=")), "8")
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


if __name__ == "__main__":
    _force_devices(sys.argv)
    app.run(main)
