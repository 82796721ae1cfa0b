"""Service-level objectives for replayed traffic: attainment, goodput and latency breakdowns.

A request *attains* its objectives when it finished, its time to first token is at most
``ttft_base_ms + ttft_per_prompt_token_ms * prompt_tokens`` (a longer prompt may take longer to
prefill), and no gap between its consecutive visible outputs exceeds ``gap_ms`` (a stream is
never held longer than that once it started). *Attainment* is the fraction of a run's requests
that attain both; the *goodput* of a scheduler is the highest request rate at which attainment
stays at least ``target`` (90%), found on a sweep of rates (:func:`goodput`).

The defaults (docs/benchmarks-traffic.md gives the reasoning) come from the shipped synthetic
catalog's measured program durations: its largest program (a 4096-token prefill or mixed chunk)
takes about 90 ms, the marginal prefill cost is 0.022 ms per prompt token, and a decode round
over every slot takes 4-7 ms.

Other measures, all on :class:`helios_jax.simulation_stats.RequestStats`: TTFT and gap
percentiles by prompt-length bucket, normalized latency (end-to-end time per output token) and
Jain's index over per-request decode rates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from helios_jax.simulation_stats import RequestStats

PROMPT_BUCKETS = (0, 512, 2048, 4096)  # lower edges of the prompt-length buckets, tokens


@dataclasses.dataclass(frozen=True)
class SloTargets:
    ttft_base_ms: float = 250.0  # a: TTFT allowance of any request
    ttft_per_prompt_token_ms: float = 0.1  # b: added TTFT allowance per prompt token
    gap_ms: float = 200.0  # the longest allowed gap between a stream's visible outputs
    target: float = 0.9  # attainment that counts as good service

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"SloTargets.{field.name} must be finite and nonnegative, got {value!r}")
        if not 0 < self.target <= 1:
            raise ValueError(f"SloTargets.target must be in (0, 1], got {self.target!r}")

    def ttft_target_ms(self, prompt_tokens: int) -> float:
        return self.ttft_base_ms + self.ttft_per_prompt_token_ms * prompt_tokens


def gaps_ms(r: RequestStats) -> np.ndarray:
    """The gaps between a request's consecutive visible outputs."""
    return np.diff(np.asarray(r.publications, dtype=np.float64))


def meets_ttft(r: RequestStats, slo: SloTargets) -> bool:
    return r.first_output_ms is not None and r.first_output_ms <= slo.ttft_target_ms(r.prompt_tokens)


def meets_gap(r: RequestStats, slo: SloTargets) -> bool:
    """Every gap within the target, including one still open when the run ended."""
    return r.max_gap_ms <= slo.gap_ms


def attains(r: RequestStats, slo: SloTargets) -> bool:
    """Finished, first output in time and no gap over the target."""
    return r.finished_ms is not None and meets_ttft(r, slo) and meets_gap(r, slo)


def attainment(requests: Sequence[RequestStats], slo: SloTargets) -> float:
    """The fraction of `requests` that attain their objectives (0 for no requests)."""
    if not requests:
        return 0.0
    return sum(attains(r, slo) for r in requests) / len(requests)


def goodput(rates: Sequence[float], attainments: Sequence[float], target: float = 0.9) -> dict:
    """The highest rate with attainment at least `target` on a sweep.

    Rates are taken in ascending order; the sweep counts up to the first rate that misses the
    target (a later recovery is noise, not capacity). Returns ``rate`` (the last rate before the
    first miss; 0.0 if the lowest misses), ``interpolated`` (the linear crossing between that rate
    and the first miss, at the first miss's attainment; equal to ``rate`` when nothing misses) and
    ``bounded`` (False when even the highest rate met the target: goodput is at least that).
    """
    if len(rates) != len(attainments) or not rates:
        raise ValueError("goodput needs one attainment per rate, at least one")
    order = sorted(range(len(rates)), key=lambda i: rates[i])
    best, previous = 0.0, (0.0, 1.0)
    for i in order:
        rate, att = float(rates[i]), float(attainments[i])
        if att < target:
            lo_rate, lo_att = previous
            frac = (lo_att - target) / (lo_att - att) if lo_att > att else 0.0
            return {"rate": best, "interpolated": lo_rate + frac * (rate - lo_rate), "bounded": True}
        best, previous = rate, (rate, att)
    return {"rate": best, "interpolated": best, "bounded": False}


