"""A small Prometheus text-exposition registry: counters, gauges and histograms with labels.

The server needs a handful of series and no client library, so this module writes the text
format (version 0.0.4) itself. Each metric family owns one lock; ``Registry.render()`` emits the
families in registration order, each with its ``# HELP`` and ``# TYPE`` lines. Label values are
escaped as the format requires (backslash, double quote, newline).

Worked example: ``Histogram("x_seconds", "...", buckets=(0.1, 1.0))`` after ``observe(0.5)``
renders cumulative buckets::

    x_seconds_bucket{le="0.1"} 0
    x_seconds_bucket{le="1"} 1
    x_seconds_bucket{le="+Inf"} 1
    x_seconds_sum 0.5
    x_seconds_count 1

:func:`render_scheduler_stats` writes the scheduler's series (the spec's ``flare_*`` counters as
``helios_*``) from a ``Scheduler.stats()`` snapshot; the engine's ``metrics_text()`` uses it.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helios_jax.scheduler.stats import SchedulerStats

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    """Integers without a trailing '.0'; infinities in Prometheus spelling."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _label_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Family:
    """Shared label handling: one child state per tuple of label values."""

    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labels:
            if not _LABEL.match(label) or label == "le":
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], object] = {}

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    """A monotonically increasing total (by convention named ``*_total``)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only increases (got {amount})")
        key = self._key(labels)
        with self._lock:
            self._children[key] = self._children.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._children.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._children.items())
        if not items and not self.labels:
            items = [((), 0.0)]
        return self.header() + [
            f"{self.name}{_label_text(self.labels, k)} {_format_value(v)}" for k, v in items
        ]


class Gauge(Counter):
    """A value that goes up and down (requests in flight)."""

    kind = "gauge"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._children[key] = self._children.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._children[key] = float(value)


class Histogram(_Family):
    """Cumulative buckets (upper bounds inclusive, as Prometheus' ``le``), a sum and a count."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Iterable[float], labels: Sequence[str] = ()):
        super().__init__(name, help_text, labels)
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(not math.isfinite(b) for b in bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct finite numbers")
        self.buckets = tuple(bounds)

    def observe(self, value: float, count: int = 1, **labels: str) -> None:
        """Record `value` `count` times (a burst of k tokens observes its per-token gap k times)."""
        if count <= 0:
            return
        key = self._key(labels)
        index = bisect.bisect_left(self.buckets, value)  # first bound >= value: `le` is inclusive
        with self._lock:
            state = self._children.get(key)
            if state is None:
                state = self._children[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            state[0][index] += count
            state[1] += value * count
            state[2] += count

    def count(self, **labels: str) -> int:
        with self._lock:
            state = self._children.get(self._key(labels))
            return 0 if state is None else state[2]

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, ([*s[0]], s[1], s[2])) for k, s in self._children.items())
        if not items and not self.labels:
            items = [((), ([0] * (len(self.buckets) + 1), 0.0, 0))]
        lines = self.header()
        for key, (per_bucket, total, count) in items:
            running = 0
            for bound, n in zip((*self.buckets, math.inf), per_bucket):
                running += n
                le = f'le="{_format_value(bound)}"'
                lines.append(f"{self.name}_bucket{_label_text(self.labels, key, le)} {running}")
            lines.append(f"{self.name}_sum{_label_text(self.labels, key)} {_format_value(total)}")
            lines.append(f"{self.name}_count{_label_text(self.labels, key)} {count}")
        return lines


class Registry:
    """Metric families in registration order; names are unique."""

    def __init__(self):
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def _add(self, family: _Family):
        with self._lock:
            if family.name in self._families:
                raise ValueError(f"metric {family.name} is already registered")
            self._families[family.name] = family
        return family

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help_text, labels))

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help_text, labels))

    def histogram(
        self, name: str, help_text: str, buckets: Iterable[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return self._add(Histogram(name, help_text, buckets, labels))

    def render(self) -> str:
        with self._lock:
            families = list(self._families.values())
        lines: list[str] = []
        for family in families:
            lines.extend(family.render())
        return "\n".join(lines) + "\n"


# Latency buckets in seconds: sub-millisecond CPU fakes up to minute-long generations.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)


class ServerMetrics:
    """The HTTP layer's series (the engine appends its own ``metrics_text()`` after these).

    Series:
      helios_http_requests_total{endpoint,status}: responses by endpoint and HTTP status (a
        stream counts its status once, when its headers go out).
      helios_requests_finished_total{reason}: generation requests by finish reason (stop,
        length, cancelled: the client went away or the engine cancelled, error).
      helios_requests_running: generation requests submitted and not yet finished.
      helios_prompt_tokens_total, helios_completion_tokens_total: usage of finished requests.
      helios_time_to_first_token_seconds: request arrival to the first visible token.
      helios_inter_token_latency_seconds: gap between visible bursts, per token (a burst of k
        tokens after a gap g observes g / k, k times).
      helios_e2e_request_latency_seconds: request arrival to the final event.
    """

    ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")

    def __init__(self):
        self.registry = Registry()
        r = self.registry
        self.http_requests = r.counter(
            "helios_http_requests_total", "HTTP responses by endpoint and status.", ("endpoint", "status")
        )
        self.finished = r.counter(
            "helios_requests_finished_total", "Generation requests by finish reason.", ("reason",)
        )
        self.running = r.gauge("helios_requests_running", "Generation requests submitted and not finished.")
        self.prompt_tokens = r.counter("helios_prompt_tokens_total", "Prompt tokens of finished requests.")
        self.completion_tokens = r.counter(
            "helios_completion_tokens_total", "Completion tokens of finished requests."
        )
        self.ttft = r.histogram(
            "helios_time_to_first_token_seconds", "Request arrival to the first visible token.", TTFT_BUCKETS
        )
        self.itl = r.histogram(
            "helios_inter_token_latency_seconds",
            "Time between visible bursts, per output token.",
            ITL_BUCKETS,
        )
        self.e2e = r.histogram(
            "helios_e2e_request_latency_seconds", "Request arrival to the final event.", E2E_BUCKETS
        )

    def record_response(self, path: str, status: int) -> None:
        endpoint = path if path in self.ENDPOINTS else "other"  # bounded label cardinality
        self.http_requests.inc(endpoint=endpoint, status=str(status))

    def render(self) -> str:
        return self.registry.render()


def render_scheduler_stats(stats: SchedulerStats) -> str:
    """Prometheus exposition of a scheduler snapshot (the spec's flare_* as helios_*)."""
    lines = [
        "# HELP helios_scheduler_executions_total Executions by accounting class.",
        "# TYPE helios_scheduler_executions_total counter",
    ]
    lines += [f'helios_scheduler_executions_total{{class="{c}"}} {n}' for c, n in stats.executions]
    lines += [
        "# HELP helios_scheduler_execution_nanoseconds_total Raw execution time by accounting class.",
        "# TYPE helios_scheduler_execution_nanoseconds_total counter",
    ]
    lines += [
        f'helios_scheduler_execution_nanoseconds_total{{class="{c}"}} {ns}' for c, ns in stats.execution_ns
    ]
    lines += [
        "# HELP helios_scheduler_selections_total Committed plans by program kind.",
        "# TYPE helios_scheduler_selections_total counter",
    ]
    lines += [f'helios_scheduler_selections_total{{kind="{k}"}} {n}' for k, n in stats.selections]
    lines += [
        "# HELP helios_speculative_programs_total "
        "Complete speculative programs (not producer or target calls).",
        "# TYPE helios_speculative_programs_total counter",
        f"helios_speculative_programs_total {stats.speculative_programs}",
        "# TYPE helios_speculative_drafts_offered_total counter",
        f"helios_speculative_drafts_offered_total {stats.drafts_offered}",
        "# TYPE helios_speculative_learned_draws_total counter",
        f"helios_speculative_learned_draws_total {stats.learned_draws}",
        "# TYPE helios_speculative_drafts_accepted_total counter",
        f"helios_speculative_drafts_accepted_total {stats.drafts_accepted}",
        "# TYPE helios_speculative_accepted_by_position_total counter",
    ]
    lines += [
        f'helios_speculative_accepted_by_position_total{{position="{d}"}} {n}'
        for d, n in stats.accepted_by_position
    ]
    lines += ["# TYPE helios_speculative_offered_by_position_total counter"]
    lines += [
        f'helios_speculative_offered_by_position_total{{position="{d}"}} {n}'
        for d, n in stats.offered_by_position
    ]
    lines += [
        "# TYPE helios_scheduler_refresh_credit_ms gauge",
        f"helios_scheduler_refresh_credit_ms {stats.refresh_credit_ms}",
        "# TYPE helios_scheduler_learning_credit_ms gauge",
        f"helios_scheduler_learning_credit_ms {stats.learning_credit_ms}",
    ]
    return "\n".join(lines) + "\n"
