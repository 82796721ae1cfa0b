"""The engine against transformers and a naive jitted loop, and a decode step against its matmuls.

    python scripts/bench/engine.py [--dtypes=float32,bfloat16] [--concurrency=1,4,16]
        [--prompt_tokens=64] [--new_tokens=128] [--repeats=3] [--max_model_len=512]
        [--systems=helios,transformers,naive] [--decode_runs=30] [--large_hidden=1024]
        [--large_layers=8] [--large_vocab=4096] [--seed=0] [--discovery_bursts=8]
        [--cpu_compute_threads=0] [--measure_runs=5] [--alt_measure_runs=N]
        [--json_out=FILE] [--plot_dir=DIR]

Part 1, serving (the embedded default model, greedy, the same prompts and the same number of new
tokens for every system). Prompts are windows of --prompt_tokens tokens cut at seeded offsets from
the held-out standard-library files that `training_info.json` names (files the model never saw);
prompts whose greedy continuation would reach an end-of-text token within --new_tokens are skipped,
so that every system generates exactly --new_tokens tokens per request. Three systems, per dtype:

  helios        `HeliosEngine` with 16 request slots (speculation off, decode programs of
                --decode_steps steps as `serve --speculation=off` prepares, compiled once, the
                persistent compilation cache on), each program timed --measure_runs times
                before serving as the server does (`serve --measure_runs`); concurrency c = c
                requests submitted at once, the streams read as --readers says.
  transformers  `AutoModelForCausalLM` (the folder loads as Qwen3ForCausalLM; the mtp.* tensors
                are ignored) `generate` on torch CPU, the c prompts batched (left padding),
                greedy, a streamer timestamps every step. It runs in its own process (no JAX
                thread pools beside it), once per --torch_threads setting; the baseline of a
                ratio is the faster setting of the same repeat (on a shared 2-core machine one
                thread is often much faster than two: torch's OpenMP barriers stall whenever
                another process holds a core).
  naive         a KV-cached jitted step written here (dense [layers, B, S, kv_heads, head_dim]
                cache, the model's own flax modules with a dense `attend`), a host loop that
                dispatches one step per token and reads each token back (as a streaming server
                would).

Before the timed repeats every system runs once at every concurrency, untimed; each helios engine
then runs further rounds of its bursts until one commits no discovery execution (at most
--discovery_bursts; an unmeasured program is measured on its first use, so the first bursts of an
engine built with --measure_runs=0 are its start-up: `setup.discovery_warmup` records the rounds
and the discovery executions).

Concurrencies and systems are interleaved within each repeat, and the ratios (helios / other) are
taken per repeat at the same concurrency and then summarised by their median: the machine is
shared and noisy, so absolute times are context only.

Part 2, decode step against matmuls: the device time (dispatch to block_until_ready, median of
--decode_runs, alternating with the reference) of the engine's `decode[B=16]` executable at full
occupancy, against one executable that runs only the same matrix products (every layer's q, k, v,
o, gate, up, down projections and the output projection, on [16, ...] activations, same dtype and
precision). Run on the default model and on a random-weight Qwen3 config (--large_hidden,
--large_layers) where arithmetic dominates, in float32 and bfloat16, plus the default model's
decode executable at the server's default max_model_len (4096): attention reads only the pages
a row's context covers, so the prepared window should barely matter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
from absl import app, flags
from bench_common import (
    DEFAULT_CACHE_DIR,
    EOS_TEXTS,
    engine_bench_config,
    machine,
    percentile,
    prompt_windows,
    summary,
)

from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.cpu_threads import compute_pool_threads, limit_compute_threads
from helios_jax.engine_options import MEASURE_RUNS_DEFAULT

FLAGS = flags.FLAGS
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "compute dtypes to compare (same bf16-rounded weights)")
flags.DEFINE_list("concurrency", ["1", "4", "16"], "concurrent requests (batch size for the baselines)")
flags.DEFINE_list("systems", ["helios", "transformers", "naive"], "systems to run")
flags.DEFINE_list("torch_threads", ["1", "2"], "torch intra-op thread settings for transformers")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt")
flags.DEFINE_integer("new_tokens", 128, "new tokens per request")
flags.DEFINE_integer("repeats", 3, "interleaved repeats of every (concurrency, system)")
flags.DEFINE_integer("max_model_len", 512, "engine context length (also the attention window on CPU)")
flags.DEFINE_integer("decode_runs", 30, "timed executions per executable in part 2")
flags.DEFINE_integer("decode_batch", 16, "decode batch of part 2")
flags.DEFINE_integer("large_hidden", 1024, "hidden size of the random-weight config (0: skip)")
flags.DEFINE_integer("large_layers", 8, "layers of the random-weight config")
flags.DEFINE_integer("large_vocab", 4096, "vocabulary of the random-weight config")
flags.DEFINE_bool("serving", True, "run part 1")
flags.DEFINE_list(
    "decode_steps",
    ["1", "4", "8"],
    "step counts K of helios' decode programs (the engine's default without speculation)",
)
flags.DEFINE_list(
    "prefill_batch",
    None,
    "prompt rows B of helios' prefill programs (1: one prompt each); unset: the server's default "
    "at the largest concurrency (1, 4, 16, ...: engine_options.default_prefill_batch)",
)
flags.DEFINE_enum(
    "readers",
    "loop",
    ["loop", "threads"],
    "how helios' streams are read: all on one asyncio loop with the server's next_event (as the "
    "HTTP server reads them), or a thread per stream",
)
flags.DEFINE_list(
    "alt_prefill_batch",
    [],
    "also run a second helios engine whose prefill programs have these row counts (system "
    "'helios-pb' joined by dots, e.g. helios-pb1.4.16), interleaved with the others",
)
flags.DEFINE_list(
    "alt_decode_steps",
    [],
    "also run a second helios engine whose decode programs take these step counts (system "
    "'helios-k' joined by dots, e.g. helios-k1.4.8.16), interleaved with the others",
)
flags.DEFINE_integer(
    "measure_runs",
    MEASURE_RUNS_DEFAULT,
    "timed runs of every helios program before serving, seeding its duration estimate (the "
    "server's --measure_runs default; 0: each program is measured on its first use)",
)
flags.DEFINE_integer(
    "alt_measure_runs",
    None,
    "also run a second helios engine measured with this many runs (system 'helios-m<N>'), "
    "interleaved with the others",
)
flags.DEFINE_bool("decode", True, "run part 2")
flags.DEFINE_integer("seed", 0, "seed of the prompt windows and random weights")
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_integer(
    "discovery_bursts",
    8,
    "warm-up rounds of helios bursts after the first, until one commits no discovery execution "
    "(0: the first round only)",
)
flags.DEFINE_string("plot_dir", None, "write PNG plots here (e.g. docs/img)")
flags.DEFINE_integer(
    "cpu_compute_threads",
    0,
    "threads of the CPU backend's compute pool, for helios and naive alike (0: one per core; "
    "helios_jax/cpu_threads.py)",
)
flags.DEFINE_string(
    "compilation_cache_dir",
    DEFAULT_CACHE_DIR,
    "persistent compilation cache (the server's default); empty disables it",
)

import jax  # noqa: E402  (after absl flags so that --help stays fast to read)
import jax.numpy as jnp  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The naive baseline: a dense-cache jitted step over the model's own modules


class NaiveDecoder:
    """Greedy decoding with a dense KV cache, one jitted step per token (all prompts one length)."""

    def __init__(self, config, params, batch: int, prompt_len: int, new_tokens: int):
        from helios_jax.model import Qwen3
        from helios_jax.model.forward import softmax_scale

        self.config, self.params = config, params
        self.batch, self.prompt_len = batch, prompt_len
        self.length = -(-(prompt_len + new_tokens) // 64) * 64
        c = config
        model = Qwen3(c)
        scale = softmax_scale(c)
        b, p, s = batch, prompt_len, self.length
        group = c.num_heads // c.num_kv_heads

        def dense_attention(q, keys, values, mask):
            # q [B, T, H, D]; keys/values [B, S, KV, D]; mask bool[T, S] or [B, T, S]
            qg = q.reshape(q.shape[0], q.shape[1], c.num_kv_heads, group, c.head_dim)
            scores = jnp.einsum("btkgd,bskd->bkgts", qg, keys, preferred_element_type=jnp.float32) * scale
            m = mask if mask.ndim == 3 else mask[None]
            scores = jnp.where(m[:, None, None], scores, -jnp.inf)
            probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
            out = jnp.einsum("bkgts,bskd->btkgd", probs, values)
            return out.reshape(q.shape[0] * q.shape[1], c.num_heads, c.head_dim)

        def prefill(params, cache, tokens):  # tokens i32[B, P]
            def attend(layer, q, k, v, cache):
                kc, vc = cache
                k4, v4 = (
                    k.reshape(b, p, c.num_kv_heads, c.head_dim),
                    v.reshape(b, p, c.num_kv_heads, c.head_dim),
                )
                kc = jax.lax.dynamic_update_slice(kc, k4[None].astype(kc.dtype), (layer, 0, 0, 0, 0))
                vc = jax.lax.dynamic_update_slice(vc, v4[None].astype(vc.dtype), (layer, 0, 0, 0, 0))
                causal = jnp.tril(jnp.ones((p, p), bool))
                return dense_attention(q.reshape(b, p, c.num_heads, c.head_dim), k4, v4, causal), (kc, vc)

            positions = jnp.tile(jnp.arange(p, dtype=jnp.int32), b)
            hidden, cache = model.apply({"params": params}, tokens.reshape(-1), positions, attend, cache)
            last = hidden.reshape(b, p, -1)[:, -1]
            logits = model.apply({"params": params}, last, method=Qwen3.logits)
            return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache

        def step(params, cache, tokens, pos):  # tokens i32[B] at position pos (scalar)
            def attend(layer, q, k, v, cache):
                kc, vc = cache
                kc = jax.lax.dynamic_update_slice(
                    kc, k[None, :, None].astype(kc.dtype), (layer, 0, pos, 0, 0)
                )
                vc = jax.lax.dynamic_update_slice(
                    vc, v[None, :, None].astype(vc.dtype), (layer, 0, pos, 0, 0)
                )
                mask = (jnp.arange(s) <= pos)[None, :]
                out = dense_attention(q[:, None], kc[layer], vc[layer], mask)
                return out, (kc, vc)

            positions = jnp.full((b,), pos, jnp.int32)
            hidden, cache = model.apply({"params": params}, tokens, positions, attend, cache)
            logits = model.apply({"params": params}, hidden, method=Qwen3.logits)
            return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache

        self._prefill = jax.jit(prefill, donate_argnums=1)
        self._step = jax.jit(step, donate_argnums=1)
        shape = (c.num_layers, b, s, c.num_kv_heads, c.head_dim)
        self._cache_shape = (shape, c.jnp_dtype)

    def new_cache(self):
        shape, dtype = self._cache_shape
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def warm(self):
        self.generate(np.zeros((self.batch, self.prompt_len), np.int32), 2)

    def generate(self, prompts: np.ndarray, new_tokens: int):
        """(tokens [B, new_tokens], step timestamps: prefill's token, then each step's)."""
        cache = self.new_cache()
        jax.block_until_ready(cache)
        start = time.perf_counter()
        token, cache = self._prefill(self.params, cache, jnp.asarray(prompts, jnp.int32))
        out = [np.asarray(token)]
        stamps = [time.perf_counter()]
        for i in range(new_tokens - 1):
            token, cache = self._step(self.params, cache, token, jnp.int32(self.prompt_len + i))
            out.append(np.asarray(token))  # read back every token, as a streaming server would
            stamps.append(time.perf_counter())
        return np.stack(out, axis=1), start, stamps


# ---------------------------------------------------------------------------------------------
# Part 1: serving


@dataclasses.dataclass
class RunResult:
    system: str
    dtype: str
    concurrency: int
    repeat: int
    wall_s: float
    output_tokens: int
    ttft_ms: list
    itl_ms: list  # gaps between consecutive token arrivals of one request (per-token for bursts)
    outputs: list  # generated token ids per request

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


def run_helios(engine, prompts, new_tokens) -> tuple[float, int, list, list, list]:
    """Submit every prompt at once and read the streams (`--readers`: a thread each, or all on
    one asyncio loop with the server's `next_event`, as the HTTP server reads them)."""

    n = len(prompts)
    firsts, gaps, outs = [None] * n, [[] for _ in range(n)], [None] * n

    def record(i, event, submitted, state):  # state: [tokens, time of the last token event]
        now = time.perf_counter()
        if event.token_ids:
            if state[1] is None:
                firsts[i] = (now - submitted) * 1e3
            else:
                per = (now - state[1]) * 1e3 / len(event.token_ids)
                gaps[i].extend([per] * len(event.token_ids))
            state[1] = now
            state[0].extend(event.token_ids)
        if event.finish_reason == "error":
            raise RuntimeError(event.error)

    if FLAGS.readers == "loop":
        return _helios_on_one_loop(engine, prompts, new_tokens, record, (firsts, gaps, outs))
    barrier = threading.Barrier(n + 1)

    def consume(i, stream, submitted):
        barrier.wait()
        state = [[], None]
        for event in stream:
            record(i, event, submitted, state)
        outs[i] = state[0]

    threads = []
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        stream = engine.submit(_greedy_request(i, p, new_tokens))
        t = threading.Thread(target=consume, args=(i, stream, time.perf_counter()), daemon=True)
        t.start()
        threads.append(t)
    barrier.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return wall, sum(len(o) for o in outs), firsts, [g for gs in gaps for g in gs], outs


def _greedy_request(i: int, prompt, new_tokens: int):
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    return GenerationRequest(
        f"bench-{time.perf_counter_ns()}-{i}",
        tuple(prompt),
        SamplingParams(max_tokens=new_tokens, temperature=0.0),
    )


def _helios_on_one_loop(engine, prompts, new_tokens, record, results):
    import asyncio

    from helios_jax.serve.events import next_event

    firsts, gaps, outs = results

    async def read(i, stream, submitted):
        state = [[], None]
        while True:
            event = await next_event(stream)
            record(i, event, submitted, state)
            if event.finish_reason is not None:
                break
        outs[i] = state[0]

    start = 0.0

    async def serve():
        nonlocal start
        start = time.perf_counter()  # the loop's start-up is not the engine's time
        readers = []
        for i, p in enumerate(prompts):
            stream = engine.submit(_greedy_request(i, p, new_tokens))
            readers.append(read(i, stream, time.perf_counter()))
        await asyncio.gather(*readers)
        return time.perf_counter() - start

    wall = asyncio.run(serve())
    return wall, sum(len(o) for o in outs), firsts, [g for gs in gaps for g in gs], outs


class StepStamps:
    """A transformers streamer that timestamps every `put` (the prompt first, then each step)."""

    def __init__(self):
        self.stamps = []

    def put(self, value):
        self.stamps.append(time.perf_counter())

    def end(self):
        pass


def run_transformers(model, prompts, new_tokens, pad_id):
    """Runs inside the torch worker process."""
    import torch

    n = len(prompts)
    length = max(len(p) for p in prompts)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, length - len(p) :] = torch.tensor(p)
        mask[i, length - len(p) :] = 1
    streamer = StepStamps()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_id,
            streamer=streamer,
        )
    wall = time.perf_counter() - start
    steps = streamer.stamps[1:]  # stamps[0] is the prompt
    ttft = (steps[0] - start) * 1e3
    gaps = list(np.diff(steps) * 1e3)
    outs = [row[length:].tolist() for row in out]
    return wall, sum(len(o) for o in outs), [ttft] * n, [float(g) for g in gaps] * n, outs


