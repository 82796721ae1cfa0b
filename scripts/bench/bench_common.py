"""Pieces the engine, speculation and load benchmarks share: statistics, the machine record,
held-out prompts, and the persistent compilation cache's default folder.

The scripts run as `python scripts/bench/<name>.py`, so this folder is on `sys.path` and they
import this module by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import sysconfig
import types

import numpy as np

from helios_jax.compilation_cache import DEFAULT_COMPILATION_CACHE_DIR

# Where the server keeps its compiled programs; the benchmarks share it by default
# (`helios_jax.compilation_cache.enable_compilation_cache` sets it up; empty disables it).
DEFAULT_CACHE_DIR = DEFAULT_COMPILATION_CACHE_DIR
EOS_TEXTS = ("<|endoftext|>", "<|im_end|>")


def module_at(ref: str, path: str, name: str) -> types.ModuleType:
    """The source file `path` as it is at git `ref`, imported as a module `name` of its own (so
    an A/B script runs another commit's version beside this tree's in one process)."""
    shown = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True)
    module = types.ModuleType(name)
    sys.modules[name] = module  # its dataclasses and NamedTuples look their module up there
    exec(compile(shown.stdout, f"{ref}:{path}", "exec"), module.__dict__)
    return module


def engine_bench_config(
    slots: int = 16,
    max_model_len: int = 512,
    decode_steps: tuple[int, ...] = (1, 4, 8),
    prefill_batch: tuple[int, ...] | None = None,
    dtype: str = "float32",
):
    """The engine `engine.py` serves, whose catalog `plan_path.py --catalog=engine-off16` plans:
    no speculation, K-step decode, prefill chunks 64-512 within the context, and the server's
    prefill rows at `slots` unless `prefill_batch` says otherwise."""
    from helios_jax.engine_config import EngineConfig
    from helios_jax.engine_options import default_prefill_batch

    chunks = tuple(c for c in (64, 128, 256, 512) if c <= max_model_len) or (max_model_len,)
    return EngineConfig(
        request_slots=slots,
        prefill_chunks=chunks,
        speculation="off",
        draft_tokens=0,
        max_model_len=max_model_len,
        dtype=dtype,
        decode_steps=tuple(decode_steps),
        prefill_batch=tuple(prefill_batch or default_prefill_batch(slots)),
    )


def percentile(values, q):
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else None


def summary(values) -> dict:
    v = [float(x) for x in values]
    if not v:
        return dict(n=0)
    return dict(
        n=len(v),
        mean=float(np.mean(v)),
        p50=percentile(v, 50),
        p90=percentile(v, 90),
        p99=percentile(v, 99),
        max=float(np.max(v)),
    )


def machine() -> dict:
    import jax

    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in open("/proc/cpuinfo")
                if line.startswith("model name")
            ),
            "",
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return dict(
        cpus=os.cpu_count(),
        cpu=cpu,
        python=platform.python_version(),
        jax=jax.__version__,
        backend=jax.default_backend(),
        loadavg_at_start=load,
    )


def held_out_texts() -> list[tuple[str, str]]:
    """(relative path, text) of the held-out stdlib files named by the default model's
    training_info.json: text the embedded model never saw."""
    from helios_jax.model.default import default_model_path

    info = json.loads((default_model_path() / "training_info.json").read_text())
    stdlib = sysconfig.get_paths()["stdlib"]
    out = []
    for rel in info["data"]["held_out_files"]:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            out.append((rel, open(os.path.join(stdlib, rel), encoding="utf-8").read()))
    if not out:
        raise FileNotFoundError(f"none of the held-out files exist under {stdlib}")
    return out


def prompt_windows(tokenizer, count: int, length: int, seed: int) -> list[dict]:
    """`count` windows of `length` tokens at seeded offsets of seeded held-out files."""
    rng = np.random.default_rng(seed)
    files = [(rel, tokenizer.encode(text).ids) for rel, text in held_out_texts()]
    files = [(rel, ids) for rel, ids in files if len(ids) > length + 1]
    if not files:
        raise ValueError(f"no held-out file is longer than {length + 1} tokens")
    out = []
    for _ in range(count):
        rel, ids = files[int(rng.integers(len(files)))]
        start = int(rng.integers(0, len(ids) - length))
        out.append(dict(file=rel, offset=start, tokens=[int(t) for t in ids[start : start + length]]))
    return out


def submit_greedy(engine, prompts, new_tokens: int, tag: str) -> list:
    """Submit every prompt at once for `new_tokens` greedy tokens; the engine's streams."""
    import time

    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    return [
        engine.submit(
            GenerationRequest(
                f"{tag}-{time.perf_counter_ns()}-{i}",
                tuple(p),
                SamplingParams(max_tokens=new_tokens, temperature=0),
            )
        )
        for i, p in enumerate(prompts)
    ]


def read_on_one_loop(streams) -> None:
    """Read every stream to its end on one asyncio loop with the server's `next_event` (no
    thread per stream), as the HTTP server reads them."""
    import asyncio

    from helios_jax.serve.events import next_event

    async def read(stream):
        while (await next_event(stream)).finish_reason is None:
            pass

    async def read_all():
        await asyncio.gather(*(read(s) for s in streams))

    asyncio.run(read_all())
