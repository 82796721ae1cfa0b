"""Write every plan of ``plan_path.py``'s closed loops, for an exact before/after comparison.

    python scripts/bench/plan_trace.py --out=FILE [--decisions=300]   (plan_path's flag)
    diff BEFORE_FILE AFTER_FILE     # a change that keeps decisions identical: no output

A restructure of the ``plan()`` path must choose the same plans. This runs the closed loops of
``plan_path.py`` (the 69-program catalog at 64, 16 and 1 resident requests, its prefill and
generation subset at 64, and the engine's catalog at 1 and 4, every one from the same seed) and
writes one line per decision: the population, the decision's index and the ``repr`` of the
frozen plan (its program, lanes, per-lane work, expected service and timing class, with every
float in full). Each loop's SHA-1 over those lines is printed at the end.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import plan_path  # noqa: E402  (the loops and catalogs benched there)

from helios_jax.catalog import DecodeMode  # noqa: E402

flags.DEFINE_string("out", None, "write the plans here", required=True)
FLAGS = flags.FLAGS

# (catalog, subset, resident requests): 'synthetic' is plan_path's default catalog.
LOOPS = (
    ("synthetic", "all", 64),
    ("synthetic", "all", 16),
    ("synthetic", "all", 1),
    ("synthetic", "no_mixed", 64),
    ("engine", "all", 1),
    ("engine", "all", 4),
)


def main(argv):
    del argv
    if not FLAGS["decisions"].present:
        FLAGS.decisions = 300  # per loop (plan_path's default is its timed count)
    digests = []
    with open(FLAGS.out, "w") as out:
        for catalog, subset, n in LOOPS:
            FLAGS.catalog = "engine" if catalog == "engine" else None
            graphs, kwargs = plan_path.load(subset)
            loop = plan_path.Loop(graphs, DecodeMode.ADAPTIVE, n, FLAGS.seed, **kwargs)
            digest = hashlib.sha1()
            for i in range(FLAGS.decisions):
                plan = loop.sched.plan()
                line = f"{catalog} {subset} {n} {i} {plan!r}\n"
                digest.update(line.encode())
                out.write(line)
                loop.step(plan)
            digests.append(f"{catalog}/{subset}/{n}: {digest.hexdigest()}")
    print("\n".join(digests))


if __name__ == "__main__":
    app.run(main)