def percentile(values, q: float) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    return float(np.percentile(values, q)) if values.size else None


def jain(x) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2); None for no values or all zero."""
    x = np.asarray(x, dtype=np.float64)
    return float(x.sum() ** 2 / (x.size * (x * x).sum())) if x.size and (x * x).sum() > 0 else None


def decode_rates(requests: Sequence[RequestStats]) -> list[float]:
    """Output tokens per second after the first, of finished requests with two or more outputs."""
    return [
        (r.output_tokens - 1) / ((r.finished_ms - r.arrival_ms - r.first_output_ms) / 1e3)
        for r in requests
        if r.finished_ms is not None
        and len(r.publications) >= 2
        and r.finished_ms > r.arrival_ms + r.first_output_ms
    ]


def normalized_latency_ms(r: RequestStats) -> float | None:
    """End-to-end latency per output token (finished requests only)."""
    if r.finished_ms is None or r.output_tokens < 1:
        return None
    return (r.finished_ms - r.arrival_ms) / r.output_tokens


def bucket_label(lower: int, upper: int | None) -> str:
    return f"{lower}-{upper - 1}" if upper is not None else f">={lower}"


def by_prompt_bucket(requests: Sequence[RequestStats], edges: Sequence[int] = PROMPT_BUCKETS) -> dict:
    """Per prompt-length bucket: requests, TTFT p50/p99 and gap p99 (ms)."""
    out = {}
    bounds = list(edges) + [None]
    for lower, upper in zip(bounds, bounds[1:]):
        mine = [
            r for r in requests if r.prompt_tokens >= lower and (upper is None or r.prompt_tokens < upper)
        ]
        ttft = [r.first_output_ms for r in mine if r.first_output_ms is not None]
        gaps = np.concatenate([gaps_ms(r) for r in mine] + [np.zeros(0)])
        out[bucket_label(lower, upper)] = {
            "requests": len(mine),
            "ttft_p50_ms": percentile(ttft, 50),
            "ttft_p99_ms": percentile(ttft, 99),
            "gap_p99_ms": percentile(gaps, 99),
        }
    return out


def summarize(requests: Sequence[RequestStats], slo: SloTargets) -> dict:
    """Every measure of one run, as plain data."""
    ttft = [r.first_output_ms for r in requests if r.first_output_ms is not None]
    ttft_ratio = [
        r.first_output_ms / slo.ttft_target_ms(r.prompt_tokens)
        for r in requests
        if r.first_output_ms is not None
    ]
    gaps = np.concatenate([gaps_ms(r) for r in requests] + [np.zeros(0)])
    norm = [x for r in requests if (x := normalized_latency_ms(r)) is not None]
    return {
        "requests": len(requests),
        "finished": sum(r.finished_ms is not None for r in requests),
        "attainment": attainment(requests, slo),
        "ttft_attainment": sum(meets_ttft(r, slo) for r in requests) / max(1, len(requests)),
        "gap_attainment": sum(meets_gap(r, slo) for r in requests) / max(1, len(requests)),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "ttft_normalized_p99": percentile(ttft_ratio, 99),  # TTFT / its target
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
        "gap_max_ms": float(gaps.max()) if gaps.size else None,
        "normalized_latency_mean_ms": float(np.mean(norm)) if norm else None,
        "normalized_latency_p99_ms": percentile(norm, 99),
        "jain": jain(decode_rates(requests)),
        "by_prompt": by_prompt_bucket(requests),
    }


def dominates(a: Sequence[float], b: Sequence[float], higher_better: Sequence[bool]) -> bool:
    """`a` is at least as good as `b` in every coordinate and better in one."""
    at_least = all((x >= y) if hi else (x <= y) for x, y, hi in zip(a, b, higher_better))
    return at_least and any(x != y for x, y in zip(a, b))


def pareto_front(points: dict, higher_better: Sequence[bool]) -> list:
    """The keys of `points` (key -> coordinates) that no other point dominates."""
    return [
        k
        for k, p in points.items()
        if not any(dominates(q, p, higher_better) for j, q in points.items() if j != k)
    ]
