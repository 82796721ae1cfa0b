"""Run the conformance checks against a measured catalog.

    python -m helios_jax.conformance [--catalog=FILE] [--sections=catalog,selection,...]
        [--policy=balanced] [--cases=200] [--json_out=FILE]

The default catalog is the shipped measured synthetic one; a catalog exported by
``python -m helios_jax.prepare --measure --catalog_out=FILE`` on a real machine works as input.
Prints one table per section (verdict and the measured figure behind it) and exits non-zero
when any check fails. "not achievable" marks bounds the catalog's own costs rule out.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags

from helios_jax.catalog import Catalog, shipped_catalog
from helios_jax.conformance.checks import SECTIONS
from helios_jax.scheduler.config import PolicyConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("catalog", None, "measured catalog JSON (default: the shipped synthetic-h200)")
flags.DEFINE_list("sections", list(SECTIONS), f"sections to run: {', '.join(SECTIONS)}")
flags.DEFINE_enum("policy", "balanced", ["balanced", "throughput"], "scheduler policy preset")
flags.DEFINE_integer("cases", 200, "crosscheck populations (selection section)")
flags.DEFINE_integer("seed", 0, "random seed")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def main(argv) -> int:
    del argv
    unknown = [s for s in FLAGS.sections if s not in SECTIONS]
    if unknown:
        raise app.UsageError(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    catalog = Catalog.load(FLAGS.catalog) if FLAGS.catalog else shipped_catalog()
    policy = PolicyConfig.preset(FLAGS.policy)
    results = []
    print(f"conformance of catalog {catalog.name!r} ({catalog.mode}, {len(catalog.graphs)} programs), "
          f"{FLAGS.policy} policy")
    for section in FLAGS.sections:
        rows = SECTIONS[section](catalog, policy, {"cases": FLAGS.cases, "seed": FLAGS.seed})
        results += rows
        print(f"\n## {section}")
        width = max(len(r.check) for r in rows)
        for r in rows:
            print(f"  {r.check:<{width}}  {r.verdict:<14}  {r.figure}")
    failed = [r for r in results if r.verdict == "fail"]
    counts = {v: sum(r.verdict == v for r in results) for v in ("pass", "fail", "n/a", "not achievable")}
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable, "
          f"{counts['not achievable']} not achievable on this catalog")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"catalog": catalog.name, "policy": FLAGS.policy, "results": [r.to_json() for r in results],
                       "counts": counts}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
