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
    assert r.render() == "\n".join([
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
    ]) + "\n"


def test_unlabelled_series_render_zero_before_any_observation():
    r = Registry()
    r.counter("a_total", "A.")
    r.histogram("b_seconds", "B.", buckets=(1.0,))
    text = r.render()
    assert "a_total 0\n" in text and 'b_seconds_bucket{le="+Inf"} 0\n' in text and "b_seconds_count 0\n" in text


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
