"""Run the scheduling simulator: the real Scheduler with a fake executor on a virtual clock.

    python scripts/scheduling_sim/run.py --scenario=startup --requests=16 --accepted_drafts=7 \\
        --acceptance_history=preseeded --json_out=/tmp/trace.json

Durations come from the catalog (``--costs=measured`` feeds each entry one synthetic observation
before the trace starts, as the spec's measured synthetic catalog traces assume; ``cold`` leaves
them indeterminate so discovery runs; ``--acceptance_history=preseeded`` starts every request's
acceptance estimate and confidence forecast at the acceptance model's survival). Prints a one-line
summary; the JSON holds per-request first output, largest gap between visible outputs (including
the wait still open at the end) and output tokens, the progress spread over whole rotation cycles
of at least ``--rounds`` generation rounds and its window, executions and time per class, each
exploration episode's paid interval, and selections per graph kind (``helios_jax/simulation.py``
defines each measurement).
"""

from __future__ import annotations

import json

from absl import app, flags

from helios_jax import simulation
from helios_jax.catalog import Catalog, DecodeMode, shipped_catalog
from helios_jax.scheduler.config import PolicyConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("catalog", None, "catalog JSON (default: the shipped synthetic-h200)")
flags.DEFINE_enum("scenario", "startup", ["startup", "poisson"], "arrival pattern")
flags.DEFINE_integer("requests", 5, "number of requests")
flags.DEFINE_list("prompt_tokens", ["64"], "prompt lengths (cycled over requests)")
flags.DEFINE_list("output_tokens", ["100000"], "output limits (cycled over requests)")
flags.DEFINE_integer("accepted_drafts", 3, "accepted proposals per round (-1: use --acceptance_probs)")
flags.DEFINE_list("acceptance_probs", [], "per-position conditional acceptance probabilities")
flags.DEFINE_enum(
    "acceptance_history", "untrained", ["untrained", "preseeded"], "initial acceptance estimates"
)
flags.DEFINE_integer("rounds", 100, "generation rounds the spread window spans at least (whole cycles)")
flags.DEFINE_enum("policy", "balanced", ["balanced", "throughput"], "scheduler policy preset")
flags.DEFINE_enum("mode", None, ["ordinary", "fixed", "adaptive"], "decode mode (default: from the catalog)")
flags.DEFINE_enum("costs", "measured", ["measured", "cold"], "start measured or indeterminate")
flags.DEFINE_float("noise", 0.0, "log-uniform multiplicative noise on durations")
flags.DEFINE_float("arrival_rate", 10.0, "poisson arrivals per second")
flags.DEFINE_float("horizon_ms", 60_000.0, "virtual time limit")
flags.DEFINE_integer("seed", 0, "random seed")
flags.DEFINE_string("json_out", None, "write the result JSON here")


def main(argv):
    del argv
    catalog = Catalog.load(FLAGS.catalog) if FLAGS.catalog else shipped_catalog()
    config = simulation.SimConfig(
        catalog=catalog,
        scenario=FLAGS.scenario,
        requests=FLAGS.requests,
        prompt_tokens=[int(x) for x in FLAGS.prompt_tokens],
        output_tokens=[int(x) for x in FLAGS.output_tokens],
        accepted_drafts=None if FLAGS.accepted_drafts < 0 else FLAGS.accepted_drafts,
        acceptance_probs=tuple(float(x) for x in FLAGS.acceptance_probs) or None,
        acceptance_history=FLAGS.acceptance_history,
        rounds=FLAGS.rounds,
        policy=PolicyConfig.preset(FLAGS.policy),
        mode=DecodeMode(FLAGS.mode) if FLAGS.mode else None,
        costs=FLAGS.costs,
        noise=FLAGS.noise,
        arrival_rate_per_s=FLAGS.arrival_rate,
        horizon_ms=FLAGS.horizon_ms,
        seed=FLAGS.seed,
    )
    result = simulation.run(config)
    out = result.to_json()
    firsts = [r["first_output_ms"] for r in out["requests"] if r["first_output_ms"] is not None]
    gaps = [r["max_gap_ms"] for r in out["requests"]]
    print(
        json.dumps(
            {
                "requests": len(out["requests"]),
                "max_first_output_ms": max(firsts, default=None),
                "max_gap_ms": max(gaps, default=None),
                "progress_spread_tokens": out["progress_spread_tokens"],
                "spread_window": out["spread_window"],
                "virtual_ms": out["virtual_ms"],
                "executions": out["executions"],
                "selections": out["selections"],
            }
        )
    )
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    app.run(main)
