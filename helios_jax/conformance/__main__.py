"""Run the conformance checks against a measured catalog, or the startup traces over a generated family.

    python -m helios_jax.conformance [--catalog=FILE] [--sections=catalog,selection,...]
        [--policy=balanced] [--cases=200] [--json_out=FILE]
    python -m helios_jax.conformance --generated=N [--generated_seed=S] [--policy=...] [--json_out=FILE]

The default catalog is the shipped measured synthetic one; a catalog exported by
``python -m helios_jax.prepare --measure --catalog_out=FILE`` on a real machine works as input.
Prints one table per section (verdict and the measured figure behind it) and exits non-zero
when any check fails. "not achievable" marks bounds the catalog's own costs rule out.

``--generated=N`` runs the spec's startup traces on each of N catalogs of the seeded generated
family (``helios_jax.catalog_family``; ``--sections`` may name other sections to run on each too)
and prints per catalog and in total: runnable traces, held, failed (with the bound that failed and
its figures) and not achievable (with why).
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from helios_jax import console
from helios_jax.catalog import Catalog, shipped_catalog
from helios_jax.conformance.checks import SECTIONS, VERDICTS, generated_startup, tally
from helios_jax.scheduler.config import PolicyConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("catalog", None, "measured catalog JSON (default: the shipped synthetic-h200)")
flags.DEFINE_list(
    "sections",
    list(SECTIONS),
    f"sections to run: {', '.join(SECTIONS)} (with --generated: startup unless given)",
)
flags.DEFINE_enum("policy", "balanced", ["balanced", "throughput"], "scheduler policy preset")
flags.DEFINE_integer("cases", 200, "crosscheck populations (selection section)")
flags.DEFINE_integer("seed", 0, "random seed")
flags.DEFINE_integer(
    "generated", 0, "run on this many catalogs of the generated family instead of one catalog"
)
flags.DEFINE_integer("generated_seed", 0, "seed of the generated family")
flags.DEFINE_string("json_out", None, "write the results as JSON here")


def _summary(counts: dict) -> str:
    bounds = ", ".join(f"{k} {v}" for k, v in counts["failed_bounds"].items())
    return (
        f"{counts['runnable']} runnable, {counts['held']} held, {counts['fail']} failed"
        + (f" ({bounds})" if bounds else "")
        + f", {counts['not achievable']} not achievable, "
        f"{counts['n/a']} not applicable"
    )


def _generated(sections: list[str], policy: PolicyConfig) -> int:
    n, seed = FLAGS.generated, FLAGS.generated_seed
    print(f"startup traces on {n} generated catalogs (family seed {seed}), {FLAGS.policy} policy", flush=True)
    catalogs, everything = [], []
    for member, results in generated_startup(
        n, seed, policy, sections, {"cases": FLAGS.cases, "seed": FLAGS.seed}
    ):
        counts = tally(results)
        everything += results
        print(
            f"\n[{member.index + 1}/{n}] {member.name}: {member.describe()}\n  {_summary(counts)}", flush=True
        )
        for r in results:
            if r.verdict in ("fail", "not achievable"):
                print(f"  {r.verdict:<14}  {r.check}: {r.figure}", flush=True)
        catalogs.append(
            {
                "name": member.name,
                "params": member.params,
                "counts": counts,
                "results": [r.to_json() for r in results],
            }
        )
    counts = tally(everything)
    failing = [c["name"] for c in catalogs if c["counts"]["fail"]]
    print(
        f"\nin total over {n} catalogs: {_summary(counts)}; {len(failing)} catalogs with a failure"
        + (f" ({', '.join(failing)})" if failing else "")
    )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                {
                    "generated": n,
                    "generated_seed": seed,
                    "policy": FLAGS.policy,
                    "sections": sections,
                    "counts": counts,
                    "catalogs": catalogs,
                },
                f,
                indent=1,
            )
    return 1 if counts["fail"] else 0


def main(argv) -> int:
    del argv
    unknown = [s for s in FLAGS.sections if s not in SECTIONS]
    if unknown:
        raise app.UsageError(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    policy = PolicyConfig.preset(FLAGS.policy)
    if FLAGS.generated:
        if FLAGS.catalog:
            raise app.UsageError("--generated runs on the generated family; leave out --catalog")
        if FLAGS.generated < 0:
            raise app.UsageError("--generated takes a number of catalogs")
        return _generated(FLAGS.sections if FLAGS["sections"].present else ["startup"], policy)
    catalog = Catalog.load(FLAGS.catalog) if FLAGS.catalog else shipped_catalog()
    results = []
    print(
        f"conformance of catalog {catalog.name!r} ({catalog.mode}, {len(catalog.graphs)} programs), "
        f"{FLAGS.policy} policy"
    )
    for section in FLAGS.sections:
        rows = SECTIONS[section](catalog, policy, {"cases": FLAGS.cases, "seed": FLAGS.seed})
        results += rows
        print(f"\n## {section}")
        width = max(len(r.check) for r in rows)
        for r in rows:
            print(f"  {r.check:<{width}}  {r.verdict:<14}  {r.figure}")
    failed = [r for r in results if r.verdict == "fail"]
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    print(
        f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable, "
        f"{counts['not achievable']} not achievable on this catalog"
    )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                {
                    "catalog": catalog.name,
                    "policy": FLAGS.policy,
                    "results": [r.to_json() for r in results],
                    "counts": counts,
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


def run() -> None:
    """The ``helios-conformance`` console command."""
    console.run(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
