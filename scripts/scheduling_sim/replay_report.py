"""The trace replay's study: goodput per setting, best budgets, the Pareto front, tables, plots.

A *setting* is one scheduler configuration (a utility preference setting, or a baseline at one
token budget) run at every rate of the sweep. Its goodput is ``helios_jax.slo.goodput`` over
its (rate, attainment) points, the interpolated crossing. A baseline family's *best budget* is
the one with the highest goodput (then the lowest normalized TTFT p99 at the reference rate).
The preference study places every setting at (goodput: higher is better, normalized TTFT p99 and
gap p99 at the reference rate: lower is better); the Pareto front is the set no other setting
dominates, and a utility setting *dominates every baseline* when it dominates each family's best
budget (at least as good on all three, better on one).
"""

from __future__ import annotations

import dataclasses

from helios_jax import slo

AXES = ("goodput", "ttft_normalized_p99", "gap_p99_ms")
HIGHER_BETTER = (True, False, False)
ATTRIBUTION = (
    "Trace: Azure LLM inference trace 2023, conversation sample (AzurePublicDataset, CC-BY 4.0); "
    'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.'
)


def study(runs: list[dict], reference_scale: float | None, target: float) -> dict:
    """Everything the report shows, from the per-run summaries.

    The reference scale (where latencies are compared) defaults to the highest rate scale that
    every setting ran (settings stop after their first miss: ``replay.py --stop_after_miss``).
    """
    settings: dict = {}
    for r in sorted(runs, key=lambda r: r["scale"]):
        s = settings.setdefault(
            r["label"],
            {"family": r["family"], "budget": r["budget"], "runs": [], "utility": r["budget"] is None},
        )
        s["runs"].append({k: v for k, v in r.items() if k not in ("label", "family", "budget")})
    if reference_scale is None:
        reference_scale = min(max(x["scale"] for x in s["runs"]) for s in settings.values())
    for s in settings.values():
        rates = [x["rate"] for x in s["runs"]]
        s["goodput"] = slo.goodput(rates, [x["attainment"] for x in s["runs"]], target)
        s["reference"] = min(s["runs"], key=lambda x: abs(x["scale"] - reference_scale))
        if s["reference"]["scale"] != reference_scale:
            raise ValueError(f"a setting did not run at the reference scale {reference_scale}")
    best = best_budgets(settings)
    points = {label: point(s) for label, s in settings.items() if s["utility"] or label in best.values()}
    front = slo.pareto_front(points, HIGHER_BETTER)
    dominance = {
        label: [b for b in best.values() if not slo.dominates(points[label], points[b], HIGHER_BETTER)]
        for label, s in settings.items()
        if s["utility"]
    }
    return {
        "settings": settings,
        "best": best,
        "points": points,
        "front": front,
        "not_dominated": dominance,  # utility setting -> best baselines it does not dominate
        "reference_scale": reference_scale,
        "target": target,
        "attribution": ATTRIBUTION,
    }


def point(setting: dict) -> tuple[float, float, float]:
    ref = setting["reference"]
    return (setting["goodput"]["interpolated"], ref["ttft_normalized_p99"], ref["gap_p99_ms"])


def best_budgets(settings: dict) -> dict:
    """Baseline family -> the label of its best budget (module docstring)."""
    out = {}
    for fam in sorted({s["family"] for s in settings.values() if not s["utility"]}):
        group = [(label, s) for label, s in settings.items() if s["family"] == fam]
        out[fam] = max(
            group, key=lambda x: (x[1]["goodput"]["interpolated"], -x[1]["reference"]["ttft_normalized_p99"])
        )[0]
    return out


def shown(st: dict) -> list[str]:
    """Every utility setting and each baseline family's best budget, in study order."""
    return [label for label, s in st["settings"].items() if s["utility"] or label in st["best"].values()]


def _goodput_text(g: dict) -> str:
    return f"{g['interpolated']:.2f}" + ("" if g["bounded"] else "+")


def report(st: dict) -> None:
    print(f"\nreference scale x{st['reference_scale']:g}; best budgets: {st['best']}")
    for label in st["settings"]:
        s = st["settings"][label]
        ref = s["reference"]
        atts = " ".join(f"{x['rate']:.1f}:{x['attainment']:.2f}" for x in s["runs"])
        print(
            f"  {label:24s} goodput {_goodput_text(s['goodput']):>6s} req/s  [{atts}]  at ref: "
            f"ttft/target p99 {ref['ttft_normalized_p99']:.2f}, gap p99 {ref['gap_p99_ms']:.1f} ms"
        )
    print(f"Pareto front: {st['front']}")
    beating = [k for k, v in st["not_dominated"].items() if not v]
    print(f"utility settings dominating every best baseline: {beating or 'none'}")


