"""Compare the utility scheduler with classic baselines in the simulator (Poisson arrivals).

    python scripts/scheduling_sim/compare.py --json_out=/tmp/compare.json \\
        --plot_out=docs/img/policy-latency-vs-load.png

Every scheduler runs the same workloads: for each load (requests per second) and seed, Poisson
arrivals of ``--requests`` requests whose prompt and output lengths are drawn uniformly and
independently from ``--prompt_tokens`` and ``--output_tokens``; speculative acceptance follows
per-position conditional probabilities ``--acceptance_probs`` (untrained acceptance history:
the schedulers learn it). Durations are the catalog's measured ones (no noise). Schedulers
(``baselines.py``):

- ``balanced``, ``throughput``: the utility scheduler with that policy preset in the catalog's
  mode (adaptive for speculative catalogs);
- ``fixed``: the utility scheduler in fixed mode at ``--fixed_width``;
- ``fcfs@B``: FCFS prefill-first continuous batching with token budget B (width-one decode);
- ``sarathi@B``: stall-free chunked prefill with token budget B (mixed programs);
- ``fcfs_w<W>@B``: FCFS prefill first with every decode step at fixed speculative width W.

Metrics, per scheduler and load (pooled over seeds unless stated):

- throughput: output tokens / (last completion - first arrival), tokens/s, mean over seeds;
- TTFT: first visible output - arrival (includes waiting for a request slot), ms;
- gap: time between consecutive visible outputs (bursts) of one request, ms;
- Jain's index over per-request decode rates (output tokens - 1) / (finish - first output),
  requests with at least two bursts, computed per seed then averaged;
- what the scheduler committed (plans per kind, share of expected time, mean prompt tokens per
  plan, decode lanes per plan, rows per decode lane).

Best baseline setting per load: among a family's budgets, those within ``--throughput_slack``
(5%) of the family's best throughput; of those the lowest TTFT p99 (then the lowest gap p99).
The goal check compares the balanced policy with the best FCFS and the best stall-free setting:
lower TTFT p99 and gap p99 at equal or higher throughput (``--equal_throughput``: at least 99%).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402  (a sibling script module)

from helios_jax import simulation  # noqa: E402
from helios_jax.catalog import Catalog, DecodeMode, shipped_catalog  # noqa: E402
from helios_jax.scheduler.config import PolicyConfig  # noqa: E402
from helios_jax.slo import jain, percentile  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("catalogs", ["synthetic-h200"], "shipped catalog names or catalog JSON paths")
flags.DEFINE_list("loads", ["4", "7", "10", "13", "16", "24"], "arrival rates, requests per second")
flags.DEFINE_integer("seeds", 3, "seeds per load (workloads 0..seeds-1)")
flags.DEFINE_integer("requests", 60, "requests per run")
flags.DEFINE_list("prompt_tokens", ["64", "512", "2048", "6000"], "prompt lengths (drawn uniformly)")
flags.DEFINE_list("output_tokens", ["16", "128", "512"], "output limits (drawn uniformly)")
flags.DEFINE_list(
    "acceptance_probs",
    ["0.8", "0.7", "0.6", "0.5", "0.4", "0.3", "0.2"],
    "per-position conditional acceptance probabilities",
)
flags.DEFINE_list("budgets", [str(b) for b in baselines.BUDGETS], "baseline token budgets")
flags.DEFINE_list(
    "fixed_budgets", None, "token budgets of the fixed-width FCFS baseline (default: --budgets)"
)
flags.DEFINE_integer("fixed_width", 4, "speculative width of the fixed-width schedulers")
flags.DEFINE_list(
    "schedulers",
    ["balanced", "throughput", "fixed", "fcfs", "sarathi", "fcfs_fixed"],
    "scheduler families to run",
)
flags.DEFINE_float("throughput_slack", 0.05, "best setting: within this fraction of the best throughput")
flags.DEFINE_float(
    "equal_throughput", 0.99, "goal check: 'equal or higher' throughput means at least this ratio"
)
flags.DEFINE_integer("workers", 1, "worker processes")
flags.DEFINE_float("horizon_ms", 1e7, "virtual time limit per run")
flags.DEFINE_string("json_out", None, "write every number here")
flags.DEFINE_string("plot_out", None, "PNG: TTFT p99, gap p99 and throughput against load")
flags.DEFINE_string("sweep_plot_out", None, "PNG: TTFT p99 against gap p99 of every setting, per load")
flags.DEFINE_string("markdown_out", None, "write the per-load and per-setting tables as Markdown here")
flags.DEFINE_list(
    "from_json", None, "re-report and re-plot earlier --json_out files (merged) without simulating"
)
flags.DEFINE_bool("per_request", False, "also write per-request first output, gaps count and rates")


def load_catalog(name: str) -> Catalog:
    return Catalog.load(name) if name.endswith(".json") else shipped_catalog(name)


def specs(catalog: Catalog, families, budgets, fixed_budgets, width) -> list[baselines.SchedulerSpec]:
    out = []
    speculative = catalog.mode == "speculative"
    for fam in families:
        if fam in ("balanced", "throughput"):
            out.append(baselines.SchedulerSpec(fam, "utility", policy=fam))
        elif fam == "fixed" and speculative:
            out.append(baselines.SchedulerSpec(f"fixed_w{width}", "utility", fixed_width=width, mode="fixed"))
        elif fam in ("fcfs", "sarathi"):
            out += [baselines.SchedulerSpec(f"{fam}@{b}", fam, token_budget=b) for b in budgets]
        elif fam == "fcfs_fixed" and speculative:
            out += [
                baselines.SchedulerSpec(f"fcfs_w{width}@{b}", "fcfs_fixed", token_budget=b, fixed_width=width)
                for b in fixed_budgets
            ]
    return out


def workload(seed: int, n: int, prompts, outputs) -> tuple[list[int], list[int]]:
    """Per-request prompt and output lengths (independent of the arrival stream)."""
    rng = np.random.default_rng([seed, 7919])
    return rng.choice(prompts, n).tolist(), rng.choice(outputs, n).tolist()


def run_one(task: dict) -> dict:
    """One simulation: returns per-run summary plus raw samples for pooling."""
    catalog = load_catalog(task["catalog"])
    spec = baselines.SchedulerSpec(**task["spec"])
    prompts, outputs = workload(task["seed"], task["requests"], task["prompt_tokens"], task["output_tokens"])
    config = simulation.SimConfig(
        catalog=catalog,
        scenario="poisson",
        requests=task["requests"],
        prompt_tokens=prompts,
        output_tokens=outputs,
        accepted_drafts=None,
        acceptance_probs=tuple(task["acceptance_probs"]),
        policy=PolicyConfig.preset(spec.policy),
        mode=DecodeMode(spec.mode) if spec.mode else None,
        fixed_width=spec.fixed_width,
        arrival_rate_per_s=task["load"],
        horizon_ms=task["horizon_ms"],
        seed=task["seed"],
        rounds=10**9,
    )
    t0 = time.perf_counter()
    result, sched = baselines.simulate(config, baselines.factory(spec))
    wall = time.perf_counter() - t0
    reqs = result.requests
    done = [r for r in reqs if r.finished_ms is not None]
    ttft = [r.first_output_ms for r in reqs if r.first_output_ms is not None]
    gaps = np.concatenate([np.diff(r.publications) for r in reqs] + [np.zeros(0)])
    rates = [
        (r.output_tokens - 1) / ((r.finished_ms - r.arrival_ms - r.first_output_ms) / 1e3)
        for r in done
        if len(r.publications) >= 2
    ]
    span_ms = max(r.finished_ms for r in done) - min(r.arrival_ms for r in reqs) if done else math.nan
    tokens = sum(r.output_tokens for r in reqs)
    out = {
        "catalog": catalog.name,
        "label": spec.label,
        "family": spec.family,
        "budget": spec.token_budget,
        "load": task["load"],
        "seed": task["seed"],
        "requests": len(reqs),
        "completed": len(done),
        "output_tokens": tokens,
        "span_ms": span_ms,
        "throughput_tok_s": tokens / span_ms * 1e3,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "ttft_max_ms": max(ttft),
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
        "gap_max_ms": float(gaps.max()) if gaps.size else None,
        "jain": jain(rates),
        "plans": sum(sched.kind_counts.values()),
        "wall_s": wall,
        "chosen": sched.summary(),
        "executions": result.executions,
        "ttft_by_prompt_ms": {
            str(p): {"p50": percentile(v, 50), "max": max(v)}
            for p in sorted(set(prompts))
            if (v := [r.first_output_ms for r in reqs if r.prompt_tokens == p])
        },
    }
    raw = {
        "ttft": np.asarray(ttft),
        "gaps": gaps.astype(np.float32),
        "rates": np.asarray(rates),
        "prompt": np.array([r.prompt_tokens for r in reqs]),
    }
    if task.get("per_request"):
        out["per_request"] = [
            {
                "arrival_ms": r.arrival_ms,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "first_output_ms": r.first_output_ms,
                "finished_ms": r.finished_ms,
                "bursts": len(r.publications),
                "max_gap_ms": r.max_gap_ms,
            }
            for r in reqs
        ]
    return {"summary": out, "raw": raw}


def aggregate(runs: list[dict]) -> dict:
    """Pooled statistics of one scheduler at one load over its seeds."""
    s = [r["summary"] for r in runs]
    ttft = np.concatenate([r["raw"]["ttft"] for r in runs])
    gaps = np.concatenate([r["raw"]["gaps"] for r in runs])
    thr = [x["throughput_tok_s"] for x in s]
    by_kind: dict = {}
    for x in s:
        for kind, v in x["chosen"]["by_kind"].items():
            by_kind.setdefault(kind, []).append(v)
    chosen = {k: {f: float(np.mean([v[f] for v in vs])) for f in vs[0]} for k, vs in by_kind.items()}
    # every committed plan was checked by baselines.plan_violations (legal program, capacities, budget)
    prompts = np.concatenate([r["raw"]["prompt"] for r in runs])
    return {
        "label": s[0]["label"],
        "family": s[0]["family"],
        "budget": s[0]["budget"],
        "load": s[0]["load"],
        "seeds": len(s),
        "requests": sum(x["requests"] for x in s),
        "completed": sum(x["completed"] for x in s),
        "throughput_tok_s": float(np.mean(thr)),
        "throughput_min": float(min(thr)),
        "throughput_max": float(max(thr)),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "ttft_p99_per_seed_ms": [x["ttft_p99_ms"] for x in s],
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
        "gap_p99_per_seed_ms": [x["gap_p99_ms"] for x in s],
        "gap_p999_ms": percentile(gaps, 99.9),
        "gap_max_ms": float(gaps.max()) if gaps.size else None,
        "gaps": int(gaps.size),
        "jain": float(np.mean([x["jain"] for x in s if x["jain"] is not None])),
        "ttft_p99_by_prompt_ms": {
            str(int(p)): percentile(ttft[prompts == p], 99) for p in sorted(set(prompts))
        },
        "plans": sum(x["plans"] for x in s),
        "wall_s": sum(x["wall_s"] for x in s),
        "chosen": chosen,
        "violations": sum(x["chosen"]["violations"] for x in s),
    }


def best_settings(rows: list[dict], slack: float) -> dict:
    """family -> the best setting (rule in the module docstring) among `rows` at one load."""
    out = {}
    families = sorted({r["family"] for r in rows})
    for fam in families:
        group = [r for r in rows if r["family"] == fam]
        top = max(r["throughput_tok_s"] for r in group)
        eligible = [r for r in group if r["throughput_tok_s"] >= (1 - slack) * top]
        out[fam] = min(eligible, key=lambda r: (r["ttft_p99_ms"], r["gap_p99_ms"]))["label"]
    return out


def goal_check(rows: list[dict], best: dict, equal: float) -> dict | None:
    """The balanced policy against the best FCFS and stall-free settings at one load."""
    by = {r["label"]: r for r in rows}
    bal = by.get("balanced")
    if bal is None:
        return None
    out = {}
    for fam in ("fcfs", "sarathi"):
        if fam not in best:
            continue
        b = by[best[fam]]
        out[fam] = {
            "against": b["label"],
            "ttft_p99_lower": bal["ttft_p99_ms"] < b["ttft_p99_ms"],
            "gap_p99_lower": bal["gap_p99_ms"] < b["gap_p99_ms"],
            "throughput_ratio": bal["throughput_tok_s"] / b["throughput_tok_s"],
            "throughput_ok": bal["throughput_tok_s"] >= equal * b["throughput_tok_s"],
        }
        out[fam]["met"] = (
            out[fam]["ttft_p99_lower"] and out[fam]["gap_p99_lower"] and out[fam]["throughput_ok"]
        )
        # Any single setting of the family that beats balanced on all three?
        out[fam]["dominated_by"] = [
            r["label"]
            for r in rows
            if r["family"] == fam
            and r["ttft_p99_ms"] <= bal["ttft_p99_ms"]
            and r["gap_p99_ms"] <= bal["gap_p99_ms"]
            and r["throughput_tok_s"] >= equal * bal["throughput_tok_s"]
        ]
    out["met"] = all(v["met"] for v in out.values())
    return out


def _save(fig, path: str) -> None:
    """PNG with an adaptive 96-colour palette (a few tens of kB for the docs)."""
    import io as _io

    from PIL import Image

    buf = _io.BytesIO()
    fig.savefig(buf, dpi=80, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=96, method=Image.Quantize.FASTOCTREE).save(
        path, optimize=True
    )


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    catalogs = list(results)
    fig, axes = plt.subplots(len(catalogs), 3, figsize=(13, 3.6 * len(catalogs)), squeeze=False)
    styles = {
        "balanced": ("k", "o", "-"),
        "throughput": ("0.45", "s", "--"),
        "fcfs_w": ("tab:orange", "x", ":"),
        "fcfs": ("tab:red", "v", "-"),
        "sarathi": ("tab:blue", "^", "-"),
        "fixed_w": ("tab:green", "D", "--"),
    }
    for row, name in enumerate(catalogs):
        res = results[name]
        loads = sorted(float(x) for x in res["per_load"])
        lines: dict = {}
        for load in loads:
            entry = res["per_load"][str(load)]
            by = {r["label"]: r for r in entry["schedulers"]}
            shown = {r["family"]: r["label"] for r in entry["schedulers"] if r["budget"] is None}
            shown.update(entry["best"])
            for fam, label in shown.items():
                lines.setdefault(fam, []).append((load, by[label]))
        for col, (key, title) in enumerate(
            [
                ("ttft_p99_ms", "TTFT p99 (ms)"),
                ("gap_p99_ms", "inter-output gap p99 (ms)"),
                ("throughput_tok_s", "throughput (output tokens/s)"),
            ]
        ):
            ax = axes[row][col]
            for fam, pts in lines.items():
                color, marker, ls = next(
                    (v for k, v in styles.items() if fam.startswith(k)), ("0.5", ".", "-")
                )
                label = (
                    fam
                    if fam in ("balanced", "throughput") or fam.startswith("fixed")
                    else f"{fam} (best budget)"
                )
                ax.plot(
                    [p[0] for p in pts],
                    [p[1][key] for p in pts],
                    color=color,
                    marker=marker,
                    ls=ls,
                    label=label,
                    ms=4,
                    lw=1.2,
                )
            if key != "throughput_tok_s":
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
                ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("load (requests/s)")
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            if col == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def sweep_plot(results: dict, path: str) -> None:
    """Per load: TTFT p99 against gap p99 for every setting (budgets labelled), one row per catalog."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    catalogs = list(results)
    loads = sorted(float(x) for x in results[catalogs[0]]["per_load"])
    fig, axes = plt.subplots(
        len(catalogs), len(loads), figsize=(2.6 * len(loads), 2.8 * len(catalogs)), squeeze=False
    )
    colors = {"balanced": "k", "throughput": "0.45", "fcfs": "tab:red", "sarathi": "tab:blue"}
    for row, name in enumerate(catalogs):
        for col, load in enumerate(loads):
            ax = axes[row][col]
            for r in results[name]["per_load"][str(load)]["schedulers"]:
                fam = r["family"]
                color = colors.get(fam, "tab:orange" if fam.startswith("fcfs_w") else "tab:green")
                marker = "o" if r["budget"] is None else "."
                ax.scatter(
                    r["ttft_p99_ms"],
                    r["gap_p99_ms"],
                    color=color,
                    marker=marker,
                    s=22 if marker == "o" else 30,
                )
                if r["budget"] is not None:
                    ax.annotate(
                        str(r["budget"]),
                        (r["ttft_p99_ms"], r["gap_p99_ms"]),
                        fontsize=5,
                        color=color,
                        xytext=(2, 1),
                        textcoords="offset points",
                    )
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"{name} @ {load:g} req/s", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3, which="both")
            if col == 0:
                ax.set_ylabel("gap p99 (ms)", fontsize=7)
            ax.set_xlabel("TTFT p99 (ms)", fontsize=7)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=k) for k, c in colors.items()]
    handles += [
        plt.Line2D([], [], color="tab:orange", marker=".", ls="", label="fcfs_w (fixed width)"),
        plt.Line2D([], [], color="tab:green", marker="o", ls="", label="fixed_w (utility, fixed mode)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _save(fig, path)


def report(results: dict) -> None:
    for name, res in results.items():
        print(f"\n== {name}")
        for load, entry in res["per_load"].items():
            print(
                f"-- load {load} req/s (best: {entry['best']}; goal met: "
                f"{None if entry['goal'] is None else entry['goal']['met']})"
            )
            shown = [
                r for r in entry["schedulers"] if r["budget"] is None or r["label"] in entry["best"].values()
            ]
            for r in shown:
                print(
                    f"   {r['label']:16s} thr={r['throughput_tok_s']:7.0f}  ttft p50={r['ttft_p50_ms']:7.1f} "
                    f"p99={r['ttft_p99_ms']:7.1f}  gap p50={r['gap_p50_ms']:5.1f} p99={r['gap_p99_ms']:6.1f}"
                    f"  jain={r['jain']:.3f}  done={r['completed']}/{r['requests']}"
                    + (f"  ILLEGAL PLANS={r['violations']}" if r.get("violations") else "")
                )


def markdown(results: dict) -> str:
    """The per-load tables of docs/benchmarks-policy.md."""
    lines = []
    for name, res in results.items():
        lines.append(f"### {name}\n")
        for load, entry in res["per_load"].items():
            best = entry["best"]
            lines.append(
                f"**{float(load):g} requests/s** (best budgets: "
                + ", ".join(f"{k} {v.split('@')[1]}" for k, v in sorted(best.items()))
                + ")\n"
            )
            lines.append(
                "| scheduler | throughput (tok/s) | TTFT p50 (ms) | TTFT p99 (ms) | gap p50 (ms) | gap p99 "
                "(ms) | Jain |"
            )
            lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            shown = [r for r in entry["schedulers"] if r["budget"] is None or r["label"] in best.values()]
            for r in shown:
                lines.append(
                    f"| {r['label']} | {r['throughput_tok_s']:.0f} | {r['ttft_p50_ms']:.1f} | "
                    f"{r['ttft_p99_ms']:.1f} | {r['gap_p50_ms']:.1f} | {r['gap_p99_ms']:.1f} | "
                    f"{r['jain']:.3f} |"
                )
            goal = entry["goal"]
            if goal:
                parts = []
                for fam in ("fcfs", "sarathi"):
                    if fam in goal:
                        g = goal[fam]
                        parts.append(
                            f"vs {g['against']}: TTFT p99 {'lower' if g['ttft_p99_lower'] else 'higher'}, "
                            f"gap p99 {'lower' if g['gap_p99_lower'] else 'higher'}, throughput "
                            f"x{g['throughput_ratio']:.2f}"
                        )
                lines.append(f"\nGoal {'met' if goal['met'] else 'not met'}: " + "; ".join(parts) + ".\n")
            else:
                lines.append("")
    return "\n".join(lines)


def sweep_table(results: dict) -> str:
    """TTFT p99 / gap p99 / throughput of every budget setting, one table per catalog."""
    lines = []
    for name, res in results.items():
        loads = list(res["per_load"])
        labels = [r["label"] for r in res["per_load"][loads[0]]["schedulers"]]
        lines.append(f"### {name}: every setting (TTFT p99 ms / gap p99 ms / throughput tok/s)\n")
        lines.append("| setting | " + " | ".join(f"{float(load):g} req/s" for load in loads) + " |")
        lines.append("| --- |" + " ---: |" * len(loads))
        for label in labels:
            cells = []
            for load in loads:
                r = next(x for x in res["per_load"][load]["schedulers"] if x["label"] == label)
                cells.append(f"{r['ttft_p99_ms']:.0f} / {r['gap_p99_ms']:.0f} / {r['throughput_tok_s']:.0f}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plots(results: dict) -> None:
    if FLAGS.markdown_out:
        with open(FLAGS.markdown_out, "w") as f:
            f.write(markdown(results) + "\n\n" + sweep_table(results) + "\n")
    if FLAGS.plot_out:
        plot(results, FLAGS.plot_out)
    if FLAGS.sweep_plot_out:
        sweep_plot(results, FLAGS.sweep_plot_out)


def main(argv):
    del argv
    if FLAGS.from_json:
        results = {}
        for path in FLAGS.from_json:
            with open(path) as f:
                results.update(json.load(f)["results"])
        report(results)
        plots(results)
        return
    budgets = [int(b) for b in FLAGS.budgets]
    fixed_budgets = [int(b) for b in (FLAGS.fixed_budgets or FLAGS.budgets)]
    loads = [float(x) for x in FLAGS.loads]
    tasks = []
    for name in FLAGS.catalogs:
        catalog = load_catalog(name)
        for spec in specs(catalog, FLAGS.schedulers, budgets, fixed_budgets, FLAGS.fixed_width):
            for load in loads:
                for seed in range(FLAGS.seeds):
                    tasks.append(
                        {
                            "catalog": name,
                            "spec": dataclasses.asdict(spec),
                            "load": load,
                            "seed": seed,
                            "requests": FLAGS.requests,
                            "horizon_ms": FLAGS.horizon_ms,
                            "prompt_tokens": [int(x) for x in FLAGS.prompt_tokens],
                            "output_tokens": [int(x) for x in FLAGS.output_tokens],
                            "acceptance_probs": [float(x) for x in FLAGS.acceptance_probs],
                            "per_request": FLAGS.per_request,
                        }
                    )
    t0 = time.perf_counter()
    print(f"{len(tasks)} simulations on {FLAGS.workers} worker(s)", flush=True)
    if FLAGS.workers > 1:
        with multiprocessing.get_context("spawn").Pool(FLAGS.workers) as pool:
            outputs = pool.map(run_one, tasks, chunksize=1)
    else:
        outputs = []
        for i, t in enumerate(tasks):
            outputs.append(run_one(t))
            if (i + 1) % 20 == 0:
                print(f"  {i + 1}/{len(tasks)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    results = {}
    for name in FLAGS.catalogs:
        mine = [(t, o) for t, o in zip(tasks, outputs) if t["catalog"] == name]
        per_load = {}
        for load in loads:
            groups: dict = {}
            for t, o in mine:
                if t["load"] == load:
                    groups.setdefault(t["spec"]["label"], []).append(o)
            rows = [aggregate(g) for g in groups.values()]
            best = best_settings([r for r in rows if r["budget"] is not None], FLAGS.throughput_slack)
            per_load[str(load)] = {
                "schedulers": rows,
                "best": best,
                "goal": goal_check(rows, best, FLAGS.equal_throughput),
            }
        results[load_catalog(name).name] = {"per_load": per_load, "runs": [o["summary"] for _, o in mine]}
    elapsed = time.perf_counter() - t0
    simulated_s = sum(o["summary"]["wall_s"] for o in outputs)
    report(results)
    print(f"\n{len(tasks)} simulations in {elapsed:.0f} s wall ({simulated_s:.0f} s summed over workers)")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                {
                    "flags": {
                        k: FLAGS[k].value
                        for k in (
                            "catalogs",
                            "loads",
                            "seeds",
                            "requests",
                            "prompt_tokens",
                            "output_tokens",
                            "acceptance_probs",
                            "budgets",
                            "fixed_budgets",
                            "fixed_width",
                            "schedulers",
                            "throughput_slack",
                            "equal_throughput",
                            "horizon_ms",
                        )
                    },
                    "elapsed_s": elapsed,
                    "simulation_s": simulated_s,
                    "results": results,
                },
                f,
                indent=1,
            )
    plots(results)


if __name__ == "__main__":
    app.run(main)
