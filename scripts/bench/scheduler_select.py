"""Time one full selection over a measured catalog at several resident populations.

    python scripts/bench/scheduler_select.py [--catalog=FILE] [--requests=1,4,16,64]
        [--mode=adaptive] [--repeats=300] [--json_out=FILE] [--profile]

Wall time is what a caller sees; process CPU time is reported beside it because this machine is
shared (other processes inflate wall time, not CPU time). Each population is seeded: 60% decoding
requests with random prices, ages and acceptance, 40% prompts of random length. The selector is
given a prepared graph set (as the Scheduler holds one), so the time is the decision itself:
pricing, every program's best cohort, dominance and the tie order. Prints median and p99 in
milliseconds per population size, and with --profile the functions that dominate at the largest
size.
"""

from __future__ import annotations

import cProfile
import json
import math
import pstats
import statistics
import time

import numpy as np
from absl import app, flags

from helios_jax.catalog import Catalog, DecodeMode, shipped_catalog
from helios_jax.scheduler import policy, service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import Phase, RequestView

FLAGS = flags.FLAGS
flags.DEFINE_string("catalog", None, "catalog JSON (default: shipped synthetic-h200)")
flags.DEFINE_list("requests", ["1", "4", "16", "64"], "resident population sizes")
flags.DEFINE_enum("mode", "adaptive", ["ordinary", "fixed", "adaptive"], "loaded decode mode")
flags.DEFINE_integer("repeats", 300, "timed selections per population")
flags.DEFINE_integer("seed", 0, "population seed")
flags.DEFINE_string("json_out", None, "write results as JSON here")
flags.DEFINE_bool("profile", False, "print the top functions at the largest population")


def population(n: int, catalog: Catalog, rng: np.random.Generator, normalizers, config) -> list[RequestView]:
    depth = max(catalog.max_proposal_depth, 1)
    views = []
    for i in range(n):
        log_x = normalizers.share_log_rate(n) + rng.normal(0, 1)
        if rng.random() < 0.6:
            log_z = normalizers.share_log_rate(n) + rng.normal(0, 1)
            p = service.log_prices(config, log_x, log_z)
            views.append(
                RequestView(
                    rid=i,
                    slot=i,
                    phase=Phase.DECODE,
                    log_prefill_price=p.prefill_token,
                    log_output_price=p.output_token,
                    log_delivery_price=p.delivery,
                    age_ms=float(rng.uniform(0, 100)),
                    output_remaining=int(rng.integers(1, 2000)),
                    survival=np.cumprod(rng.uniform(0.4, 1.0, depth)),
                    forecast=np.cumprod(rng.uniform(0.4, 1.0, depth)),
                    last_selected_ns=int(rng.integers(0, 10**9)),
                )
            )
        else:
            p = service.log_prices(config, log_x, None)
            views.append(
                RequestView(
                    rid=i,
                    slot=i,
                    phase=Phase.PREFILL,
                    log_prefill_price=p.prefill_token,
                    log_output_price=p.output_token,
                    prompt_remaining=int(rng.integers(1, 8000)),
                    last_selected_ns=int(rng.integers(0, 10**9)),
                )
            )
    return views


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def main(argv):
    del argv
    catalog = Catalog.load(FLAGS.catalog) if FLAGS.catalog else shipped_catalog()
    mode = DecodeMode(FLAGS.mode)
    config = PolicyConfig()
    costs = CostModel(config.estimate_ttl_ns)
    costs.seed_from_catalog(catalog, 0)
    normalizers = service.Normalizers.measure(catalog.graphs, costs)
    graphs = policy.PreparedGraphs(catalog.eligible(mode))
    rng = np.random.default_rng(FLAGS.seed)
    results = []
    for n in (int(x) for x in FLAGS.requests):
        views = population(n, catalog, rng, normalizers, config)
        inp = policy.SelectionInput(views, graphs, costs, 0, config, mode)
        for _ in range(20):  # warm caches
            policy.select(inp)
        wall, cpu = [], []
        for _ in range(FLAGS.repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            policy.select(inp)
            cpu.append((time.process_time() - c0) * 1e3)
            wall.append((time.perf_counter() - w0) * 1e3)
        row = {
            "requests": n,
            "graphs": len(graphs.graphs),
            "median_ms": statistics.median(wall),
            "p99_ms": _p99(wall),
            "cpu_median_ms": statistics.median(cpu),
            "cpu_p99_ms": _p99(cpu),
        }
        results.append(row)
        print(
            f"requests={n:3d}  median={row['median_ms']:.3f} ms  p99={row['p99_ms']:.3f} ms  "
            f"(process CPU: median={row['cpu_median_ms']:.3f} ms  p99={row['cpu_p99_ms']:.3f} ms)"
        )
    if FLAGS.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(100):
            policy.select(inp)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"catalog": catalog.name, "mode": mode.value, "results": results}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
