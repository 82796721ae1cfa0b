"""Conformance checks against a measured catalog, each with a verdict and the figure behind it.

Verdicts: ``pass``, ``fail``, ``n/a`` (the catalog lacks what the check needs) and
``not achievable`` (the catalog's own measured costs make the bound impossible, whatever the
scheduler does: for example sixteen 64-token prompts whose fastest prompt program takes 8 ms
cannot all see a first output within 100 ms, nor can sixteen requests on a catalog of eight
request slots). Only ``fail`` fails the run.

:func:`generated_startup` runs the startup traces over a seeded family of generated catalogs
(:mod:`helios_jax.catalog_family`) and :func:`tally` sums the verdicts: the property is over the
family, not the two shipped catalogs.

`Result` and the verdicts live in :mod:`helios_jax.conformance.result`; the numerics section's
checks (kernels and the model against their oracles) in :mod:`helios_jax.conformance.numerics`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable

import numpy as np

from helios_jax import catalog_family, simulation
from helios_jax.catalog import Catalog, GraphKind
from helios_jax.conformance.numerics import numeric_checks
from helios_jax.conformance.result import VERDICTS, Result
from helios_jax.reference import crosscheck
from helios_jax.scheduler.config import PolicyConfig

FIRST_OUTPUT_MS, GAP_MS, SPREAD_TOKENS = 100.0, 150.0, 8


def catalog_checks(catalog: Catalog) -> list[Result]:
    kinds = sorted({g.kind.value for g in catalog.graphs})
    measured = sum(1 for g in catalog.graphs if g.duration_ms is not None)
    verdict = "pass" if measured == len(catalog.graphs) else "fail"
    return [
        Result(
            "catalog",
            "contracts and measurements",
            verdict,
            f"{len(catalog.graphs)} programs ({', '.join(kinds)}), {measured} measured",
            ("speculative-coverage/extents-explicit", "mixed-execution/batch-range"),
        )
    ]


def selection_checks(catalog: Catalog, cases: int, seed: int) -> list[Result]:
    report = crosscheck.run(catalog, cases, seed=seed, max_requests=5, noise=0.15)
    verdict = "pass" if report.mismatches == 0 else "fail"
    return [
        Result(
            "selection",
            "production selector vs exhaustive enumeration",
            verdict,
            f"{report.cases} cases, {report.exact_cases} exact comparisons, {report.mismatches} mismatches, "
            f"worst bounded gap {report.worst_relative_gap:.3g}",
            ("verification/mixed-exhaustive", "useful-service/constrained-ragged"),
        )
    ]


def _prompt_ms(catalog: Catalog, tokens: int) -> float | None:
    """The least device time per `tokens`-token prompt over the measured prompt programs: prefill
    (one request's chunk) and mixed (one prompt row beside B - 1 decode rows), times the executions
    one prompt needs where a program's prompt capacity is smaller."""
    options = []
    for g in catalog.graphs:
        capacity = (
            g.token_capacity
            if g.kind is GraphKind.PREFILL
            else (g.prefill_capacity if g.kind is GraphKind.MIXED else 0)
        )
        if g.duration_ms is not None and capacity > 0:
            options.append(g.duration_ms * math.ceil(tokens / capacity))
    return min(options, default=None)


def _decode_rows(g) -> int:
    """Streams with output that one generation round can serve (a mixed graph's first row is its
    prompt row)."""
    return g.batch_capacity - 1 if g.kind is GraphKind.MIXED else g.batch_capacity


def _generation_graphs(catalog: Catalog):
    return [
        g
        for g in catalog.graphs
        if g.duration_ms is not None and g.kind.is_generation and _decode_rows(g) >= 1
    ]


def _fastest_round_ms(catalog: Catalog) -> float | None:
    """The fastest measured generation round: decode, speculative or mixed."""
    return min((g.duration_ms for g in _generation_graphs(catalog)), default=None)


def _rotation_ms(catalog: Catalog, streams: int) -> float | None:
    """A lower bound on the device time that serves each of `streams` streams once: at the best
    rate of streams served per millisecond any generation program offers."""
    rates = [min(_decode_rows(g), streams) / g.duration_ms for g in _generation_graphs(catalog)]
    return streams / max(rates) if rates else None


def startup_achievability(catalog: Catalog, requests: int, prompt_tokens: int = 64) -> str | None:
    """Why the catalog's own costs rule out the startup bounds for `requests` prompts at t=0 (None
    when nothing does). Only certain impossibilities count:

    - more requests than request slots: the others cannot be admitted at t=0, and no slot frees
      while every stream keeps generating, so they never see a first output;
    - the first-output bound: the device runs one execution at a time, so the last of `requests`
      prompts cannot finish before `requests` x the least time per prompt;
    - the gap bound: a stream's consecutive outputs come from different rounds, at least the
      fastest generation round apart, and over a long run every stream must be served once per
      150 ms, which needs a rotation (every stream served once at the best streams-per-ms rate of
      any generation program, mixed included) shorter than 150 ms.
    """
    if requests > catalog.request_slots:
        return (
            f"{requests} requests > {catalog.request_slots} request slots: the requests beyond the slot "
            "count cannot be admitted at t=0 and no slot frees during the trace"
        )
    prompt_ms = _prompt_ms(catalog, prompt_tokens)
    round_ms = _fastest_round_ms(catalog)
    if prompt_ms is None or round_ms is None:
        return None  # nothing to run the trace on: n/a, not a bound the costs rule out
    if requests * prompt_ms > FIRST_OUTPUT_MS:
        return (
            f"{requests} prompts x {prompt_ms:g} ms fastest {prompt_tokens}-token prompt program = "
            f"{requests * prompt_ms:g} ms > {FIRST_OUTPUT_MS:g} ms"
        )
    if round_ms >= GAP_MS:
        return f"the fastest generation round takes {round_ms:g} ms >= {GAP_MS:g} ms"
    rotation = _rotation_ms(catalog, requests)
    if rotation >= GAP_MS:
        return (
            f"serving each of {requests} streams once takes at least {rotation:g} ms >= {GAP_MS:g} ms "
            "at the best streams-per-ms generation program"
        )
    return None


def startup_trace(
    catalog: Catalog,
    policy: PolicyConfig,
    requests: int,
    accepted: int,
    history: str,
    rounds: int = 100,
    serving: bool = True,
) -> Result:
    """One startup trace (spec, Verification) on the simulator, with the bounds it broke named;
    `serving`: as the engine serves, checkpoint retention and initialize on (RESOLUTIONS.md, 31)."""
    name = f"{requests} requests, {accepted} accepted drafts, {history}"
    config = simulation.SimConfig(
        catalog,
        requests=requests,
        accepted_drafts=accepted,
        acceptance_history=history,
        policy=policy,
        rounds=rounds,
        serving=serving,
    )
    result = simulation.run(config)
    firsts = [r.first_output_ms for r in result.requests]
    first = max(math.inf if f is None else f for f in firsts)
    gap = max(r.max_gap_ms for r in result.requests)
    spread = result.progress_spread_tokens
    failed = []
    if first > FIRST_OUTPUT_MS:
        failed.append(f"first output {first:.1f} ms > {FIRST_OUTPUT_MS:g} ms")
    if gap >= GAP_MS:
        failed.append(f"largest gap {gap:.1f} ms >= {GAP_MS:g} ms")
    if spread is None or spread > SPREAD_TOKENS:
        failed.append(
            f"spread {spread} tokens > {SPREAD_TOKENS}"
            if spread is not None
            else "spread not measured (the window never closed)"
        )
    window = result.spread_window or {}
    figure = f"first output {first:.1f} ms, largest gap {gap:.1f} ms, spread {spread} tokens" + (
        f" over {window['rounds']} rounds in {window['cycles']} cycles" if window else ""
    )
    if failed:
        figure = "; ".join(failed) + f" ({figure})"
    details = {
        "first_output_ms": first if math.isfinite(first) else None,
        "largest_gap_ms": gap,
        "spread_tokens": spread,
        "spread_window": result.spread_window,
        "failed": [
            b
            for b, bad in (
                ("first output", first > FIRST_OUTPUT_MS),
                ("gap", gap >= GAP_MS),
                ("spread", spread is None or spread > SPREAD_TOKENS),
            )
            if bad
        ],
    }
    return Result("startup", name, "fail" if failed else "pass", figure, STARTUP_RULES, details)


STARTUP_RULES = (
    "verification/startup-traces",
    "verification/first-output-100ms",
    "verification/gaps-150ms",
    "verification/hundred-rounds-spread",
)
STARTUP_REQUESTS = (5, 16)
STARTUP_ACCEPTED = (0, 3, 7)
STARTUP_HISTORIES = ("untrained", "preseeded")


def startup_checks(catalog: Catalog, policy: PolicyConfig, serving: bool = True) -> list[Result]:
    """The spec's startup traces: 5 and 16 requests of 64-token prompts at t=0; 0, 3 and 7 accepted
    drafts per round (an ordinary catalog: 0 only); untrained and preseeded acceptance histories;
    spread over at least 100 rounds of whole cycles. `serving` (default): with checkpoint retention
    and initialize on, as the engine serves; the generated family runs without them
    (docs/conformance.md, "Startup traces on the generated family")."""
    out = []
    speculative = catalog.mode == "speculative"
    rules = STARTUP_RULES
    for requests in STARTUP_REQUESTS:
        for accepted in STARTUP_ACCEPTED:
            for history in STARTUP_HISTORIES:
                name = f"{requests} requests, {accepted} accepted drafts, {history}"
                if accepted and not speculative:
                    out.append(
                        Result("startup", name, "n/a", "an ordinary catalog draws no proposals", rules)
                    )
                    continue
                if _prompt_ms(catalog, 64) is None or _fastest_round_ms(catalog) is None:
                    out.append(
                        Result("startup", name, "n/a", "no measured prompt or generation program", rules)
                    )
                    continue
                why = startup_achievability(catalog, requests)
                if why is not None:
                    out.append(
                        Result(
                            "startup",
                            name,
                            "not achievable",
                            f"not achievable on this catalog: {why}",
                            rules,
                            {"why": why},
                        )
                    )
                    continue
                out.append(startup_trace(catalog, policy, requests, accepted, history, serving=serving))
    return out


def budget_checks(catalog: Catalog, policy: PolicyConfig) -> list[Result]:
    """About a minute of continuous decoding (durations scaled up so it runs quickly)."""
    slow = dataclasses.replace(
        catalog,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=g.duration_ms * 8) if g.duration_ms else g
            for g in catalog.graphs
        ),
    )
    speculative = catalog.mode == "speculative"
    result = simulation.run(
        simulation.SimConfig(
            slow,
            requests=6,
            output_tokens=400_000,
            accepted_drafts=None,
            acceptance_probs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3) if speculative else None,
            horizon_ms=70_000.0,
            rounds=10**9,
            noise=0.05,
            seed=3,
            policy=policy,
        )
    )
    bound = 0.002 / 0.998 * result.ordinary_ms
    out = [
        Result(
            "budgets",
            "timing refresh <= 0.002/0.998 x ordinary + one episode",
            "pass" if result.refresh_bound_ok else "fail",
            f"refresh {result.timing_refresh_ms:.2f} ms, allowance {bound:.2f} ms + largest episode "
            f"{result.largest_refresh_episode_ms:.2f} ms, {len(result.refresh_episodes_ms)} refreshes in "
            f"{result.virtual_ms / 1000:.0f} s",
            ("timing-refresh/aggregate-bound",),
        ),
        Result(
            "budgets",
            "2,495 ms of credited ordinary time before the first refresh",
            "pass"
            if result.first_refresh_after_ms is None or result.first_refresh_after_ms >= 2495 - 1e-6
            else "fail",
            f"first refresh after {result.first_refresh_after_ms} ms credited",
            ("timing-refresh/first-2495ms",),
        ),
    ]
    if speculative:
        out.append(
            Result(
                "budgets",
                "acceptance probes <= 0.01/0.99 x ordinary + one episode",
                "pass" if result.acceptance_bound_ok else "fail",
                f"probes {result.acceptance_learning_ms:.2f} ms, allowance "
                f"{0.01 / 0.99 * result.ordinary_ms:.2f} ms + largest episode "
                f"{result.largest_probe_episode_ms:.2f} ms, {len(result.probe_episodes_ms)} probes",
                ("acceptance-learning/aggregate-bound",),
            )
        )
    return out


