"""Ragged paged attention at engine shapes: Pallas (split-KV by shape), Pallas without split and
XLA, their agreement and median times. One step of `scripts/gpu/check.sh`. Every variant is
compiled on threads before any is timed; the timings then run one after another.

    python scripts/gpu/attention_bench.py [--tiny] [--json_out=FILE]

--tiny runs one small shape with interpret-mode Pallas (the check's CPU dry run). Every shape
also reports the largest difference between each implementation and XLA; the run fails (exit 1)
when an output holds NaN or differs from XLA by more than the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.kernels.ragged_paged_attention import RaggedAttentionTiles, ragged_paged_attention

TOLERANCE = {"bfloat16": 5e-2, "float32": 1e-4}
DEFAULT_MODEL = dict(hq=6, hkv=2, d=32, ps=16, layers=4)
QWEN3_8B = dict(hq=32, hkv=8, d=128, ps=16, layers=4)
SHAPES = [  # name, model, query tokens per row, context, window
    ("default decode B=1 ctx 4096", DEFAULT_MODEL, [1], 4096, 4096),
    ("default decode B=16 ctx 4096", DEFAULT_MODEL, [1] * 16, 4096, 4096),
    ("default verify W=4 B=16 ctx 1024", DEFAULT_MODEL, [4] * 16, 1024, 4096),
    ("default prefill 2048", DEFAULT_MODEL, [2048], 2048, 4096),
    ("qwen3-8b decode B=1 ctx 4096", QWEN3_8B, [1], 4096, 4096),
    ("qwen3-8b decode B=16 ctx 4096", QWEN3_8B, [1] * 16, 4096, 4096),
    ("qwen3-8b prefill 2048", QWEN3_8B, [2048], 2048, 4096),
]
TINY = [("tiny decode and verify", dict(hq=6, hkv=2, d=32, ps=16, layers=2), [1, 5], 200, 256)]


def make_args(rng, model, q_lens, ctx, window, dtype):
    rows, pages_per_row = len(q_lens), -(-window // model["ps"])
    shape = (model["layers"], model["hkv"], rows * pages_per_row + 1, model["ps"], model["d"])
    k, v = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(2))
    tables = rng.permutation(rows * pages_per_row).reshape(rows, pages_per_row)  # shuffled pages
    starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
    q = jnp.asarray(rng.standard_normal((sum(q_lens), model["hq"], model["d"])), dtype)
    return (q, k, v, *(jnp.asarray(x, jnp.int32) for x in (tables, [ctx] * rows, starts, q_lens)))


def median_ms(f, args, runs):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def variants(interpret):
    no_split = dataclasses.replace(RaggedAttentionTiles(), pallas_kv_splits=1)
    return {
        "xla": dict(impl="xla"),
        "pallas": dict(impl="pallas", interpret=interpret),
        "pallas_no_split": dict(impl="pallas", interpret=interpret, tiles=no_split),
    }


def lowered_variants(args, model, interpret):
    """Each implementation's jitted call on `args`, lowered (tracing holds the interpreter lock:
    done here, on the caller's thread)."""
    out = {}
    for variant, kwargs in variants(interpret).items():
        f = jax.jit(
            lambda *a, kw=kwargs: ragged_paged_attention(
                *a, sm_scale=model["d"] ** -0.5, layer=model["layers"] - 1, **kw
            )
        )
        out[variant] = f.lower(*args)
    return out


def compile_timed(lowered):
    """(the compiled call, its compilation seconds), or (None, the error) when it fails."""
    start = time.perf_counter()
    try:
        return lowered.compile(), time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - reported, and the run fails below
        return None, f"{type(e).__name__}: {str(e)[:400]}"


def bench_shape(case, compiled, *, runs):
    """Time one shape's compiled implementations one after another and compare them to XLA."""
    name, dtype, args = case
    results, outputs = [], {}
    for variant, (call, compile_s) in compiled.items():
        row = dict(shape=name, dtype=dtype, impl=variant)
        if call is None:
            row["error"] = compile_s
            results.append(row)
            continue
        row["compile_s"] = compile_s
        try:
            start = time.perf_counter()
            outputs[variant] = np.asarray(jax.block_until_ready(call(*args)).astype(jnp.float32))
            row["first_call_s"] = time.perf_counter() - start
            row["median_ms"] = median_ms(call, args, runs)
        except Exception as e:  # noqa: BLE001 - reported, and the run fails below
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        results.append(row)
    for row in results:
        out = outputs.get(row["impl"])
        if out is not None and "xla" in outputs:
            row["nan"] = bool(np.isnan(out).any())
            row["max_abs_diff_vs_xla"] = float(np.abs(out - outputs["xla"]).max())
        print(json.dumps(row), flush=True)
    return results


def failed(row) -> bool:
    return "error" in row or row.get("nan") or row.get("max_abs_diff_vs_xla", 0) > TOLERANCE[row["dtype"]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="one small shape, interpret-mode Pallas")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json_out")
    flags = parser.parse_args()
    on_gpu = jax.default_backend() == "gpu"
    print(f"jax {jax.__version__} on {jax.devices()[0]}", flush=True)
    if not on_gpu and not flags.tiny:
        print("no GPU: pass --tiny for the interpret-mode dry run", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    cases, pending = [], []
    for dtype in ("bfloat16", "float32"):
        for name, model, q_lens, ctx, window in TINY if flags.tiny else SHAPES:
            args = make_args(rng, model, q_lens, ctx, window, dtype)
            cases.append((name, dtype, args))
            pending.append(lowered_variants(args, model, interpret=not on_gpu))
    # Every variant compiles on threads first (about a second each on a GPU, where the
    # compilations one after another ran past the check's limit), then runs are timed serially.
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        futures = [{v: pool.submit(compile_timed, low) for v, low in lowered.items()} for lowered in pending]
        results = []
        for case, shape_futures in zip(cases, futures):
            compiled = {v: f.result() for v, f in shape_futures.items()}
            results += bench_shape(case, compiled, runs=2 if flags.tiny else flags.runs)
    if flags.json_out:
        with open(flags.json_out, "w") as f:
            json.dump(dict(jax=jax.__version__, device=str(jax.devices()[0]), results=results), f, indent=1)
    bad = [r for r in results if failed(r)]
    for row in bad:
        print("FAILED", json.dumps(row), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