def _torch_worker(conn, model_path: str, dtype: str, seed: int) -> None:
    """A process that owns one transformers model and runs `generate` on request."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()  # the mtp.* tensors are reported as unexpected
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    model.eval()
    conn.send(
        dict(model_class=type(model).__name__, torch=torch.__version__, transformers=transformers.__version__)
    )
    while True:
        message = conn.recv()
        if message is None:
            return
        prompts, new_tokens, pad_id, threads = message
        torch.set_num_threads(threads)
        conn.send(run_transformers(model, prompts, new_tokens, pad_id))


class TorchWorker:
    def __init__(self, model_path: str, dtype: str, seed: int):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_torch_worker, args=(child, model_path, dtype, seed), daemon=True)
        self.process.start()
        self.info = self.conn.recv()

    def run(self, prompts, new_tokens, pad_id, threads):
        self.conn.send((prompts, new_tokens, pad_id, threads))
        return self.conn.recv()

    def close(self):
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.process.join(timeout=10)


def run_naive(decoder: NaiveDecoder, prompts, new_tokens):
    n = len(prompts)
    tokens, start, stamps = decoder.generate(np.asarray(prompts, np.int32), new_tokens)
    wall = stamps[-1] - start
    ttft = (stamps[0] - start) * 1e3
    gaps = list(np.diff(stamps) * 1e3)
    return wall, tokens.size, [ttft] * n, gaps * n, [row.tolist() for row in tokens]


def build_helios(
    model, dtype: str, tokenizer, slots: int, prefill_batch=None, decode_steps=None, measure_runs=None
):
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    rows = prefill_batch or FLAGS.prefill_batch
    ec = engine_bench_config(
        slots,
        FLAGS.max_model_len,
        decode_steps=tuple(int(k) for k in decode_steps or FLAGS.decode_steps),
        prefill_batch=tuple(int(b) for b in rows) if rows else None,
        dtype=dtype,
    )
    t = time.perf_counter()
    engine = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(tokenizer),
        engine_config=ec,
        model_name="helios-default",
        measure_runs=FLAGS.measure_runs if measure_runs is None else measure_runs,
    )
    return engine, time.perf_counter() - t, ec


def settle_discovery(systems, engines, concurrencies, token_lists) -> dict:
    """Run each helios engine's bursts (every concurrency) again until one round commits no
    discovery execution, at most --discovery_bursts rounds; returns, per engine, the rounds run
    and its discovery executions so far."""
    out = {}
    for label, engine in engines.items():
        runner = systems[tuple(label.split("/", 1)) if "/" in label else ("helios", label)]
        executions = engine.scheduler.counters.executions
        rounds = 0
        while rounds < FLAGS.discovery_bursts:
            before = executions["discovery"]
            for c in concurrencies:
                runner(token_lists[:c])
            rounds += 1
            if executions["discovery"] == before:
                break
        out[label] = dict(rounds=rounds, discovery_executions=executions["discovery"])
        print(
            f"{label}: {rounds} more warm-up rounds, {executions['discovery']} discovery executions",
            flush=True,
        )
    return out


def select_prompts(tokenizer, count, length, new_tokens, seed, model_f32) -> tuple[list[dict], int]:
    """`count` held-out windows whose greedy float32 continuation has no end-of-text token."""
    eos = {tokenizer.token_to_id(t) for t in EOS_TEXTS} - {None}
    candidates = prompt_windows(tokenizer, count * 3, length, seed)
    decoder = NaiveDecoder(model_f32.config, model_f32.params, len(candidates), length, new_tokens)
    tokens, _, _ = decoder.generate(np.asarray([c["tokens"] for c in candidates], np.int32), new_tokens)
    keep = [c for c, row in zip(candidates, tokens) if not eos & set(row.tolist())]
    if len(keep) < count:
        raise RuntimeError(f"only {len(keep)} of {len(candidates)} windows avoid an end-of-text token")
    return keep[:count], len(candidates) - len(keep)


def serving(results: dict) -> None:
    from helios_jax.model.default import default_model_path, load_default_model

    concurrencies = [int(c) for c in FLAGS.concurrency]
    slots = max(concurrencies)
    n, new = FLAGS.prompt_tokens, FLAGS.new_tokens
    model_f32 = load_default_model("float32")
    tokenizer = model_f32.tokenizer
    prompts, skipped = select_prompts(tokenizer, slots, n, new, FLAGS.seed, model_f32)
    results["prompts"] = dict(
        count=len(prompts),
        tokens=n,
        new_tokens=new,
        skipped_for_eos=skipped,
        windows=[dict(file=p["file"], offset=p["offset"]) for p in prompts],
    )
    token_lists = [p["tokens"] for p in prompts]
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    setup = {}
    workers = []
    systems = {}  # (system, dtype) -> runner(prompts) -> tuple
    engines = {}  # dtype -> HeliosEngine
    for dtype in FLAGS.dtypes:
        model = load_default_model(dtype)
        if "helios" in FLAGS.systems:
            engine, seconds, ec = build_helios(model, dtype, tokenizer, slots)
            setup[f"helios/{dtype}"] = dict(
                build_and_compile_s=round(seconds, 2),
                engine_config={k: v for k, v in dataclasses.asdict(ec).items()},
            )
            engines[dtype] = engine
            systems[("helios", dtype)] = (lambda e: lambda ps: run_helios(e, ps, new))(engine)
            print(f"helios {dtype}: engine built in {seconds:.1f} s", flush=True)
            alternatives = [
                ("helios-pb", FLAGS.alt_prefill_batch, dict(prefill_batch=FLAGS.alt_prefill_batch)),
                ("helios-k", FLAGS.alt_decode_steps, dict(decode_steps=FLAGS.alt_decode_steps)),
            ]
            if FLAGS.alt_measure_runs is not None:
                runs = FLAGS.alt_measure_runs
                alternatives.append(("helios-m", [str(runs)], dict(measure_runs=runs)))
            for prefix, values, options in alternatives:
                if not values:
                    continue
                name = prefix + ".".join(values)
                alt, seconds, ec = build_helios(model, dtype, tokenizer, slots, **options)
                setup[f"{name}/{dtype}"] = dict(
                    build_and_compile_s=round(seconds, 2), engine_config=dataclasses.asdict(ec)
                )
                engines[f"{name}/{dtype}"] = alt
                systems[(name, dtype)] = (lambda e: lambda ps: run_helios(e, ps, new))(alt)
        if "transformers" in FLAGS.systems:
            worker = TorchWorker(str(default_model_path()), dtype, FLAGS.seed)
            workers.append(worker)
            setup[f"transformers/{dtype}"] = worker.info
            for threads in map(int, FLAGS.torch_threads):
                systems[(f"transformers-{threads}t", dtype)] = (
                    lambda w, n_threads: lambda ps: w.run(ps, new, pad_id, n_threads)
                )(worker, threads)
        if "naive" in FLAGS.systems:
            decoders = {c: NaiveDecoder(model.config, model.params, c, n, new) for c in concurrencies}
            t = time.perf_counter()
            for d in decoders.values():
                d.warm()
            setup[f"naive/{dtype}"] = dict(compile_s=round(time.perf_counter() - t, 2))
            systems[("naive", dtype)] = (lambda ds: lambda ps: run_naive(ds[len(ps)], ps, new))(decoders)
    results["setup"] = setup
    # Warm-up: every system at every concurrency once, untimed (allocators, oneDNN kernels, the
    # scheduler's first duration estimates); then each helios engine again until a round of its
    # bursts runs no discovery execution (the spec measures a program on its first use, so an
    # engine's first bursts are its start-up, not its steady state).
    for runner in systems.values():
        for c in concurrencies:
            runner(token_lists[:c])
    setup["discovery_warmup"] = settle_discovery(systems, engines, concurrencies, token_lists)
    print("warm", flush=True)
    runs: list[RunResult] = []
    for rep in range(FLAGS.repeats):
        for c in concurrencies:
            chosen = [token_lists[(rep * c + i) % len(token_lists)] for i in range(c)]
            order = list(systems.items())
            if rep % 2:
                order.reverse()  # alternate the order so that drift hits every system alike
            for (system, dtype), runner in order:
                wall, count, ttft, itl, outs = runner(chosen)
                r = RunResult(system, dtype, c, rep, wall, count, ttft, itl, outs)
                runs.append(r)
                print(
                    f"rep {rep} c={c:2d} {system:12s} {dtype:8s} {r.tokens_per_s:8.1f} tok/s "
                    f"ttft p50 {percentile(ttft, 50):7.1f} ms  itl p50 {percentile(itl, 50):6.2f} ms",
                    flush=True,
                )
                time.sleep(0.3)  # let the previous system's threads go idle
    results["runs"] = [
        dict(
            system=r.system,
            dtype=r.dtype,
            concurrency=r.concurrency,
            repeat=r.repeat,
            wall_s=round(r.wall_s, 4),
            output_tokens=r.output_tokens,
            tokens_per_s=round(r.tokens_per_s, 2),
        )
        for r in runs
    ]
    table = []
    for dtype in FLAGS.dtypes:
        for c in concurrencies:
            names = list(dict.fromkeys(r.system for r in runs))
            mine = {
                s: [r for r in runs if r.system == s and r.dtype == dtype and r.concurrency == c]
                for s in names
            }
            hf = [mine[s] for s in names if s.startswith("transformers-") and mine[s]]
            if hf:  # the faster thread setting of each repeat
                mine["transformers"] = [max(rs, key=lambda r: r.tokens_per_s) for rs in zip(*hf)]
            row = dict(dtype=dtype, concurrency=c)
            for s, rs in mine.items():
                if not rs:
                    continue
                row[s] = dict(
                    tokens_per_s=statistics.median(r.tokens_per_s for r in rs),
                    ttft_ms=summary([x for r in rs for x in r.ttft_ms]),
                    itl_ms=summary([x for r in rs for x in r.itl_ms]),
                    output_tokens=[r.output_tokens for r in rs],
                )
            for mine_name in [s for s in mine if s.startswith("helios")]:
                for other in ("transformers", "naive", "helios"):
                    if other != mine_name and mine.get(mine_name) and mine.get(other):
                        pairs = zip(mine[mine_name], mine[other])
                        ratios = [h.tokens_per_s / o.tokens_per_s for h, o in pairs]
                        ratio = dict(median=statistics.median(ratios), per_repeat=ratios)
                        row[f"{mine_name}_over_{other}"] = ratio
            table.append(row)
    results["serving"] = table
    # Greedy agreement with transformers float32 (token for token) at the largest concurrency.
    agree = {}
    ref = [
        r
        for r in runs
        if r.system.startswith("transformers") and r.dtype == "float32" and r.concurrency == slots
    ]
    if ref:
        ref_out = ref[0].outputs
        for r in runs:
            if r.concurrency == slots and r.repeat == 0:
                same = [a == b for a, b in zip(r.outputs, ref_out)]
                prefix = [
                    next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    for a, b in zip(r.outputs, ref_out)
                ]
                agree[f"{r.system}/{r.dtype}"] = dict(
                    identical=int(sum(same)), of=len(same), mean_common_prefix=float(np.mean(prefix))
                )
    results["greedy_agreement_with_transformers_float32"] = agree
    # The engine's own view: device time per decode program against wall time per step.
    views = {}
    for dtype, engine in engines.items():
        ex = engine.executor
        views[dtype] = dict(
            graph_counts=dict(sorted(ex.graph_counts.items())),
            graph_device_ms_mean={
                k: round(ex.graph_ns[k] / 1e6 / ex.graph_timed[k], 3)
                for k in sorted(ex.graph_timed)
                if ex.graph_timed[k]
            },
            selections=dict(engine.scheduler.selections),
        )
        engine.shutdown()
    results["helios_programs"] = views
    for w in workers:
        w.close()


# ---------------------------------------------------------------------------------------------
# Part 2: a decode step against its matmuls


def matmul_only(config):
    """jit(params, x[B, H]) running the decode step's matrix products and nothing else."""
    from helios_jax.model.qwen3 import matmul_precision

    precision = matmul_precision(config.jnp_dtype)

    def mm(a, w):
        return jnp.matmul(a, w, precision=precision)

    def fn(params, x):
        outs = []
        for i in range(config.num_layers):
            layer = params[f"layers_{i}"]
            att, mlp = layer["self_attn"], layer["mlp"]
            q = mm(x, att["q_proj"]["kernel"])
            outs += [mm(x, att["k_proj"]["kernel"]), mm(x, att["v_proj"]["kernel"])]
            x = x + mm(q, att["o_proj"]["kernel"])
            h = mm(x, mlp["gate_proj"]["kernel"]) * mm(x, mlp["up_proj"]["kernel"])
            x = x + mm(h, mlp["down_proj"]["kernel"])
        if config.tie_word_embeddings:
            logits = jnp.einsum(
                "bh,vh->bv",
                x,
                params["embed_tokens"]["embedding"],
                precision=precision,
                preferred_element_type=jnp.float32,
            )
        else:
            logits = jnp.einsum(
                "bh,hv->bv",
                x,
                params["lm_head"]["kernel"],
                precision=precision,
                preferred_element_type=jnp.float32,
            )
        return logits, outs

    return jax.jit(fn)


