"""The CPU (XLA) ragged paged attention: cost against the context, not the prepared window.

    python scripts/bench/attention.py [--window=4096] [--contexts=64,256,1024,4096]
        [--decode_rows=16] [--chunk=256] [--runs=20] [--json_out=FILE]

A prepared program's page window is its max_model_len; rows usually hold far less. For each
context length c this times (median of --runs, dispatch to block_until_ready, alternating) two
shapes in one process:

  tight   the window is exactly c (pages_per_row = c / page_size): the least work possible;
  served  the window is --window, rows hold c tokens: what a server with max_model_len
          --window runs.

Two batches: --decode_rows decode rows (one query token each) and one --chunk-token prefill
chunk with the decode rows beside it. The ratio served / tight is what the prepared window
costs; 1.0 means the kernel reads only the pages the contexts cover.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("window", 4096, "the served program's attention window (tokens)")
flags.DEFINE_list("contexts", ["64", "256", "1024", "4096"], "row context lengths")
flags.DEFINE_integer("decode_rows", 16, "decode rows per batch")
flags.DEFINE_integer("chunk", 256, "prefill chunk beside the decode rows (0: skip that batch)")
flags.DEFINE_integer("page_size", 16, "tokens per page")
flags.DEFINE_integer("heads", 8, "query heads")
flags.DEFINE_integer("kv_heads", 2, "kv heads")
flags.DEFINE_integer("head_dim", 64, "head dimension")
flags.DEFINE_integer("runs", 20, "timed runs per shape")
flags.DEFINE_integer("seed", 0, "seed of the random pages")
flags.DEFINE_string("json_out", None, "write the results as JSON here")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from helios_jax.kernels.ragged_paged_attention import ragged_paged_attention  # noqa: E402


def make_batch(rng, context: int, window: int, chunk: int):
    """Inputs for decode rows at `context` (and a chunk ending at `context`) in `window`."""
    ps, rows = FLAGS.page_size, FLAGS.decode_rows + (1 if chunk else 0)
    pages_per_row = -(-window // ps)
    total_pages = rows * pages_per_row + 1
    shape = (FLAGS.kv_heads, total_pages, ps, FLAGS.head_dim)
    k_pages = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    v_pages = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    tables = jnp.asarray(np.arange(rows * pages_per_row).reshape(rows, pages_per_row), jnp.int32)
    q_lens = [1] * FLAGS.decode_rows + ([chunk] if chunk else [])
    starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
    tokens = int(sum(q_lens))
    q = jnp.asarray(rng.standard_normal((tokens, FLAGS.heads, FLAGS.head_dim)), jnp.float32)
    ctx = jnp.full((rows,), context, jnp.int32)
    return q, k_pages, v_pages, tables, ctx, jnp.asarray(starts, jnp.int32), jnp.asarray(q_lens, jnp.int32)


def main(argv) -> int:
    del argv
    rng = np.random.default_rng(FLAGS.seed)
    attend = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=FLAGS.head_dim**-0.5, impl="xla"))
    rows = []
    for chunk in [0, FLAGS.chunk] if FLAGS.chunk else [0]:
        for context in (int(c) for c in FLAGS.contexts):
            if context > FLAGS.window or context < chunk:
                continue
            batches = dict(
                tight=make_batch(rng, context, context, chunk),
                served=make_batch(rng, context, FLAGS.window, chunk),
            )
            for args in batches.values():
                jax.block_until_ready(attend(*args))
            times = {name: [] for name in batches}
            for _ in range(FLAGS.runs):
                for name, args in batches.items():
                    t = time.perf_counter()
                    jax.block_until_ready(attend(*args))
                    times[name].append((time.perf_counter() - t) * 1e3)
            ratios = [s / t for s, t in zip(times["served"], times["tight"])]
            row = dict(
                batch=f"{FLAGS.decode_rows} decode" + (f" + {chunk}-token chunk" if chunk else ""),
                context=context,
                window=FLAGS.window,
                tight_ms=statistics.median(times["tight"]),
                served_ms=statistics.median(times["served"]),
                ratio_median=statistics.median(ratios),
            )
            rows.append(row)
            print(
                f"{row['batch']:28s} context {context:5d}  tight {row['tight_ms']:8.2f} ms  "
                f"window {FLAGS.window} {row['served_ms']:8.2f} ms  ratio {row['ratio_median']:.2f}",
                flush=True,
            )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(command=" ".join(sys.argv), rows=rows), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
