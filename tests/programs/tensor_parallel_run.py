"""Runs the tensor-parallel trace on one device and over a `tp` mesh, in a process of its own.

    python -m tests.programs.tensor_parallel_run CASE [CASE ...]

XLA_FLAGS=--xla_force_host_platform_device_count=4 must be in place before jax starts its CPU
backend, so the test suite (one device per process) runs this module as a subprocess. Cases:

    kv4          a seeded random tiny config with 8 heads and 4 KV heads, its q/k/v and gate/up
                 fused as prepared engines run them, at N = 2 and 4 against one single-device
                 trace (the default model's 6 heads do not split four ways, and KV heads are not
                 replicated); then the embedded default model's weights
                 loaded straight into their shards at N = 2 (`load_checkpoint(...,
                 tensor_parallel=2)`, as the server loads them), against the unsharded load:
                 layout and values (no program compiled)
    default-tp2  the embedded default model (6 heads, 2 KV heads; loaded as float32), N = 2: its
                 trained draft head gets proposals accepted, so multi-token rounds are compared
    kernels      the ragged paged attention kernel alone under `shard_attention_kernel`, XLA
                 path and Pallas in interpret mode, N = 2 and 4, against the unsharded call on
                 the kernel tests' adversarial case (shuffled pages, NaN padding), 4 KV heads
    engine-tp2   the whole engine (every catalog program compiled ahead of time, the scheduler,
                 the executor) over the default model at N = 1 and 2: three concurrent greedy
                 requests, text identical

For each model case it records `tensor_parallel_trace.record` with tensor_parallel 1 and each N,
asserts `compare`, and prints one JSON line per case: the largest float difference per degree,
the emitted tokens and counts, and the seconds each degree took (first-call compilation
included).
"""

from __future__ import annotations

import os

from ..environment import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(devices=4)  # before jax starts its CPU backend
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from helios_jax.model import tiny_config  # noqa: E402
from helios_jax.model.default import load_default_model  # noqa: E402
from helios_jax.model.fused import fuse_projections  # noqa: E402
from helios_jax.programs import build_programs  # noqa: E402

from .helpers import SPECULATIVE_ENGINE, random_params, speculative_catalog  # noqa: E402
from .tensor_parallel_trace import ROUNDS, compare, record  # noqa: E402


def _model(case: str):
    """(config, params, the degrees compared against one device)."""
    if case == "default-tp2":
        loaded = load_default_model(dtype="float32")
        return loaded.config, loaded.params, (2,)
    if case == "kv4":  # in the prepared programs' fused layout (`model/fused.py`), as engines run
        config = tiny_config(num_heads=8, num_kv_heads=4, mtp_num_layers=1)
        return (*fuse_projections(config, random_params(config, seed=0)), (2, 4))
    raise SystemExit(f"unknown case {case!r}")


def sharded_load(params, degree: int):
    """The default model loaded as the server loads it at `degree`: each tensor straight into its
    shards (`load_checkpoint(..., tensor_parallel=N)`); asserts the layout the programs are
    lowered for (`param_shardings`) and the values of the unsharded load `params`."""
    import jax
    import numpy as np

    from helios_jax.model.checkpoint import load_checkpoint
    from helios_jax.model.default import default_model_path
    from helios_jax.model.sharding import param_shardings, tensor_parallel_mesh

    if degree == 1:
        return params
    loaded = load_checkpoint(default_model_path(), dtype="float32", tensor_parallel=degree).params
    for have, want, sharding in zip(
        jax.tree_util.tree_leaves(loaded),
        jax.tree_util.tree_leaves(params),
        jax.tree_util.tree_leaves(param_shardings(tensor_parallel_mesh(degree), params)),
    ):
        assert have.sharding == sharding, (have.sharding, sharding)
        np.testing.assert_array_equal(np.asarray(have), np.asarray(want))
    return loaded


