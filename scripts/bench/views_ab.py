"""`pricing.views` of another commit against this tree's, in one process on the same states.

    python scripts/bench/views_ab.py [--base=HEAD] [--requests=16,64] [--mode=adaptive]
        [--catalog=FILE|engine|engine-off16] [--decisions=150] [--json_out=FILE]

Loads ``helios_jax/scheduler/pricing.py`` as it is at --base (``git show``) beside this tree's, and
drives `plan_path.py`'s closed loop of N resident requests (its catalog, mode and seed flags). At
every decision both versions build the views of the same pricing inputs, which must be equal field
for field, and each is timed over five calls, the order alternating by decision. Two checkouts'
processes differ by more on this machine than a few percent of views() (see
docs/benchmarks-engine.md), so the comparison runs in one process. Prints the medians and
this / base per population.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import plan_path
from absl import app, flags
from bench_common import module_at

from helios_jax.catalog import DecodeMode
from helios_jax.scheduler import pricing

flags.DEFINE_string("base", "HEAD", "git ref whose pricing.views is the baseline")
FLAGS = flags.FLAGS


def same_views(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        dx, dy = x.__dict__, y.__dict__
        if dx.keys() != dy.keys():
            return False
        for k, vx in dx.items():
            vy = dy[k]
            if isinstance(vx, np.ndarray):
                if vx.shape != vy.shape or not np.array_equal(vx, vy):
                    return False
            elif vx != vy and not (vx != vx and vy != vy):  # NaN equals NaN here
                return False
    return True


def compare(base, n: int) -> dict:
    catalog, kwargs = plan_path.load("all")
    loop = plan_path.Loop(catalog, DecodeMode(FLAGS.mode), n, FLAGS.seed, **kwargs)
    s = loop.sched
    for _ in range(FLAGS.warmup):
        loop.step(s.plan())
    captured = []
    this = pricing.views
    pricing.views = lambda inp, start: captured.append((inp, start)) or this(inp, start)
    samples: dict[str, list[float]] = {"this": [], "base": []}
    try:
        for d in range(FLAGS.decisions):
            captured.clear()
            s.views(s._planning_start_ns(), optimistic=False)  # as plan() asks (a probe prices its own)
            inp, start = captured[0]
            if not same_views(this(inp, start), base.views(inp, start)):
                raise AssertionError(f"decision {d}: the two versions' views differ")
            order = [("this", this), ("base", base.views)]
            for name, fn in order if d % 2 else order[::-1]:
                t0 = time.perf_counter()
                for _ in range(5):
                    fn(inp, start)
                samples[name].append((time.perf_counter() - t0) / 5 * 1e3)
            loop.step(s.plan())
    finally:
        pricing.views = this
    this_ms, base_ms = statistics.median(samples["this"]), statistics.median(samples["base"])
    return dict(
        requests=n, this_ms=round(this_ms, 4), base_ms=round(base_ms, 4), ratio=round(this_ms / base_ms, 4)
    )


def main(argv):
    del argv
    base = module_at(FLAGS.base, "helios_jax/scheduler/pricing.py", "pricing_base")
    rows = [compare(base, int(n)) for n in FLAGS.requests]
    for r in rows:
        print(
            f"{FLAGS.mode} {FLAGS.catalog or 'synthetic-h200'} n={r['requests']:3d}: "
            f"views {r['this_ms']:.4f} ms, base {r['base_ms']:.4f} ms, this / base {r['ratio']:.3f} "
            "(equal views on every decision)"
        )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(base=FLAGS.base, mode=FLAGS.mode, catalog=FLAGS.catalog, rows=rows), f, indent=1)


if __name__ == "__main__":
    app.run(main)
