"""The Prometheus text registry renders the exposition format exactly."""

import pytest

from helios_jax.serve.metrics import Registry


def test_counter_gauge_and_histogram_render_exactly():
    r = Registry()
    c = r.counter("x_requests_total", "Requests.", ("status",))
    g = r.gauge("x_running", "Running.")
    h = r.histogram("x_seconds", "Latency.", buckets=(0.1, 1.0))
    c.inc(status="200")
    c.inc(2, status="400")
    g.inc()
    g.inc()
    g.dec()
    h.observe(0.1)  # `le` is inclusive: counted in the 0.1 bucket
    h.observe(0.5, count=2)
    h.observe(7.0)
    assert (
        r.render()
        == "\n".join(
            [
                "# HELP x_requests_total Requests.",
                "# TYPE x_requests_total counter",
                'x_requests_total{status="200"} 1',
                'x_requests_total{status="400"} 2',
                "# HELP x_running Running.",
                "# TYPE x_running gauge",
                "x_running 1",
                "# HELP x_seconds Latency.",
                "# TYPE x_seconds histogram",
                'x_seconds_bucket{le="0.1"} 1',
                'x_seconds_bucket{le="1"} 3',
                'x_seconds_bucket{le="+Inf"} 4',
                "x_seconds_sum 8.1",
                "x_seconds_count 4",
            ]
        )
        + "\n"
    )


def test_unlabelled_series_render_zero_before_any_observation():
    r = Registry()
    r.counter("a_total", "A.")
    r.histogram("b_seconds", "B.", buckets=(1.0,))
    text = r.render()
    assert (
        "a_total 0\n" in text and 'b_seconds_bucket{le="+Inf"} 0\n' in text and "b_seconds_count 0\n" in text
    )


def test_label_values_are_escaped():
    r = Registry()
    r.counter("e_total", "E.", ("path",)).inc(path='a"b\\c\nd')
    assert 'e_total{path="a\\"b\\\\c\\nd"} 1' in r.render()


def test_misuse_is_rejected():
    r = Registry()
    c = r.counter("ok_total", "OK.", ("a",))
    with pytest.raises(ValueError, match="already registered"):
        r.counter("ok_total", "again")
    with pytest.raises(ValueError, match="invalid metric name"):
        r.counter("bad-name", "x")
    with pytest.raises(ValueError, match="takes labels"):
        c.inc(b="1")
    with pytest.raises(ValueError, match="only increases"):
        c.inc(-1, a="1")
    with pytest.raises(ValueError, match="invalid label name"):
        r.histogram("h_seconds", "H.", buckets=(1.0,), labels=("le",))


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
