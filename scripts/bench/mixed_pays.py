"""Does a mixed prefill/verification program pay? Its measured duration against the separate
programs that do the same work, from a catalog `prepare --measure` exported.

    python -m helios_jax.prepare --mixed_prefill --measure --catalog_out=/tmp/cat.json [...]
    python scripts/bench/mixed_pays.py /tmp/cat.json

A mixed program with B rows, prompt chunk C and verification width W runs one prompt row of C
tokens and B - 1 generation rows of W target rows each (P = C + (B - 1) W). The separate work is
the one-row prefill of C tokens plus the fastest generation program holding B - 1 rows at the
same width and depth (decode, or the width-one speculative program, when W = 1; the rectangular
speculative program otherwise), as the engine would pad them. Printed per mixed
program: both durations and their ratio (below 1: one mixed execution is cheaper than the two
it replaces). The ratio is per execution only; what mixing buys a served workload (a prompt
absorbed without pausing the streams) is the serving benchmark's question
(scripts/bench/mixed_prefill.py).
"""

from __future__ import annotations

import json
import statistics
import sys


def _key(g: dict) -> tuple:
    return (
        g["kind"],
        g["batch_capacity"],
        g.get("token_capacity"),
        g.get("proposal_depth", 0),
        g.get("steps", 1),
    )


def comparisons(graphs: list[dict]) -> list[tuple[dict, float, float]]:
    """(mixed graph, its duration, the separate programs' summed duration) for every measured
    mixed program whose separate programs are measured too."""
    by_key = {_key(g): g for g in graphs if g.get("duration_ms") is not None}
    out = []
    for g in graphs:
        if g["kind"] != "mixed" or g.get("duration_ms") is None:
            continue
        b, c, d = g["batch_capacity"], g["prefill_capacity"], g.get("proposal_depth", 0)
        w = (g["target_capacity"] - c) // max(1, b - 1)
        prefill = by_key.get(("prefill", 1, c, 0, 1))
        kinds = ("decode", "speculative") if w == 1 else ("speculative",)
        generation = min(
            (
                h
                for h in graphs
                if h.get("duration_ms") is not None
                and h["kind"] in kinds
                and h["batch_capacity"] >= b - 1
                and h.get("proposal_depth", 0) == d
                and h.get("steps", 1) == 1
                and h.get("target_capacity", 0) == h["batch_capacity"] * w
            ),
            key=lambda h: h["duration_ms"],
            default=None,
        )
        if prefill is not None and generation is not None:
            out.append((g, g["duration_ms"], prefill["duration_ms"] + generation["duration_ms"]))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    catalog = json.loads(open(argv[1]).read())
    rows = comparisons(catalog["graphs"])
    if not rows:
        print("no measured mixed program with measured separate programs", file=sys.stderr)
        return 1
    print(f"{catalog.get('name', argv[1])}: mode {catalog.get('mode')}, {len(rows)} mixed programs")
    print(f"{'program':<34} {'mixed ms':>9} {'separate ms':>12} {'ratio':>6}")
    for g, mixed, separate in rows:
        name = f"mixed[B={g['batch_capacity']},C={g['prefill_capacity']},P={g['target_capacity']}]"
        print(f"{name:<34} {mixed:>9.3f} {separate:>12.3f} {mixed / separate:>6.2f}")
    ratios = [m / s for _, m, s in rows]
    pays = sum(r < 1 for r in ratios)
    print(f"median ratio {statistics.median(ratios):.2f}, pays (ratio < 1) in {pays}/{len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
