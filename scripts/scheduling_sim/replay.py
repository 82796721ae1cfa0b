"""Replay a production trace through the utility scheduler and the classic baselines.

    python scripts/scheduling_sim/replay.py --trace=../shared/data/azure-llm-inference-2023-conv.csv \\
        --requests=200 --rate_scales=1,2,3,4 --json_out=/tmp/replay.json

The trace (Azure LLM inference trace format: TIMESTAMP, ContextTokens, GeneratedTokens; the 2023
conversation sample is by Patel et al., "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024, AzurePublicDataset, CC-BY 4.0) gives each request's arrival, prompt length
and output length. ``--start``/``--requests`` pick a window of consecutive rows; each rate scale
divides its arrival gaps (``helios_jax.traces``), and every scheduler runs the identical requests
at each scale with the given outputs forced (no stop token), prompts clipped to the slot context
(``--context_limit``). Speculative acceptance follows ``--acceptance_probs`` (untrained history).

Schedulers (``baselines.py``): the utility scheduler under each ``--preferences`` setting (a
preset name, or ``key=value`` overrides of the balanced preset joined by ``;``; keys ``beta``,
``f``, ``g``, ``c``, ``tv``, ``tc``, ``alpha``, ``tau``), and the baseline families ``fcfs``,
``sarathi`` and ``fcfs_fixed`` at each of ``--budgets``. Measures and goodput: ``helios_jax.slo``;
the report, the preference study and the plots: ``replay_report.py``.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402  (a sibling script module)
import replay_report  # noqa: E402
import replay_runs  # noqa: E402

from helios_jax import slo, traces  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("trace", "../shared/data/azure-llm-inference-2023-conv.csv", "Azure-format trace CSV")
flags.DEFINE_integer("start", 0, "first trace row of the window")
flags.DEFINE_integer("requests", 200, "rows in the window")
flags.DEFINE_list("rate_scales", ["1", "2", "3", "4"], "arrival-rate multipliers of the window")
flags.DEFINE_integer("context_limit", traces.CONTEXT_LIMIT, "prompt + output tokens a slot holds")
flags.DEFINE_string("catalog", "synthetic-h200", "shipped catalog name or catalog JSON path")
flags.DEFINE_list(
    "acceptance_probs",
    ["0.8", "0.7", "0.6", "0.5", "0.4", "0.3", "0.2"],
    "per-position conditional acceptance probabilities",
)
flags.DEFINE_list("preferences", ["balanced", "throughput"], "utility settings (module docstring)")
flags.DEFINE_list("baselines", ["fcfs", "sarathi", "fcfs_fixed"], "baseline families")
flags.DEFINE_list("budgets", [str(b) for b in baselines.BUDGETS], "baseline token budgets")
flags.DEFINE_integer("fixed_width", 4, "speculative width of fcfs_fixed")
flags.DEFINE_float("ttft_base_ms", slo.SloTargets.ttft_base_ms, "TTFT target: a in a + b*prompt_tokens")
flags.DEFINE_float(
    "ttft_per_token_ms", slo.SloTargets.ttft_per_prompt_token_ms, "TTFT target: b in a + b*prompt_tokens"
)
flags.DEFINE_float("gap_ms", slo.SloTargets.gap_ms, "largest allowed gap between a stream's outputs")
flags.DEFINE_float("attainment_target", slo.SloTargets.target, "attainment that counts as good service")
flags.DEFINE_float(
    "reference_scale", None, "rate scale of the latency columns (default: the highest every setting ran)"
)
flags.DEFINE_integer("seed", 0, "acceptance sampling seed")
flags.DEFINE_float("horizon_ms", 1e8, "virtual time limit per run")
flags.DEFINE_integer("workers", 1, "worker processes (each runs whole settings)")
flags.DEFINE_bool("stop_after_miss", True, "skip a setting's higher rates once one misses the target")
flags.DEFINE_string("json_out", None, "write every number here")
flags.DEFINE_string(
    "plot_out", None, "attainment against rate for every scheduler (matplotlib; the format from the suffix)"
)
flags.DEFINE_string(
    "pareto_plot_out", None, "the preference study's Pareto front (matplotlib; the format from the suffix)"
)
flags.DEFINE_string("markdown_out", None, "write the tables as Markdown here")
flags.DEFINE_string("from_json", None, "re-report and re-plot an earlier --json_out without simulating")
flags.DEFINE_string("runs_out", None, "append each run's summary here as one JSON line as it finishes")
flags.DEFINE_string("from_runs", None, "build the study from a --runs_out file (e.g. a cut-short sweep)")


def build_tasks(specs: list[baselines.SchedulerSpec], scales: list[float]) -> list[dict]:
    slo_targets = dict(
        ttft_base_ms=FLAGS.ttft_base_ms,
        ttft_per_prompt_token_ms=FLAGS.ttft_per_token_ms,
        gap_ms=FLAGS.gap_ms,
        target=FLAGS.attainment_target,
    )
    common = dict(
        trace=FLAGS.trace,
        start=FLAGS.start,
        requests=FLAGS.requests,
        context_limit=FLAGS.context_limit,
        catalog=FLAGS.catalog,
        acceptance_probs=[float(x) for x in FLAGS.acceptance_probs],
        horizon_ms=FLAGS.horizon_ms,
        seed=FLAGS.seed,
        slo=slo_targets,
        stop_after_miss=FLAGS.stop_after_miss,
    )
    return [dict(common, spec=dataclasses.asdict(s), scale=x) for s in specs for x in scales]


def execute(tasks: list[dict]) -> list[dict]:
    groups: dict = {}
    for t in tasks:
        groups.setdefault(t["spec"]["label"], []).append(t)
    print(f"{len(groups)} settings, up to {len(tasks)} simulations, {FLAGS.workers} worker(s)", flush=True)
    if FLAGS.workers > 1:
        with multiprocessing.get_context("spawn").Pool(FLAGS.workers) as pool:
            done = pool.starmap(
                replay_runs.run_setting, [(g, FLAGS.runs_out) for g in groups.values()], chunksize=1
            )
    else:
        done = [replay_runs.run_setting(g, FLAGS.runs_out) for g in groups.values()]
    return [o for outputs in done for o in outputs]


def main(argv):
    del argv
    if FLAGS.from_json:
        with open(FLAGS.from_json) as f:
            study = json.load(f)
    elif FLAGS.from_runs:
        with open(FLAGS.from_runs) as f:
            runs = [json.loads(line) for line in f if line.strip()]
        study = replay_report.study(runs, FLAGS.reference_scale, FLAGS.attainment_target)
    else:
        scales = sorted(float(x) for x in FLAGS.rate_scales)
        specs = replay_runs.scheduler_specs(
            FLAGS.preferences, FLAGS.baselines, [int(b) for b in FLAGS.budgets], FLAGS.fixed_width
        )
        t0 = time.perf_counter()
        runs = execute(build_tasks(specs, scales))
        study = replay_report.study(runs, FLAGS.reference_scale, FLAGS.attainment_target)
        study["elapsed_s"] = time.perf_counter() - t0
        study["flags"] = {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.argv[0])}
    replay_report.report(study)
    if FLAGS.json_out and not FLAGS.from_json:
        with open(FLAGS.json_out, "w") as f:
            json.dump(study, f, indent=1)
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(replay_report.markdown(study))
    if FLAGS.plot_out:
        replay_report.render(replay_report.attainment_panels(study), FLAGS.plot_out)
    if FLAGS.pareto_plot_out:
        replay_report.render(replay_report.pareto_panels(study), FLAGS.pareto_plot_out)


if __name__ == "__main__":
    app.run(main)