def lifecycle_checks(catalog: Catalog, policy: PolicyConfig) -> list[Result]:
    """A Poisson workload through the real Scheduler: every request completes and nothing leaks."""
    result = simulation.run(
        simulation.SimConfig(
            catalog,
            scenario="poisson",
            requests=60,
            prompt_tokens=[64, 400, 1500],
            output_tokens=[16, 64],
            accepted_drafts=None if catalog.mode == "speculative" else 0,
            acceptance_probs=(0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1) if catalog.mode == "speculative" else None,
            arrival_rate_per_s=40.0,
            seed=11,
            policy=policy,
        )
    )
    done = sum(r.finished_ms is not None for r in result.requests)
    ttft = sorted(r.first_output_ms for r in result.requests if r.first_output_ms is not None)
    return [
        Result(
            "lifecycle",
            "Poisson workload completes",
            "pass" if done == len(result.requests) else "fail",
            f"{done}/{len(result.requests)} finished in {result.virtual_ms:.0f} ms; first output p50 "
            f"{np.percentile(ttft, 50):.1f} ms, p99 {np.percentile(ttft, 99):.1f} ms",
            ("verification/selector-contention",),
        )
    ]


SECTIONS: dict[str, Callable] = {
    "catalog": lambda cat, policy, args: catalog_checks(cat),
    "selection": lambda cat, policy, args: selection_checks(cat, args["cases"], args["seed"]),
    "startup": lambda cat, policy, args: startup_checks(cat, policy, args.get("serving", True)),
    "budgets": lambda cat, policy, args: budget_checks(cat, policy),
    "lifecycle": lambda cat, policy, args: lifecycle_checks(cat, policy),
    "numerics": lambda cat, policy, args: numeric_checks(),
}


def tally(results: list[Result]) -> dict:
    """Counts of a set of results: per verdict, runnable (run at all: pass + fail), held (pass), and
    the failed bounds (a trace can break several)."""
    counts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    counts["runnable"] = counts["pass"] + counts["fail"]
    counts["held"] = counts["pass"]
    broken = collections.Counter(
        b for r in results if r.verdict == "fail" for b in (r.details or {}).get("failed", ())
    )
    counts["failed_bounds"] = {b: broken[b] for b in ("first output", "gap", "spread") if broken[b]}
    return counts


def generated_startup(n: int, seed: int, policy: PolicyConfig, sections=("startup",), args=None):
    """Yields (member, results) for each catalog of `catalog_family.family(n, seed)`."""
    args = {"cases": 200, "seed": 0, **(args or {}), "serving": False}
    for member in catalog_family.family(n, seed):
        results = []
        for section in sections:
            results += SECTIONS[section](member.catalog, policy, args)
        yield member, results