def run_kernels() -> dict:
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention
    from helios_jax.model.sharding import tensor_parallel_mesh
    from helios_jax.programs.impls import shard_attention_kernel

    from ..kernels.test_ragged_paged_attention import SCENARIOS, make_case

    q, k_pages, v_pages, *rows = make_case(SCENARIOS[5], 2, jnp.float32, seed=7, num_kv_heads=4)
    poison = jnp.full_like(k_pages, jnp.nan)
    k_stack, v_stack = jnp.stack([poison, k_pages]), jnp.stack([poison, v_pages])  # layer 1 is read
    diffs = {}
    for impl in ("xla", "pallas"):
        kernel = functools.partial(ragged_paged_attention, impl=impl, interpret=impl == "pallas")
        want = np.asarray(kernel(q, k_stack, v_stack, *rows, sm_scale=0.25, layer=1))
        for degree in (2, 4):
            sharded = shard_attention_kernel(kernel, tensor_parallel_mesh(degree))
            have = jax.jit(lambda *a, f=sharded: f(*a, sm_scale=0.25, layer=1))(q, k_stack, v_stack, *rows)
            np.testing.assert_allclose(np.asarray(have), want, rtol=0, atol=1e-6, err_msg=f"{impl} {degree}")
            diffs[f"{impl}-tp{degree}"] = float(np.max(np.abs(np.asarray(have) - want)))
    return dict(case="kernels", degree=4, max_diff=max(diffs.values()), diffs=diffs)


def run_engine() -> dict:
    from helios_jax.engine_config import EngineConfig
    from helios_jax.runtime.api import GenerationRequest, SamplingParams
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    loaded = load_default_model(dtype="float32")
    tokenizer = HFTokenizer.from_model(loaded)
    prompts = ["The quick brown fox", "def add(a, b):\n", "Once upon a time, there"]
    texts, seconds = {}, {}
    for tp in (1, 2):
        start = time.perf_counter()
        engine_config = EngineConfig(
            request_slots=4, prefill_chunks=(64,), max_model_len=256, snapshot_rows=1, tensor_parallel=tp
        )
        engine = HeliosEngine(
            model_config=loaded.config,
            params=loaded.params,
            tokenizer=tokenizer,
            engine_config=engine_config,
            progress=None,
        )
        try:
            streams = [
                engine.submit(
                    GenerationRequest(
                        f"r{i}", tuple(tokenizer.encode(p)), SamplingParams(max_tokens=24, temperature=0.0)
                    )
                )
                for i, p in enumerate(prompts)
            ]
            texts[tp] = [[t for e in s for t in e.token_ids] for s in streams]
        finally:
            engine.shutdown()
        seconds[tp] = round(time.perf_counter() - start, 2)
    assert texts[1] == texts[2], texts
    return dict(case="engine-tp2", degree=2, max_diff=0.0, tokens=texts[1], seconds=seconds)


def run(case: str) -> dict:
    if case == "kernels":
        return run_kernels()
    if case == "engine-tp2":
        return run_engine()
    config, params, degrees = _model(case)
    traces, seconds = {}, {}
    for tp in (1, *degrees):
        start = time.perf_counter()
        programs = build_programs(
            config, params, SPECULATIVE_ENGINE.replace(tensor_parallel=tp), speculative_catalog()
        )
        traces[tp] = record(programs, sharded_load(params, tp) if case == "default-tp2" else params)
        seconds[tp] = round(time.perf_counter() - start, 2)
    max_diff = {tp: max(compare(traces[1], traces[tp]).values()) for tp in degrees}
    tokens = [traces[1][f"round{i}.tokens"][:, :].tolist() for i in range(len(ROUNDS))]
    counts = [traces[1][f"round{i}.counts"].tolist() for i in range(len(ROUNDS))]
    result = dict(case=case, max_diff=max_diff, counts=counts, tokens=tokens, seconds=seconds)
    if case == "kv4":  # the server's sharded load of the default model, layout and values
        start = time.perf_counter()
        sharded_load(load_default_model(dtype="float32").params, 2)
        result["default_load_seconds"] = round(time.perf_counter() - start, 2)
    return result


if __name__ == "__main__":
    for case in sys.argv[1:]:
        print(json.dumps(run(case)), flush=True)
