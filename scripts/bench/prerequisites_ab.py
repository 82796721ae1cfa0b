"""`prerequisites.prerequisite_entries` of another commit against this tree's, in one process.

    python scripts/bench/prerequisites_ab.py [--base=HEAD] [--catalog=engine-off16] [--mode=ordinary]
        [--requests=1,16] [--decisions=400] [--burst] [--json_out=FILE]

Loads ``helios_jax/scheduler/policy/prerequisites.py`` as it is at --base (``git show``) beside this
tree's and drives `plan_path.py`'s closed loop of N resident requests (its catalog, mode, burst
and seed flags). At every decision both versions score the prerequisite programs' sequences and
continuation rows of the same selection input, which must agree entry for entry (kind, key,
programs, score bit for bit, determinacy; every tenth decision also each built row's lanes),
and each is timed on fresh selections of that input, the order alternating by decision. Prints
the medians and this / base per population. On the catalog of ``engine.py``'s engine the
sequences of requests waiting to be initialized are most of a decision at sixteen streams
(docs/benchmarks-engine.md), which is what this isolates.
"""

from __future__ import annotations

import json
import statistics
import time
import types

import plan_path
from absl import app, flags
from bench_common import module_at

from helios_jax.catalog import DecodeMode
from helios_jax.scheduler import policy
from helios_jax.scheduler.policy import prerequisites

flags.DEFINE_string("base", "HEAD", "git ref whose prerequisites.py is the baseline")
FLAGS = flags.FLAGS
SOURCE = "helios_jax/scheduler/policy/prerequisites.py"


def signature(entries: list) -> list[tuple]:
    """What a decision reads of the entries: each sequence's key, programs, score and
    determinacy, each built row's program and score."""
    out = []
    for e in entries:
        if hasattr(e, "following"):  # a sequence (either version's NamedTuple)
            out.append(("sequence", e.key, e.prerequisite.name, e.following.name, e.score, e.determinate))
        else:
            out.append(("row", e.graph.name, e.score))
    return out


def built(entries: list) -> list[tuple]:
    rows = [e.row() if hasattr(e, "following") else e for e in entries]
    return [(r.graph.name, r.score, tuple(lane.work for lane in r.build().lanes)) for r in rows]


def compare(base: types.ModuleType, n: int) -> dict:
    catalog, kwargs = plan_path.load("all")
    loop = plan_path.Loop(catalog, DecodeMode(FLAGS.mode), n, FLAGS.seed, burst=FLAGS.burst, **kwargs)
    s = loop.sched
    for _ in range(FLAGS.warmup):
        loop.step(s.plan())
    samples: dict[str, list[float]] = {"this": [], "base": []}
    scored = 0
    for d in range(FLAGS.decisions):
        views = s.views(s._planning_start_ns(), optimistic=False)  # as plan() asks
        inp = policy.SelectionInput(views, s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        this = prerequisites.prerequisite_entries(policy.Selection(inp))
        other = base.prerequisite_entries(policy.Selection(inp))
        if signature(this) != signature(other) or (d % 10 == 0 and built(this) != built(other)):
            raise AssertionError(f"decision {d}: the two versions' entries differ")
        scored += bool(this)
        order = [("this", prerequisites.prerequisite_entries), ("base", base.prerequisite_entries)]
        for name, fn in order if d % 2 else order[::-1]:
            selections = [policy.Selection(inp) for _ in range(3)]  # fresh: no cache carried over
            t0 = time.perf_counter()
            for sel in selections:
                fn(sel)
            samples[name].append((time.perf_counter() - t0) / 3 * 1e3)
        loop.step(s.plan())
    this_ms, base_ms = statistics.median(samples["this"]), statistics.median(samples["base"])
    return dict(
        requests=n,
        decisions=FLAGS.decisions,
        with_entries=scored,
        this_ms=round(this_ms, 4),
        base_ms=round(base_ms, 4),
        ratio=round(this_ms / base_ms, 4),
    )


def main(argv):
    del argv
    base = module_at(FLAGS.base, SOURCE, "prerequisites_base")
    rows = [compare(base, int(n)) for n in FLAGS.requests]
    for r in rows:
        print(
            f"{FLAGS.mode} {FLAGS.catalog or 'synthetic-h200'} n={r['requests']:3d}: entries "
            f"{r['this_ms']:.4f} ms, base {r['base_ms']:.4f} ms, this / base {r['ratio']:.3f} "
            f"(equal entries on every decision, {r['with_entries']} of {r['decisions']} with any)"
        )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(base=FLAGS.base, mode=FLAGS.mode, catalog=FLAGS.catalog, rows=rows), f, indent=1)


if __name__ == "__main__":
    app.run(main)
