"""Production selector against exhaustive enumeration on random populations.

    python -m helios_jax.reference.crosscheck --catalog=FILE --cases=N --seed=S [--max_requests=K]
        [--decode_steps=4,8]   (adds K-step copies of the catalog's decode programs)
        [--prefill_batch=2,4]  (adds B-row copies of the catalog's prefill programs)

Each case draws a population (phases, prices, output ages, acceptance histories and
forecasts, output and context limits, copy sources, atomic image spans, terminal rows) and a
decode mode the catalog supports, measures the catalog through the ordinary observation path
(optionally with multiplicative noise), and compares, program by program, the production
selector's best candidate with :mod:`helios_jax.reference.cohorts`.

A comparison is *exact* where the spec promises the optimum (every program except adaptive
ragged speculative ones, whose three-ordering search is bounded by design); a *mismatch* is an
exact comparison where production scores below the reference, or any comparison where it
claims more than the reference can reach. Prints one JSON line

    {"cases": N, "exact_cases": E, "mismatches": M, "worst_relative_gap": G, ...}

(E counts exact program comparisons; G is the worst relative shortfall over the bounded,
non-exact comparisons) and exits non-zero when M > 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np

from helios_jax.catalog import Allocation, Catalog, DecodeMode, GraphKind, shipped_catalog
from helios_jax.reference.cohorts import exhaustive_best
from helios_jax.scheduler import policy, service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import Phase, RequestView

TOLERANCE = 1e-7


def _monotone_probs(rng, depth: int, low: float) -> np.ndarray:
    return np.cumprod(rng.uniform(low, 1.0, size=depth))


def random_population(
    rng: np.random.Generator,
    catalog: Catalog,
    max_requests: int,
    policy_config: PolicyConfig,
    normalizers: service.Normalizers,
) -> list[RequestView]:
    n = int(rng.integers(1, max_requests + 1))
    depth = catalog.max_proposal_depth
    views = []
    n_dec = 0
    for i in range(n):
        phase = (Phase.DECODE, Phase.PREFILL, Phase.TERMINAL)[int(rng.choice(3, p=[0.6, 0.32, 0.08]))]
        log_x = normalizers.share_log_rate(n) + rng.normal(0.0, 1.5)
        log_z = normalizers.share_log_rate(n) + rng.normal(0.0, 1.5)
        prices = service.log_prices(policy_config, log_x, log_z if phase is Phase.DECODE else None)
        common = dict(
            rid=100 + i,
            slot=int(rng.permutation(64)[i]),
            phase=phase,
            runnable=bool(rng.random() > 0.05),
            last_selected_ns=int(rng.integers(0, 5)),
            log_prefill_price=prices.prefill_token,
            log_output_price=prices.output_token,
            log_delivery_price=prices.delivery,
        )
        if phase is Phase.DECODE:
            n_dec += 1
            views.append(
                RequestView(
                    **common,
                    age_ms=float(rng.uniform(0.0, 200.0)),
                    output_remaining=int(rng.choice([1, 2, 3, 5, 20, 400])),
                    context_remaining=int(rng.choice([2, 4, 1 << 20], p=[0.1, 0.1, 0.8])),
                    copy_limit=None if rng.random() < 0.8 else int(rng.integers(0, depth + 1)),
                    width_limit=None if rng.random() < 0.85 else int(rng.integers(1, depth + 2)),
                    survival=_monotone_probs(rng, depth, rng.uniform(0.05, 0.95)),
                    forecast=_monotone_probs(rng, depth, rng.uniform(0.05, 0.95)),
                )
            )
        elif phase is Phase.PREFILL:
            remaining = int(np.exp(rng.uniform(0.0, math.log(6000))))
            spans = ()
            if rng.random() < 0.2 and remaining > 10:
                start = int(rng.integers(0, remaining - 1))
                spans = ((start, int(min(remaining, start + rng.integers(2, 600)))),)
            views.append(
                RequestView(
                    **common,
                    prompt_remaining=remaining,
                    prompt_limit=None if rng.random() < 0.8 else int(rng.integers(1, remaining + 1)),
                    atomic_spans=spans,
                    needs_scores=bool(rng.random() < 0.1),
                )
            )
        else:
            views.append(RequestView(**common, terminal_age_ms=float(rng.uniform(0.0, 100.0))))
    return views


def _exact(graph, mode: DecodeMode) -> bool:
    adaptive_ragged = (
        graph.kind is GraphKind.SPECULATIVE
        and graph.token_capacity > 1
        and not graph.is_rectangular
        and mode is DecodeMode.ADAPTIVE
    )
    return not adaptive_ragged


@dataclasses.dataclass
class Report:
    cases: int = 0
    exact_cases: int = 0
    bounded_cases: int = 0
    mismatches: int = 0
    worst_relative_gap: float = 0.0
    details: list = dataclasses.field(default_factory=list)
    worst: dict | None = None  # the bounded comparison with the largest shortfall

    def record(self, case: int, mode: DecodeMode, graph, prod: float, ref: float) -> None:
        """Counts one program's comparison (module docstring): exact or bounded, and a mismatch
        or, for a bounded one, a shortfall that may be the worst so far."""
        scale = max(1.0, abs(ref)) if math.isfinite(ref) else 1.0  # a program only one side offers
        exact = _exact(graph, mode)
        if exact:
            self.exact_cases += 1
        else:
            self.bounded_cases += 1
        over = prod > ref + TOLERANCE * scale
        short = prod < ref - TOLERANCE * scale
        comparison = {
            "case": case,
            "graph": str(graph.key),
            "mode": mode.value,
            "production": prod,
            "reference": ref,
        }
        if over or (exact and short):
            self.mismatches += 1
            self.details.append(comparison)
        elif short and math.isfinite(ref):
            gap = (ref - prod) / scale if math.isfinite(prod) else 1.0
            if gap > self.worst_relative_gap:
                self.worst_relative_gap = gap
                self.worst = comparison

    def to_json(self) -> dict:
        return {
            "cases": self.cases,
            "exact_cases": self.exact_cases,
            "mismatches": self.mismatches,
            "worst_relative_gap": self.worst_relative_gap,
            "bounded_cases": self.bounded_cases,
        }


def random_mode(rng: np.random.Generator, catalog: Catalog) -> tuple[DecodeMode, int | None]:
    """A decode mode the catalog supports, and for fixed-width execution one of its widths."""
    modes = [DecodeMode.ORDINARY] if catalog.mode == "ordinary" else [DecodeMode.ADAPTIVE, DecodeMode.FIXED]
    mode = modes[int(rng.integers(len(modes)))]
    fixed_width = None
    if mode is DecodeMode.FIXED:
        widths = sorted(
            {
                g.token_capacity
                for g in catalog.of_kind(GraphKind.SPECULATIVE)
                if g.allocation is Allocation.QUERY_LENGTH
            }
        )
        fixed_width = widths[int(rng.integers(len(widths)))]
    return mode, fixed_width


def with_decode_steps(catalog: Catalog, steps, speedup: float = 0.6) -> Catalog:
    """The catalog plus a K-step copy of each measured single-step decode program (a speculative
    catalog: of each width-one program), for every K in `steps`, measured at `speedup` x K x the
    single step's duration (K steps amortise one execution's fixed cost)."""
    extra = tuple(
        dataclasses.replace(g, steps=k, duration_ms=g.duration_ms * k * speedup)
        for k in steps
        if k > 1
        for g in catalog.graphs
        if g.steps == 1 and g.duration_ms is not None and _steppable(g)
    )
    return dataclasses.replace(catalog, graphs=catalog.graphs + extra)


def _steppable(g) -> bool:
    """Decode, or a width-one speculative round: the programs a K-step copy may have."""
    return g.kind is GraphKind.DECODE or (g.kind is GraphKind.SPECULATIVE and g.token_capacity == 1)


def with_prefill_batch(catalog: Catalog, rows, speedup: float = 0.7) -> Catalog:
    """The catalog plus a B-row copy of each measured one-row prefill program, for every B in
    `rows` within the request slots, measured at `speedup` x B x the one-row duration (B rows
    amortise one execution's fixed cost)."""
    extra = tuple(
        dataclasses.replace(g, batch_capacity=b, duration_ms=g.duration_ms * b * speedup)
        for b in rows
        if 1 < b <= catalog.request_slots
        for g in catalog.of_kind(GraphKind.PREFILL)
        if g.batch_capacity == 1 and g.duration_ms is not None
    )
    return dataclasses.replace(catalog, graphs=catalog.graphs + extra)


def run(
    catalog: Catalog,
    cases: int,
    seed: int,
    max_requests: int = 5,
    noise: float = 0.0,
    policy_config: PolicyConfig | None = None,
) -> Report:
    rng = np.random.default_rng(seed)
    report = Report()
    policy_config = policy_config or PolicyConfig()
    for case in range(cases):
        mode, fixed_width = random_mode(rng, catalog)
        graphs = catalog.eligible(mode, fixed_width=fixed_width)
        costs = CostModel(policy_config.estimate_ttl_ns)
        for g in graphs:
            if g.duration_ms is not None:
                factor = float(np.exp(rng.uniform(-noise, noise))) if noise else 1.0
                costs.observe(g.key, [g.duration_ms * 1e6 * factor], 0)
        normalizers = service.Normalizers.measure(catalog.graphs, costs)
        views = random_population(rng, catalog, max_requests, policy_config, normalizers)
        inp = policy.SelectionInput(views, graphs, costs, 0, policy_config, mode)
        production: dict = {}
        for row in policy.scored(inp):
            production[row.graph.key] = max(production.get(row.graph.key, -math.inf), row.score)
        reference = exhaustive_best(views, graphs, costs, policy_config, mode)
        report.cases += 1
        by_key = {g.key: g for g in graphs}
        for key in set(reference) | set(production):
            prod, ref = production.get(key, -math.inf), reference.get(key, -math.inf)
            report.record(case, mode, by_key[key], prod, ref)
    return report


def main(argv) -> int:
    from absl import flags

    FLAGS = flags.FLAGS
    catalog = Catalog.load(FLAGS.catalog) if FLAGS.catalog else shipped_catalog()
    if FLAGS.decode_steps:
        catalog = with_decode_steps(catalog, [int(k) for k in FLAGS.decode_steps])
    if FLAGS.prefill_batch:
        catalog = with_prefill_batch(catalog, [int(b) for b in FLAGS.prefill_batch])
    report = run(catalog, FLAGS.cases, FLAGS.seed, FLAGS.max_requests, FLAGS.noise)
    print(json.dumps(report.to_json()))
    for d in report.details[:10]:
        print(json.dumps(d), file=sys.stderr)
    return 1 if report.mismatches else 0


def _define_flags():
    from absl import flags

    flags.DEFINE_string("catalog", None, "catalog JSON (default: the shipped synthetic-h200)")
    flags.DEFINE_integer("cases", 200, "random populations to compare")
    flags.DEFINE_integer("seed", 0, "random seed")
    flags.DEFINE_integer("max_requests", 5, "largest population (the reference is exponential)")
    flags.DEFINE_float("noise", 0.0, "log-uniform multiplicative noise on measured durations")
    flags.DEFINE_list(
        "decode_steps",
        [],
        "add K-step copies of the catalog's decode (or width-one speculative) programs, e.g. 4,8",
    )
    flags.DEFINE_list("prefill_batch", [], "add B-row copies of the catalog's prefill programs, e.g. 2,4")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
