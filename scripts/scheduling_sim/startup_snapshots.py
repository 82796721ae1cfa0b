"""The startup traces with checkpoint retention on, by the shape of the snapshot programs.

    python scripts/scheduling_sim/startup_snapshots.py [--shapes=single,shipped,buckets] [--json_out=FILE]

Runs the spec's startup traces (5 and 16 requests of 64-token prompts at t = 0; 0, 3 and 7 accepted
drafts on the speculative catalog; untrained and preseeded histories) on both shipped synthetic
catalogs with ``SimConfig(serving=True)`` (retention and initialize on, distinct prompts so that
every request captures its own prompt-end anchor), with the catalog's snapshot programs replaced by:

  single   one row only (the engine's catalog before RESOLUTIONS.md, 31);
  shipped  the catalog's own (one and four rows);
  buckets  every request bucket 1..16 (the engine's catalog now), costing 0.3 ms at one row
           and 0.5 ms at four as the shipped ones do, linear in the rows.

Prints first output, largest gap and spread per trace, and whether the bounds hold (first output
<= 100 ms, gaps < 150 ms, spread <= 8 tokens).
"""

from __future__ import annotations

import dataclasses
import json

from absl import app, flags

from helios_jax import simulation
from helios_jax.catalog import Catalog, GraphKind, shipped_catalog

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["single", "shipped", "buckets"], "snapshot program shapes to compare")
flags.DEFINE_string("json_out", None, "write every trace's figures here")


def with_snapshots(catalog: Catalog, shape: str) -> Catalog:
    snaps = [g for g in catalog.graphs if g.kind is GraphKind.SNAPSHOT]
    rest = [g for g in catalog.graphs if g.kind is not GraphKind.SNAPSHOT]
    if shape == "single":
        snaps = [g for g in snaps if g.batch_capacity == 1]
    elif shape == "buckets":
        one = next(g for g in snaps if g.batch_capacity == 1)
        snaps = [
            dataclasses.replace(one, batch_capacity=b, duration_ms=0.3 + 0.2 * (b - 1) / 3)
            for b in (1, 2, 4, 8, 16)
        ]
    elif shape != "shipped":
        raise ValueError(f"unknown shape {shape!r}")
    return dataclasses.replace(catalog, graphs=tuple(rest + snaps))


def trace(catalog: Catalog, requests: int, accepted: int, history: str) -> dict:
    config = simulation.SimConfig(
        catalog, requests=requests, accepted_drafts=accepted, acceptance_history=history, serving=True
    )
    result = simulation.run(config)
    first = max(r.first_output_ms for r in result.requests)
    gap = max(r.max_gap_ms for r in result.requests)
    spread = result.progress_spread_tokens
    holds = first <= 100 and gap < 150 and spread is not None and spread <= 8
    return dict(first_output_ms=first, largest_gap_ms=gap, spread_tokens=spread, holds=holds)


def main(argv):
    del argv
    out = []
    for shape in FLAGS.shapes:
        for name in ("synthetic-h200", "synthetic-h200-ordinary"):
            catalog = with_snapshots(shipped_catalog(name), shape)
            for requests in (5, 16):
                for accepted in (0, 3, 7) if catalog.mode == "speculative" else (0,):
                    for history in ("untrained", "preseeded"):
                        row = dict(
                            shape=shape, catalog=name, requests=requests, accepted=accepted, history=history
                        )
                        row.update(trace(catalog, requests, accepted, history))
                        out.append(row)
                        print(
                            f"{shape:8s} {name:24s} {requests:2d} req {accepted} acc {history:10s} "
                            f"first {row['first_output_ms']:6.1f} ms  gap {row['largest_gap_ms']:6.1f} ms  "
                            f"spread {row['spread_tokens']}  {'holds' if row['holds'] else 'FAILS'}",
                            flush=True,
                        )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    app.run(main)