def markdown(st: dict) -> str:
    """The goodput table, the reference-rate table by prompt bucket and the dominance table."""
    rates = sorted({x["rate"] for s in st["settings"].values() for x in s["runs"]})
    lines = [
        st.get("attribution", ATTRIBUTION),
        "",
        "| setting | goodput (req/s) | " + " | ".join(f"{r:.2f}" for r in rates) + " | on front |",
        "| --- | ---: |" + " ---: |" * len(rates) + " :---: |",
    ]
    for label in shown(st):
        s = st["settings"][label]
        got = {x["rate"]: x["attainment"] for x in s["runs"]}
        cells = " | ".join(f"{got[r]:.3f}" if r in got else "–" for r in rates)
        lines.append(
            f"| {label} | {_goodput_text(s['goodput'])} | {cells} | {'yes' if label in st['front'] else ''} |"
        )
    ref_rate = next(iter(st["settings"].values()))["reference"]["rate"]
    lines += ["", f"At the reference rate ({ref_rate:.2f} req/s):", ""]
    buckets = list(next(iter(st["settings"].values()))["reference"]["by_prompt"])
    lines.append(
        "| setting | attainment (TTFT / gap) | TTFT p50 | TTFT p99 | TTFT/target p99 | gap p50 | gap p99 | "
        "norm. latency mean (ms/token) | Jain | " + " | ".join(f"TTFT p99 {b}" for b in buckets) + " |"
    )
    lines.append("| --- | --- |" + " ---: |" * (7 + len(buckets)))
    for label in shown(st):
        r = st["settings"][label]["reference"]
        lines.append(
            f"| {label} | {r['attainment']:.3f} ({r['ttft_attainment']:.3f} / {r['gap_attainment']:.3f}) | "
            f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['ttft_normalized_p99']:.2f} | "
            f"{r['gap_p50_ms']:.1f} | {r['gap_p99_ms']:.1f} | {r['normalized_latency_mean_ms']:.1f} | "
            f"{r['jain']:.3f} | " + " | ".join(_ms(r["by_prompt"][b]["ttft_p99_ms"]) for b in buckets) + " |"
        )
    lines += ["", "| utility setting | best baselines it does not dominate |", "| --- | --- |"]
    for label, rest in st["not_dominated"].items():
        lines.append(f"| {label} | {', '.join(rest) or '**none: dominates every baseline**'} |")
    return "\n".join(lines) + "\n"


def _ms(x) -> str:
    return "–" if x is None else f"{x:.0f}"


@dataclasses.dataclass(frozen=True)
class Series:
    """One plotted series."""

    name: str
    points: list  # (x, y) pairs
    color: str = "black"
    line: bool = True
    dashed: bool = False
    width: float = 1.5
    labels: list | None = None  # text beside each point
    ring: list | None = None  # per point: draw a ring around it


def _style(label: str, utility: bool) -> dict:
    if label == "balanced":
        return dict(color="black", dashed=False, width=2.0)
    if utility:
        return dict(color="#999999", dashed=True, width=0.8)
    color = {"fcfs": "#d62728", "sarathi": "#1f77b4"}.get(label.split("@")[0], "#ff7f0e")
    return dict(color=color, dashed=False, width=1.5)


def attainment_panels(st: dict) -> list[dict]:
    """Attainment against offered rate: every utility setting and each family's best budget."""
    series = []
    for label in shown(st):
        s = st["settings"][label]
        name = label if s["utility"] else f"{label} (best budget)"
        pts = [(x["rate"], x["attainment"]) for x in s["runs"]]
        series.append(Series(name, pts, **_style(label, s["utility"])))
    return [
        dict(
            series=series,
            title="SLO attainment against load, trace replay",
            xlabel="offered load (requests/s)",
            ylabel="SLO attainment",
            hline=st["target"],
        )
    ]


def pareto_panels(st: dict) -> list[dict]:
    """Goodput against normalized TTFT p99 and against gap p99; the front ringed."""
    ref_rate = next(iter(st["settings"].values()))["reference"]["rate"]
    panels = []
    for axis, title in [(1, "TTFT / target, p99"), (2, "gap p99 (ms)")]:
        series = []
        for label, p in st["points"].items():
            s = st["settings"][label]
            style = dict(_style(label, s["utility"]), line=False)
            ring = [label in st["front"]]
            series.append(Series(label, [(p[axis], p[0])], labels=[label], ring=ring, **style))
        panels.append(
            dict(
                series=series,
                title=f"goodput against {title} at {ref_rate:.2f} req/s (ringed: Pareto front)",
                xlabel=f"{title} at {ref_rate:.2f} req/s",
                ylabel="goodput (req/s at the attainment target)",
                legend=False,
            )
        )
    return panels


def render(panels: list[dict], path: str) -> None:
    """The panels side by side, in matplotlib's format for the path's suffix (the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, p in zip(axes[0], panels):
        for s in p["series"]:
            xs, ys = [x for x, _ in s.points], [y for _, y in s.points]
            ls = ("--" if s.dashed else "-") if s.line else ""
            ax.plot(xs, ys, color=s.color, ls=ls, lw=s.width, marker="o", ms=4, label=s.name)
            for i, (x, y) in enumerate(s.points):
                if s.ring and s.ring[i]:
                    ax.scatter([x], [y], facecolors="none", edgecolors="green", s=110)
                if s.labels:
                    ax.annotate(s.labels[i], (x, y), fontsize=5, xytext=(3, 2), textcoords="offset points")
        if p.get("hline") is not None:
            ax.axhline(p["hline"], color="0.3", lw=0.8, ls=":")
        ax.set(title=p["title"], xlabel=p["xlabel"], ylabel=p["ylabel"])
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
        if p.get("legend", True):
            ax.legend(fontsize=6, ncol=2)
    fig.text(0.01, 0.005, ATTRIBUTION, fontsize=5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=90)
