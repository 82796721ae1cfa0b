"""The server's Prometheus series (prometheus_client, a registry per server) and the scheduler's text."""

from helios_jax.serve.metrics import ServerMetrics

from .helpers import metric_value


def test_each_server_has_its_own_registry():
    """Two ServerMetrics in one process register the same names without colliding, and count
    apart; the text keeps the series names of the hand-written registry it replaced."""
    a, b = ServerMetrics(), ServerMetrics()
    a.record_response("/v1/completions", 200)
    a.record_response("/nowhere", 404)
    a.finished.labels(reason="length").inc()
    a.record_usage(5, 3, 16)
    a.observe_itl(0.01, 3)
    text_a, text_b = a.render(), b.render()
    assert metric_value(text_a, 'helios_http_requests_total{endpoint="/v1/completions",status="200"}') == 1
    assert metric_value(text_a, 'helios_http_requests_total{endpoint="other",status="404"}') == 1
    assert metric_value(text_a, 'helios_requests_finished_total{reason="length"}') == 1
    assert metric_value(text_a, "helios_prompt_tokens_total") == 5
    assert metric_value(text_a, "helios_completion_tokens_total") == 3
    assert metric_value(text_a, "helios_inter_token_latency_seconds_count") == 3
    assert metric_value(text_a, "helios_request_params_max_tokens_sum") == 16
    assert metric_value(text_b, "helios_prompt_tokens_total") == 0
    assert "helios_http_requests_total{" not in text_b


def test_scheduler_stats_render_as_the_scheduler_series():
    """A scheduler snapshot renders every accounting class, the selections by kind, the
    speculative counters by draft position and the two credit gauges, in this order."""
    from helios_jax.scheduler.stats import SchedulerStats
    from helios_jax.serve.metrics import render_scheduler_stats

    classes = ("ordinary", "discovery", "timing_refresh", "acceptance_learning")
    stats = SchedulerStats(
        executions=tuple(zip(classes, (3, 1, 0, 0))),
        execution_ns=tuple(zip(classes, (14239000, 5, 0, 0))),
        selections=(("mixed", 1), ("speculative", 2)),
        speculative_programs=2,
        drafts_offered=6,
        learned_draws=6,
        drafts_accepted=4,
        accepted_by_position=((1, 2), (2, 2), (3, 0)),
        offered_by_position=((1, 2), (2, 2), (3, 2)),
        refresh_credit_ms=0.0285,
        learning_credit_ms=5.0,
    )
    assert (
        render_scheduler_stats(stats)
        == """\
# HELP helios_scheduler_executions_total Executions by accounting class.
# TYPE helios_scheduler_executions_total counter
helios_scheduler_executions_total{class="ordinary"} 3
helios_scheduler_executions_total{class="discovery"} 1
helios_scheduler_executions_total{class="timing_refresh"} 0
helios_scheduler_executions_total{class="acceptance_learning"} 0
# HELP helios_scheduler_execution_nanoseconds_total Raw execution time by accounting class.
# TYPE helios_scheduler_execution_nanoseconds_total counter
helios_scheduler_execution_nanoseconds_total{class="ordinary"} 14239000
helios_scheduler_execution_nanoseconds_total{class="discovery"} 5
helios_scheduler_execution_nanoseconds_total{class="timing_refresh"} 0
helios_scheduler_execution_nanoseconds_total{class="acceptance_learning"} 0
# HELP helios_scheduler_selections_total Committed plans by program kind.
# TYPE helios_scheduler_selections_total counter
helios_scheduler_selections_total{kind="mixed"} 1
helios_scheduler_selections_total{kind="speculative"} 2
# HELP helios_speculative_programs_total Complete speculative programs (not producer or target calls).
# TYPE helios_speculative_programs_total counter
helios_speculative_programs_total 2
# TYPE helios_speculative_drafts_offered_total counter
helios_speculative_drafts_offered_total 6
# TYPE helios_speculative_learned_draws_total counter
helios_speculative_learned_draws_total 6
# TYPE helios_speculative_drafts_accepted_total counter
helios_speculative_drafts_accepted_total 4
# TYPE helios_speculative_accepted_by_position_total counter
helios_speculative_accepted_by_position_total{position="1"} 2
helios_speculative_accepted_by_position_total{position="2"} 2
helios_speculative_accepted_by_position_total{position="3"} 0
# TYPE helios_speculative_offered_by_position_total counter
helios_speculative_offered_by_position_total{position="1"} 2
helios_speculative_offered_by_position_total{position="2"} 2
helios_speculative_offered_by_position_total{position="3"} 2
# TYPE helios_scheduler_refresh_credit_ms gauge
helios_scheduler_refresh_credit_ms 0.0285
# TYPE helios_scheduler_learning_credit_ms gauge
helios_scheduler_learning_credit_ms 5.0
"""
    )


def test_speculative_proposals_render_by_source():
    """The scheduler's draft counters (one learned round offering 3 and accepting 2, one copy
    round offering 5 and accepting 4) render as offered and accepted series per source."""
    from helios_jax.scheduler.stats import Counters
    from helios_jax.serve.engine_metrics import render_source_counters

    counters = Counters()
    counters.drafts(True, 3, 2)
    counters.drafts(False, 5, 4)
    text = "\n".join(render_source_counters(counters.speculative)) + "\n"
    assert metric_value(text, 'helios_speculative_source_offered_total{source="learned"}') == 3
    assert metric_value(text, 'helios_speculative_source_accepted_total{source="learned"}') == 2
    assert metric_value(text, 'helios_speculative_source_offered_total{source="copy"}') == 5
    assert metric_value(text, 'helios_speculative_source_accepted_total{source="copy"}') == 4
