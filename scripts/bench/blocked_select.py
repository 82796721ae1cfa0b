"""Selection while prompts wait for initialization: what a burst's first decisions cost.

    python scripts/bench/blocked_select.py [--blocked=16] [--ready=0,4] [--runs=300]
        [--measured=all] [--json_out=FILE]

On `engine.py`'s catalog (`plan_path.py --catalog=engine-off16`: prompt rows 1, 4, 16, chunks
64-512, decode of 1, 4 and 8 steps, synthetic durations seeded through the observation path),
`--blocked` requests with 64-token prompts wait on initialization, beside `--ready` prompts
already initialized. `--measured=one_stream` leaves unmeasured every program but the one-row
ones of the smallest chunk (what an engine that has served one 64-token prompt at a time has
measured: the larger shapes' sequences are indeterminate). Times `policy.selection_rows` and
`policy.select` on its rows (median of --runs after 20 untimed) and reports how many rows the
selection built and what it chose. Run it from two checkouts with `ab_checkouts.py` to compare
them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time

import plan_path  # its catalogs and --json_out
from absl import flags
from program_variants import run_main

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import policy, service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy.prepared import PreparedGraphs
from helios_jax.scheduler.view import Phase, RequestView

FLAGS = flags.FLAGS
flags.DEFINE_integer("blocked", 16, "requests waiting on initialization")
flags.DEFINE_list("ready", ["0", "4"], "prompts already initialized beside them (one case each)")
flags.DEFINE_integer("runs", 300, "timed selections per case")
flags.DEFINE_enum("measured", "all", ["all", "one_stream"], "which programs have a duration estimate")


def _measured(catalog) -> CostModel:
    """Every program's synthetic duration, or (one_stream) the one-row programs' of chunk 64."""
    costs = CostModel()
    costs.seed_from_catalog(catalog, 0)
    if FLAGS.measured == "one_stream":
        for g in catalog.graphs:
            if g.batch_capacity > 1 or (g.kind.is_prefill and g.token_capacity > 64):
                costs._entries.pop(g.key, None)
    return costs


def _prompt(rid: int, blocked: bool, config: PolicyConfig) -> RequestView:
    prices = service.log_prices(config, math.log(2.0), None)
    view = RequestView(
        rid=rid,
        slot=rid,
        phase=Phase.PREFILL,
        log_prefill_price=prices.prefill_token,
        log_output_price=prices.output_token,
        prompt_remaining=64,
    )
    if blocked:
        view = dataclasses.replace(
            view, phase=Phase.BLOCKED, prerequisites=(GraphKind.INITIALIZE,), enables=Phase.PREFILL
        )
    return view


def run() -> dict:
    FLAGS.catalog = "engine-off16"
    catalog, _ = plan_path.engine_catalog("all")
    graphs = PreparedGraphs(catalog.eligible(DecodeMode.ORDINARY))
    costs = _measured(catalog)
    config = PolicyConfig()
    cases = []
    for ready in map(int, FLAGS.ready):
        views = [_prompt(i, True, config) for i in range(FLAGS.blocked)]
        views += [_prompt(FLAGS.blocked + i, False, config) for i in range(ready)]
        inp = policy.SelectionInput(views, graphs, costs, 0, config, DecodeMode.ORDINARY)
        times = []
        for i in range(FLAGS.runs + 20):
            t = time.perf_counter()
            _, rows = policy.selection_rows(inp)
            chosen = policy.select(inp, rows=rows)
            if i >= 20:
                times.append((time.perf_counter() - t) * 1e3)
        following = chosen.following.graph.name if chosen.following else None
        cases.append(
            dict(
                blocked=FLAGS.blocked,
                ready=ready,
                median_ms=round(statistics.median(times), 4),
                rows=len(rows),
                chosen=f"{chosen.graph.name} then {following}",
            )
        )
        print(json.dumps(cases[-1]), flush=True)
    return dict(cases=cases, runs=FLAGS.runs, measured=FLAGS.measured)


if __name__ == "__main__":
    run_main(run)