def matmul_weight_bytes(config, params) -> int:
    total = 0
    for i in range(config.num_layers):
        layer = params[f"layers_{i}"]
        for group, names in (
            ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
            ("mlp", ("gate_proj", "up_proj", "down_proj")),
        ):
            for name in names:
                total += layer[group][name]["kernel"].nbytes
    head = params["embed_tokens"]["embedding"] if config.tie_word_embeddings else params["lm_head"]["kernel"]
    return total + head.nbytes


def decode_vs_matmul(label: str, config, params, *, max_model_len: int, batch: int, context: int) -> dict:
    from helios_jax.catalog import GraphKind
    from helios_jax.engine_config import EngineConfig
    from helios_jax.prepare import measurement_inputs
    from helios_jax.programs.program_set import build_program
    from helios_jax.programs.state import init_state

    ec = EngineConfig(
        request_slots=max(16, batch),
        speculation="off",
        draft_tokens=0,
        prefill_chunks=(64,),
        max_model_len=max_model_len,
        dtype=config.dtype,
    )
    descriptor = next(
        g for g in ec.catalog("bench").graphs if g.kind is GraphKind.DECODE and g.batch_capacity == batch
    )
    spec = lambda tree: jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    program = build_program(config, ec, descriptor)
    state = init_state(config, ec)
    t = time.perf_counter()
    program.compile(spec(params), spec(state))
    compile_s = time.perf_counter() - t
    inputs = measurement_inputs(program, ec, context)
    set_cursor = jax.jit(lambda s, c: s.replace(cursor=c), donate_argnums=0)
    cursors = jnp.full((ec.state_rows,), context, jnp.int32)
    mm = matmul_only(config)
    x = jnp.ones((batch, config.hidden_size), config.jnp_dtype) * 0.01
    jax.block_until_ready(mm(params, x))
    decode_ms, matmul_ms = [], []
    for i in range(FLAGS.decode_runs + 2):
        state = set_cursor(state, cursors)
        jax.block_until_ready(state)
        t = time.perf_counter()
        state, out = program(params, state, inputs)
        jax.block_until_ready((state, out))
        d = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        jax.block_until_ready(mm(params, x))
        m = (time.perf_counter() - t) * 1e3
        if i >= 2:  # the first runs warm caches and allocators
            decode_ms.append(d)
            matmul_ms.append(m)
    ratios = [d / m for d, m in zip(decode_ms, matmul_ms)]
    weight_bytes = matmul_weight_bytes(config, params)
    row = dict(
        label=label,
        dtype=config.dtype,
        hidden=config.hidden_size,
        layers=config.num_layers,
        vocab=config.vocab_size,
        batch=batch,
        context=context,
        max_model_len=max_model_len,
        compile_s=round(compile_s, 2),
        decode_ms=summary(decode_ms),
        matmul_ms=summary(matmul_ms),
        ratio_median=statistics.median(ratios),
        ratio_of_medians=statistics.median(decode_ms) / statistics.median(matmul_ms),
        matmul_weight_mib=round(weight_bytes / 2**20, 2),
        matmul_weight_gb_per_s=round(weight_bytes / (statistics.median(matmul_ms) / 1e3) / 1e9, 2),
    )
    print(
        f"{label:28s} {config.dtype:8s} mml {max_model_len:5d} "
        f"decode {statistics.median(decode_ms):8.2f} ms  matmuls {statistics.median(matmul_ms):7.2f} ms  "
        f"ratio {row['ratio_median']:6.2f}",
        flush=True,
    )
    del state
    return row


