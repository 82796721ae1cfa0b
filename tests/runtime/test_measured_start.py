"""An engine measured before serving (``HeliosEngine(measure_runs=N)``): every program's duration
estimate starts from N isolated samples, service then discovers nothing, the measurement's
scratch runs leave the served output unchanged, each run is checked across ranks, and a time
budget bounds a long program's runs."""

import types

import numpy as np
import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.prepare import measure_samples
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer
from .test_engine import offline_greedy

RUNS = 2
EC = EngineConfig(
    request_slots=2,
    prefill_chunks=(64,),
    speculation="off",
    draft_tokens=0,
    max_model_len=128,
    decode_steps=(1, 4),
)


@pytest.fixture(scope="module")
def engine():
    config, params = model()
    eng = HeliosEngine(
        model_config=config,
        params=params,
        tokenizer=tokenizer(),
        engine_config=EC,
        check_invariants=True,
        measure_runs=RUNS,
    )
    yield eng
    eng.shutdown()


def test_every_program_starts_with_its_measured_samples(engine):
    """Each catalog program holds RUNS positive samples (in ns) and their median as its estimate,
    observed once the programs were compiled, before any request."""
    costs = engine.scheduler.costs
    for g in engine.catalog.graphs:
        samples = costs.samples(g.key)
        assert len(samples) == RUNS and min(samples) > 0, g.name
        assert costs.estimate_ns(g.key) == pytest.approx(float(np.median(samples))), g.name
        assert costs.last_valid_ns(g.key) is not None


def test_a_measured_engine_serves_greedy_output_without_discovery(engine):
    """Greedy output equals offline greedy decoding (the measurement ran on a scratch state), and
    no program needed a discovery execution in service."""
    prompt = [(7 * i + 3) % 97 + 1 for i in range(40)]
    request = GenerationRequest("m", tuple(prompt), SamplingParams(max_tokens=12, temperature=0.0))
    tokens = [t for e in engine.submit(request) for t in e.token_ids]
    assert tokens == offline_greedy(prompt, 12)
    assert engine.scheduler.counters.executions["discovery"] == 0
    assert sum(engine.scheduler.counters.executions.values()) > 0


def test_measurement_runs_must_be_counted():
    """Zero timed runs is not a measurement; a negative or non-integer count is refused before
    the engine builds anything."""
    with pytest.raises(ValueError, match="runs must be at least 1"):
        measure_samples(None, None, runs=0)
    config, params = model()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="measure_runs must be a nonnegative integer"):
            HeliosEngine(
                model_config=config, params=params, tokenizer=tokenizer(), engine_config=EC, measure_runs=bad
            )


def test_the_server_engine_is_measured_as_its_flag_says(monkeypatch):
    """`build_real_engine` (serve's default factory) hands `--measure_runs` to the engine."""
    from helios_jax.engine_options import EngineOptions
    from helios_jax.runtime import engine as engine_module

    built = {}
    model_config, _ = model()
    loaded = types.SimpleNamespace(config=model_config, params="params", tokenizer="tokenizer")
    monkeypatch.setattr(engine_module, "enable_compilation_cache", lambda: None)
    monkeypatch.setattr(engine_module, "load_engine_model", lambda *a, **k: loaded)
    monkeypatch.setattr(engine_module.HFTokenizer, "from_model", staticmethod(lambda m: "hf"))
    monkeypatch.setattr(engine_module, "HeliosEngine", lambda **kwargs: built.update(kwargs) or "engine")
    for runs in (0, 7):
        assert engine_module.build_real_engine(EngineOptions(measure_runs=runs), progress=None) == "engine"
        assert built["measure_runs"] == runs and built["params"] == "params"


class _Checked:
    """A program whose outputs the ranks must agree on (a led program of several processes)."""

    def __init__(self, program):
        self.program, self.checked = program, 0

    def __getattr__(self, name):
        return getattr(self.program, name)

    def __call__(self, params, state, inputs):
        return self.program(params, state, inputs)

    def check(self, outputs):
        self.checked += 1


def test_every_measured_run_is_checked_across_ranks(engine):
    """With several processes each run of the measurement, the untimed one included, is checked
    as warm-up's is (a follower's answer is read, so the ranks stay in step)."""
    programs = engine._programs
    checked = [_Checked(p) for p in list(programs.values())[:3]]
    group = types.SimpleNamespace(
        engine_config=programs.engine_config, init_state=programs.init_state, values=lambda: checked
    )
    samples = measure_samples(group, engine.executor.params, runs=RUNS)
    assert [p.checked for p in checked] == [RUNS + 1] * 3
    assert all(len(samples[p.key]) == RUNS for p in checked)


def test_a_time_budget_stops_a_programs_timed_runs_after_the_first(engine):
    """With a budget every program is timed at least once and stops once its timed runs add up
    to the budget; without one it gets every run."""
    programs = engine._programs
    group = types.SimpleNamespace(
        engine_config=programs.engine_config,
        init_state=programs.init_state,
        values=lambda: list(programs.values())[:3],
    )
    params = engine.executor.params
    tight = measure_samples(group, params, runs=3, budget_s=1e-9)
    assert [len(v) for v in tight.values()] == [1, 1, 1]
    loose = measure_samples(group, params, runs=3, budget_s=60.0)
    assert [len(v) for v in loose.values()] == [3, 3, 3]


def test_the_engine_measures_within_the_start_up_budget(monkeypatch):
    """The engine's measurement asks for its runs within `MEASURE_BUDGET_S` a program, and seeds
    what it measured at the time it is given."""
    import helios_jax.prepare as prepare_module
    from helios_jax.runtime.scheduling import MEASURE_BUDGET_S, measure_into

    asked, seeded = {}, []
    measured = {"k": [1.0]}
    monkeypatch.setattr(prepare_module, "measure_samples", lambda p, q, **kw: asked.update(kw) or measured)
    scheduler = types.SimpleNamespace(seed_costs=lambda now, samples: seeded.append((now, samples)) or 1)
    assert measure_into(scheduler, None, None, 4, 123, None) == 1
    assert asked == {"runs": 4, "budget_s": MEASURE_BUDGET_S} and 0 < MEASURE_BUDGET_S <= 1
    assert seeded == [(123, measured)]


def test_programs_are_measured_in_rounds_each_once_a_round(engine):
    """Every program runs once a round, the untimed round first, so a passing disturbance of the
    machine reaches one sample of many programs rather than all of one program's; a program
    past its budget sits out the later rounds."""
    calls = []

    class Logged(_Checked):
        def __call__(self, params, state, inputs):
            calls.append(self.program.key)
            return self.program(params, state, inputs)

    programs = engine._programs
    logged = [Logged(p) for p in list(programs.values())[:3]]
    keys = [p.key for p in logged]
    group = types.SimpleNamespace(
        engine_config=programs.engine_config, init_state=programs.init_state, values=lambda: logged
    )
    measure_samples(group, engine.executor.params, runs=2)
    assert calls == keys * 3
    calls.clear()
    measure_samples(group, engine.executor.params, runs=4, budget_s=1e-9)
    assert calls == keys * 2  # the warm-up round and one timed run each
