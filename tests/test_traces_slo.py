"""Trace parsing and replay windows (helios_jax.traces), SLO measures (helios_jax.slo), and the
trace scenario of the simulator, on small hand-made traces whose answers are worked out below."""

import io

import pytest

from helios_jax import simulation as sim
from helios_jax import slo, traces
from helios_jax.catalog import shipped_catalog
from helios_jax.simulation_stats import RequestStats

# Four requests; the third line is earlier than the second (the parser sorts by arrival).
CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.5000000,374,44
2023-11-16 18:15:48.0000000,9000,100
2023-11-16 18:15:47.2500000,91,16
2023-11-16 18:15:50.5000005,0,0
"""


def rows():
    return traces.parse_azure_rows(io.StringIO(CSV))


def test_parser_reads_arrivals_in_ms_from_the_first_row_sorted():
    got = rows()
    assert [r.arrival_ms for r in got] == [0.0, 750.0, 1500.0, 4000.0]  # .5000005 s: microseconds kept
    assert [(r.prompt_tokens, r.output_tokens) for r in got] == [(374, 44), (91, 16), (9000, 100), (0, 0)]


@pytest.mark.parametrize(
    "text",
    [
        "TIME,ContextTokens,GeneratedTokens\n",  # wrong header
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,1\n",  # two fields
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,1,x\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,-1,3\n",
    ],
)
def test_parser_rejects_malformed_input(text):
    with pytest.raises(ValueError):
        traces.parse_azure_rows(io.StringIO(text))


def test_replay_scales_arrivals_and_clips_prompts_to_the_slot_context():
    replay = traces.replay_requests(rows(), start=1, count=3, rate_scale=2.0, context_limit=4096)
    # From the window's first row (750 ms), gaps halved.
    assert replay.arrivals_ms == [0.0, 375.0, 1625.0]
    # 9000 + 100 > 4096: the prompt is cut to 3996 and the output kept; 0 tokens become 1.
    assert replay.prompt_tokens == [91, 3996, 1]
    assert replay.output_tokens == [16, 100, 1]
    assert (replay.clipped, replay.clipped_tokens) == (1, 9000 - 3996)
    assert replay.duration_ms == 1625.0
    assert traces.offered_rate_per_s(replay) == pytest.approx(2 / 1.625)


def test_replay_rejects_an_empty_window_or_bad_scale():
    with pytest.raises(ValueError):
        traces.replay_requests(rows(), start=10)
    with pytest.raises(ValueError):
        traces.replay_requests(rows(), rate_scale=0.0)


def stats(prompt, first, publications, finished=True, arrival=0.0):
    r = RequestStats(arrival, prompt, first_output_ms=first, publications=list(publications))
    r.output_tokens = len(publications)
    r.finished_ms = publications[-1] if finished else None
    r.end_ms = publications[-1] if finished else publications[-1] + 500.0
    return r


SLO = slo.SloTargets(ttft_base_ms=100.0, ttft_per_prompt_token_ms=0.5, gap_ms=50.0)


def test_attainment_needs_first_output_in_time_every_gap_in_bound_and_a_finish():
    good = stats(200, 200.0, [200.0, 240.0, 280.0])  # target 100 + 0.5*200 = 200: exactly in time
    late = stats(200, 201.0, [201.0, 210.0])  # 1 ms over
    long_prompt = stats(2000, 1000.0, [1000.0, 1020.0])  # target 1100: in time
    stalled = stats(10, 20.0, [20.0, 71.0, 80.0])  # a 51 ms gap
    open_wait = stats(10, 20.0, [20.0, 30.0], finished=False)  # unfinished (and a 500 ms open wait)
    assert [slo.attains(r, SLO) for r in (good, late, long_prompt, stalled, open_wait)] == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert slo.attainment([good, late, long_prompt, stalled, open_wait], SLO) == pytest.approx(0.4)
    # The unfinished stream's outputs were 10 ms apart, but it then waited 500 ms with none.
    assert not slo.meets_gap(open_wait, SLO)
    summary = slo.summarize([good, late, long_prompt, stalled], SLO)
    assert summary["ttft_attainment"] == 0.75 and summary["gap_attainment"] == 0.75
    # Buckets by prompt length: 200, 200, 10 tokens in 0-511; 2000 tokens in 512-2047.
    assert summary["by_prompt"]["0-511"]["requests"] == 3
    assert summary["by_prompt"]["512-2047"]["ttft_p99_ms"] == 1000.0
    assert summary["by_prompt"]["2048-4095"] == {
        "requests": 0,
        "ttft_p50_ms": None,
        "ttft_p99_ms": None,
        "gap_p99_ms": None,
    }


def test_goodput_is_the_last_rate_before_the_first_miss_with_a_linear_crossing():
    got = slo.goodput([4.0, 2.0, 6.0, 8.0], [0.95, 1.0, 0.8, 0.95], target=0.9)
    # 4 req/s meets (0.95), 6 misses (0.8): crossing at 4 + (0.95-0.9)/(0.95-0.8) * 2 = 4.667.
    assert got["rate"] == 4.0 and got["bounded"]
    assert got["interpolated"] == pytest.approx(4.0 + 2.0 / 3.0)
    assert slo.goodput([1.0, 2.0], [0.99, 0.91]) == {"rate": 2.0, "interpolated": 2.0, "bounded": False}
    below = slo.goodput([1.0, 2.0], [0.5, 0.4])
    assert below["rate"] == 0.0 and below["interpolated"] == pytest.approx(0.2)  # from (0, 1.0)


def test_jain_normalized_latency_and_the_pareto_front():
    assert slo.jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert slo.jain([1.0, 0.0]) == pytest.approx(0.5)
    assert slo.normalized_latency_ms(stats(10, 20.0, [20.0, 30.0, 60.0])) == pytest.approx(20.0)
    higher = (True, False, False)  # goodput up, two latencies down
    points = {"a": (5.0, 1.0, 50.0), "b": (4.0, 1.0, 50.0), "c": (6.0, 2.0, 40.0), "d": (5.0, 1.0, 50.0)}
    assert slo.dominates(points["a"], points["b"], higher)
    assert not slo.dominates(points["a"], points["d"], higher)  # equal is not domination
    assert slo.pareto_front(points, higher) == ["a", "c", "d"]


def test_the_trace_scenario_replays_the_given_arrivals():
    replay = traces.replay_requests(rows(), rate_scale=4.0, context_limit=1024)
    config = sim.SimConfig(
        shipped_catalog("synthetic-h200-ordinary"),
        scenario="trace",
        requests=replay.requests,
        prompt_tokens=replay.prompt_tokens,
        output_tokens=replay.output_tokens,
        arrivals_ms=replay.arrivals_ms,
        horizon_ms=1e6,
        rounds=10**9,
    )
    result = sim.run(config)
    assert [r.arrival_ms for r in result.requests] == [0.0, 187.5, 375.0, 1000.0]
    assert [r.output_tokens for r in result.requests] == [44, 16, 100, 1]  # forced lengths
    assert [r.prompt_tokens for r in result.requests] == [374, 91, 924, 1]
    assert all(p >= r.arrival_ms for r in result.requests for p in r.publications)
    with pytest.raises(ValueError, match="ascending"):
        sim.run(sim.SimConfig(config.catalog, scenario="trace", requests=2, arrivals_ms=[5.0, 1.0]))