def bandwidth_gb_per_s() -> float:
    """Streaming read+write bandwidth of one jitted elementwise pass over 256 MiB (context)."""
    a = jnp.ones((64 * 2**20,), jnp.float32)
    f = jax.jit(lambda a: a * 1.0001)
    jax.block_until_ready(f(a))
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        jax.block_until_ready(f(a))
        ts.append(time.perf_counter() - t)
    return round(2 * a.nbytes / statistics.median(ts) / 1e9, 2)


def decode_section(results: dict) -> None:
    from helios_jax.model import ModelConfig, init_params
    from helios_jax.model.default import load_default_model

    batch = FLAGS.decode_batch
    context = FLAGS.prompt_tokens + FLAGS.new_tokens // 2
    rows = []
    for dtype in FLAGS.dtypes:
        m = load_default_model(dtype)
        rows.append(
            decode_vs_matmul(
                "default model",
                m.config,
                m.params,
                max_model_len=FLAGS.max_model_len,
                batch=batch,
                context=context,
            )
        )
    m = load_default_model("float32")
    rows.append(
        decode_vs_matmul(
            "default model", m.config, m.params, max_model_len=4096, batch=batch, context=context
        )
    )
    if FLAGS.large_hidden:
        h = FLAGS.large_hidden
        base = ModelConfig(
            vocab_size=FLAGS.large_vocab,
            hidden_size=h,
            intermediate_size=3 * h,
            num_layers=FLAGS.large_layers,
            num_heads=h // 64,
            num_kv_heads=max(1, h // 128),
            head_dim=64,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        )
        params32 = init_params(base, jax.random.key(FLAGS.seed))
        label = f"random h{h} L{FLAGS.large_layers}"
        for dtype in FLAGS.dtypes:
            config = base.replace(dtype=dtype)
            params = jax.tree_util.tree_map(
                lambda x, jnp_dtype=config.jnp_dtype: x.astype(jnp_dtype), params32
            )
            rows.append(
                decode_vs_matmul(
                    label, config, params, max_model_len=FLAGS.max_model_len, batch=batch, context=context
                )
            )
            del params
    results["decode_vs_matmul"] = rows
    results["stream_bandwidth_gb_per_s"] = bandwidth_gb_per_s()


# ---------------------------------------------------------------------------------------------


def plots(results: dict, folder: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    written = []
    table = results.get("serving")
    if table:
        systems = [s for s in ("helios", "transformers", "naive") if any(s in r for r in table)]
        dtypes = list(dict.fromkeys(r["dtype"] for r in table))
        fig, axes = plt.subplots(1, len(dtypes), figsize=(4.2 * len(dtypes), 3.2), sharey=True, squeeze=False)
        for ax, dtype in zip(axes[0], dtypes):
            rows = [r for r in table if r["dtype"] == dtype]
            xs = np.arange(len(rows))
            width = 0.8 / len(systems)
            for j, s in enumerate(systems):
                ax.bar(xs + j * width, [r[s]["tokens_per_s"] if s in r else 0 for r in rows], width, label=s)
            ax.set_xticks(xs + width * (len(systems) - 1) / 2, [str(r["concurrency"]) for r in rows])
            ax.set_yscale("log")
            ax.set_xlabel("concurrency")
            ax.set_title(f"default model, {dtype}")
        axes[0][0].set_ylabel("output tokens/s")
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(folder, "engine_throughput.png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    rows = results.get("decode_vs_matmul")
    if rows:
        fig, ax = plt.subplots(figsize=(7.5, 3.4))
        labels = [f"{r['label']}\n{r['dtype']}, len {r['max_model_len']}" for r in rows]
        xs = np.arange(len(rows))
        ax.bar(xs - 0.2, [r["decode_ms"]["p50"] for r in rows], 0.4, label="decode[B=16] executable")
        ax.bar(xs + 0.2, [r["matmul_ms"]["p50"] for r in rows], 0.4, label="its matmuls alone")
        ax.set_xticks(xs, labels, fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (median)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(folder, "decode_vs_matmul.png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def main(argv) -> int:
    del argv
    limit_compute_threads(FLAGS.cpu_compute_threads)  # before anything initialises the backend
    enable_compilation_cache(FLAGS.compilation_cache_dir)
    started = time.perf_counter()
    results = dict(
        command=" ".join(sys.argv),
        machine=machine(),
        compute_pool_threads=compute_pool_threads(),
        flags={
            k: FLAGS[k].value
            for k in (
                "dtypes",
                "concurrency",
                "systems",
                "prompt_tokens",
                "new_tokens",
                "repeats",
                "max_model_len",
                "decode_runs",
                "decode_batch",
                "large_hidden",
                "large_layers",
                "large_vocab",
                "seed",
                "cpu_compute_threads",
            )
        },
    )
    if FLAGS.serving:
        serving(results)
    if FLAGS.decode:
        decode_section(results)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print_tables(results)
    if FLAGS.plot_dir:
        results["plots"] = plots(results, FLAGS.plot_dir)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(results, f, indent=1, default=float)
            f.write("\n")
    return 0


def print_tables(results: dict) -> None:
    print()
    for row in results.get("serving", []):
        parts = [f"{row['dtype']:8s} c={row['concurrency']:2d}"]
        for s in [k for k in row if isinstance(row[k], dict) and "tokens_per_s" in row[k]]:
            if s in row:
                parts.append(
                    f"{s} {row[s]['tokens_per_s']:8.1f} tok/s (ttft p50 {row[s]['ttft_ms']['p50']:7.1f} ms,"
                    f" itl p50 {row[s]['itl_ms']['p50']:6.2f} ms)"
                )
        for k in [k for k in row if "_over_" in k]:
            parts.append(f"{k} {row[k]['median']:.2f}x")
        print(" | ".join(parts))
    for row in results.get("decode_vs_matmul", []):
        print(
            f"{row['label']:24s} {row['dtype']:8s} len {row['max_model_len']:5d} "
            f"decode {row['decode_ms']['p50']:8.2f} ms matmuls {row['matmul_ms']['p50']:7.2f} ms "
            f"ratio {row['ratio_median']:6.2f}"
        )
    print(f"wall {results['wall_s']} s")


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
