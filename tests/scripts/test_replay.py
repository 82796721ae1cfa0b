"""The trace replay study (scripts/scheduling_sim/replay_runs.py, replay_report.py): preference
settings, identical requests for every scheduler, the rate sweep's stop at the first miss, best
budgets, the Pareto front and the dominance table, on a hand-made trace."""

import importlib.util
import pathlib
import sys

import pytest

from helios_jax.scheduler.config import PolicyConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "scheduling_sim"


def _load(name):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


RUNS = _load("replay_runs")
REPORT = _load("replay_report")

# Six requests over 2.5 s: short prompts, short outputs (cheap to simulate).
CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0,300,12
2023-11-16 18:15:46.5,1200,8
2023-11-16 18:15:47.0,64,20
2023-11-16 18:15:47.5,2000,4
2023-11-16 18:15:48.0,128,16
2023-11-16 18:15:48.5,700,10
"""


def test_preference_settings_override_the_balanced_preset():
    assert RUNS.policy_of("throughput") == PolicyConfig.preset("throughput")
    got = RUNS.policy_of("beta=16;c=0.5")
    assert (got.output_token_value, got.decode_age_price) == (16.0, 0.5)
    assert got.token_fairness == PolicyConfig().token_fairness
    with pytest.raises(ValueError, match="unknown preference"):
        RUNS.policy_of("gamma=1")


def tasks(tmp_path, label, kind, budget, scales, gap_ms=200.0):
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    spec = dict(label=label, kind=kind, token_budget=budget, fixed_width=None, policy=label, mode=None)
    slo = dict(ttft_base_ms=250.0, ttft_per_prompt_token_ms=0.1, gap_ms=gap_ms, target=0.9)
    common = dict(
        trace=str(path),
        start=0,
        requests=6,
        context_limit=8192,
        catalog="synthetic-h200-ordinary",
        acceptance_probs=[0.5],
        horizon_ms=1e6,
        seed=0,
        slo=slo,
        stop_after_miss=True,
    )
    return [dict(common, spec=spec, scale=x) for x in scales]


def test_every_scheduler_replays_the_same_requests_and_a_sweep_stops_at_its_first_miss(tmp_path):
    utility = RUNS.run_setting(tasks(tmp_path, "balanced", "utility", None, [1.0, 2.0]))
    fcfs = RUNS.run_setting(tasks(tmp_path, "fcfs@2048", "fcfs", 2048, [1.0, 2.0]))
    assert [r["rate"] for r in utility] == [r["rate"] for r in fcfs] == [2.0, 4.0]  # 5 gaps in 2.5 s
    for runs in (utility, fcfs):
        assert [r["finished"] for r in runs] == [6, 6]
        assert runs[0]["attainment"] == 1.0  # light load: every request in time
    # A 1 ms gap target nobody meets: the sweep stops after its first (and only) rate.
    missed = RUNS.run_setting(tasks(tmp_path, "fcfs@2048", "fcfs", 2048, [2.0, 1.0], gap_ms=1.0))
    assert [(r["scale"], r["attainment"]) for r in missed] == [(1.0, 0.0)]


def run(label, budget, attainments, ttft_norm, gap, scales=(1.0, 2.0, 3.0)):
    family = label.split("@")[0]
    return [
        dict(
            label=label,
            family=family,
            budget=budget,
            scale=s,
            rate=2.0 * s,
            attainment=a,
            ttft_normalized_p99=ttft_norm,
            gap_p99_ms=gap,
            # the rest of helios_jax.slo.summarize's fields, which the tables print
            ttft_attainment=a,
            gap_attainment=1.0,
            ttft_p50_ms=10.0,
            ttft_p99_ms=100.0,
            gap_p50_ms=5.0,
            normalized_latency_mean_ms=20.0,
            jain=0.9,
            by_prompt={"0-511": {"ttft_p99_ms": 50.0}},
        )
        for s, a in zip(scales, attainments)
    ]


def test_study_picks_best_budgets_the_front_and_what_each_utility_setting_fails_to_dominate():
    runs = (
        run("balanced", None, [1.0, 0.95, 0.5], 0.5, 40.0)  # goodput 4 + 2*(0.05/0.45) = 4.22
        + run("beta=16", None, [1.0, 1.0, 0.92], 0.4, 30.0)  # 6+ (never misses)
        + run("fcfs@1024", 1024, [0.95, 0.8], 0.3, 80.0, scales=(1.0, 2.0))  # 2 + 2*(0.05/0.15) = 2.67
        + run("fcfs@4096", 4096, [1.0, 0.9, 0.3], 0.6, 90.0)  # 4 + 2*(0/0.6) = 4.0
        + run("sarathi@2048", 2048, [1.0, 0.5], 0.2, 20.0, scales=(1.0, 2.0))  # 2 + 2*(0.1/0.5) = 2.4
    )
    st = REPORT.study(runs, None, 0.9)
    assert st["reference_scale"] == 2.0  # the highest scale every setting ran
    assert st["settings"]["balanced"]["goodput"]["interpolated"] == pytest.approx(4.0 + 2.0 / 9.0)
    assert st["best"] == {"fcfs": "fcfs@4096", "sarathi": "sarathi@2048"}
    assert set(st["points"]) == {"balanced", "beta=16", "fcfs@4096", "sarathi@2048"}
    # beta=16 (6, 0.4, 30) dominates fcfs@4096 (4, 0.6, 90) but not sarathi@2048's latency (0.2, 20).
    assert st["not_dominated"] == {"balanced": ["sarathi@2048"], "beta=16": ["sarathi@2048"]}
    assert st["front"] == ["beta=16", "sarathi@2048"]
    text = REPORT.markdown(st)
    assert "| beta=16 | 6.00+ | 1.000 | 1.000 | 0.920 | yes |" in text
    assert "| fcfs@4096 |" in text and "fcfs@1024" not in text  # only best budgets are shown
