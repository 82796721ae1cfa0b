"""The HTTP layer's Prometheus series (``prometheus_client``, one registry per server) and the
text of the scheduler's series.

:class:`ServerMetrics` owns a ``CollectorRegistry`` of its own, so two servers in one process
(the tests run several) never share or collide; ``/metrics`` renders it in the text format
0.0.4 and appends the engine's own ``metrics_text()``.

:func:`render_scheduler_stats` writes the scheduler's series (the spec's ``flare_*`` counters as
``helios_*``) from a ``Scheduler.stats()`` snapshot; the engine's ``metrics_text()`` uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from helios_jax.scheduler.stats import SchedulerStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

# Latency buckets in seconds: sub-millisecond CPU fakes up to minute-long generations.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS += (20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1)
ITL_BUCKETS += (0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
QUEUE_BUCKETS += (10.0, 30.0, 60.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
E2E_BUCKETS += (60.0, 120.0, 240.0, 480.0)
HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HTTP_BUCKETS += (30.0, 60.0, 120.0, 300.0)
# Token counts per request: 1, 2, 5, 10, 20, 50, ... (vLLM's 1-2-5 buckets).
TOKEN_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))


class ServerMetrics:
    """The HTTP layer's series (the engine appends its own ``metrics_text()`` after these).

    Series:
      helios_http_requests_total{endpoint,status}: responses by endpoint and HTTP status (a
        stream counts its status once, when its headers go out).
      helios_http_request_duration_seconds{endpoint}: request arrival to the response's end.
      helios_requests_finished_total{reason}: generation requests by finish reason (stop,
        length, cancelled: the client went away, the engine or a shutdown cancelled, error).
      helios_requests_running: generation requests submitted and not yet finished.
      helios_prompt_tokens_total, helios_completion_tokens_total: usage of finished requests.
      helios_request_prompt_tokens, helios_request_generation_tokens,
        helios_request_params_max_tokens: per finished request (vLLM's request_* histograms).
      helios_time_to_first_token_seconds: request arrival to the first visible token.
      helios_inter_token_latency_seconds: gap between visible bursts, per token (a burst of k
        tokens after a gap g observes g / k, k times).
      helios_e2e_request_latency_seconds: request arrival to the final event.
      helios_server_draining: 1 while the server drains for shutdown.
    """

    ENDPOINTS = (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/tokenize",
        "/detokenize",
        "/version",
    )

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.http_requests = Counter(
            "helios_http_requests",
            "HTTP responses by endpoint and status.",
            ("endpoint", "status"),
            registry=r,
        )
        self.http_duration = Histogram(
            "helios_http_request_duration_seconds",
            "Request arrival to the end of its response, by endpoint.",
            ("endpoint",),
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "helios_requests_finished", "Generation requests by finish reason.", ("reason",), registry=r
        )
        self.running = Gauge(
            "helios_requests_running", "Generation requests submitted and not finished.", registry=r
        )
        self.prompt_tokens = Counter(
            "helios_prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )
        self.completion_tokens = Counter(
            "helios_completion_tokens", "Completion tokens of finished requests.", registry=r
        )
        self._token_histograms(r)
        self.ttft = Histogram(
            "helios_time_to_first_token_seconds",
            "Request arrival to the first visible token.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "helios_inter_token_latency_seconds",
            "Time between visible bursts, per output token.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "helios_e2e_request_latency_seconds",
            "Request arrival to the final event.",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "helios_request_queue_time_seconds",
            "Submission to the engine to admission (vLLM's request_queue_time_seconds).",
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.draining = Gauge("helios_server_draining", "1 while the server drains for shutdown.", registry=r)

    def _token_histograms(self, r: CollectorRegistry) -> None:
        def histogram(name: str, help_text: str) -> Histogram:
            return Histogram(name, help_text, buckets=TOKEN_BUCKETS, registry=r)

        self.request_prompt_tokens = histogram(
            "helios_request_prompt_tokens", "Prompt tokens per finished request."
        )
        self.request_generation_tokens = histogram(
            "helios_request_generation_tokens", "Generated tokens per finished request."
        )
        self.request_max_tokens = histogram(
            "helios_request_params_max_tokens", "The max_tokens of each finished request."
        )

    def endpoint(self, path: str) -> str:
        return path if path in self.ENDPOINTS else "other"  # bounded label cardinality

    def record_response(self, path: str, status: int) -> None:
        self.http_requests.labels(endpoint=self.endpoint(path), status=str(status)).inc()

    def observe_itl(self, gap: float, tokens: int) -> None:
        for _ in range(tokens):
            self.itl.observe(gap)

    def record_usage(self, prompt_tokens: int, completion_tokens: int, max_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(completion_tokens)
        self.request_max_tokens.observe(max_tokens)

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


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
