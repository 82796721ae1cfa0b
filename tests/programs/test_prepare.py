"""prepare compiles a small catalog ahead of time end to end, measures it and exports it."""

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from absl import flags

from helios_jax.catalog import Catalog, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.model import save_checkpoint
from helios_jax.prepare import load_engine_model, prepare, random_model
from helios_jax.prepare.command import define_flags, engine_from_flags

spec = pytest.mark.spec
ENGINE = EngineConfig(
    request_slots=1,
    prefill_chunks=(16,),
    speculation="adaptive",
    draft_tokens=1,
    speculative_token_capacity=4,
    max_model_len=32,
    page_size=8,
    snapshot_rows=1,
)


@pytest.fixture(scope="module")
def prepared():
    config, params = random_model()
    return (
        config,
        params,
        prepare(config, params, ENGINE, name="tiny", do_measure=True, runs=2, progress=None),
    )


@spec(
    "mixed-execution/planning-same-catalog", "mixed-execution/headroom-extent", "intro/stages-not-scheduled"
)
def test_prepare_compiles_measures_and_exports(prepared, tmp_path):
    config, params, out = prepared
    planned = ENGINE.catalog("tiny")
    assert [g.key for g in out.catalog.graphs] == [g.key for g in planned.graphs]  # planning == preparation
    assert all(p.compiled is not None and p.compile_seconds > 0 for p in out.programs.values())
    assert all(g.duration_ms and g.duration_ms > 0 for g in out.catalog.graphs)
    # Headroom: params, KV pool (target + MTP), a workspace, and the largest packed extent.
    h = out.headroom
    assert h.params_bytes == sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    layers = config.num_layers + config.mtp_num_layers
    assert (
        h.kv_pool_bytes
        == 2 * layers * config.num_kv_heads * ENGINE.kv_pages * ENGINE.page_size * config.head_dim * 4
    )
    assert h.max_packed_extent == out.catalog.max_packed_extent == 16  # the prefill chunk; speculative P = 2
    assert h.workspace_bytes >= 0 and h.lines()
    path = tmp_path / "measured.json"
    out.catalog.save(path)
    loaded = Catalog.load(path)
    assert loaded == out.catalog and json.loads(path.read_text())["graphs"][0]["duration_ms"] > 0


def test_programs_run_on_the_fused_parameters_prepare_returns(prepared):
    """`Prepared.params` are what the programs were lowered for: q/k/v and gate/up fused
    (`model/fused.py`), the same values as the checkpoint's separate kernels."""
    config, params, out = prepared
    assert out.programs.model_config == config.replace(fused_projections=True)
    block = out.params["mtp"]["layers_0"]
    assert set(block["self_attn"]) == {"qkv_proj", "o_proj", "q_norm", "k_norm"}
    assert set(block["mlp"]) == {"gate_up_proj", "down_proj"}
    np.testing.assert_array_equal(
        np.asarray(out.params["layers_0"]["mlp"]["gate_up_proj"]["kernel"][:, 1]),
        np.asarray(params["layers_0"]["mlp"]["up_proj"]["kernel"]),
    )


def test_prepare_builds_the_separate_products_on_request(monkeypatch):
    """`fused_projections=False`: the programs are built for the checkpoint's tree, unchanged
    (stopped at `build_programs`: compiling a second catalog would only repeat the fixture)."""
    import helios_jax.prepare as prepare_module

    class Built(Exception):
        pass

    built = []

    def capture(model_config, params, engine, catalog):
        built.append((model_config, params))
        raise Built

    monkeypatch.setattr(prepare_module, "build_programs", capture)
    config, params = random_model()
    for fused in (False, True):
        with pytest.raises(Built):
            prepare(config, params, ENGINE, name="tiny", fused_projections=fused, progress=None)
    assert built[0][0] == config and built[0][1] is params
    assert built[1][0].fused_projections and "qkv_proj" in built[1][1]["layers_0"]["self_attn"]


def test_compiled_programs_donate_the_state(prepared):
    config, _, out = prepared
    params = out.params  # what the programs run on
    program = out.programs.find(GraphKind.PREFILL)
    state = out.programs.init_state()
    old = state.target.k
    inputs = program.pack(slot=0, tokens=[1, 2, 3], page_table=list(range(4)), prompt_ends=True)
    state, result = program(params, state, inputs)
    assert old.is_deleted()  # the cache was updated in place
    assert int(state.cursor[0]) == 3 and int(result.counts[0]) == 1
    again = out.programs.init_state()
    again, jitted = program.fn(params, again, inputs)  # the traced path agrees with the AOT one
    np.testing.assert_array_equal(np.asarray(jitted.tokens), np.asarray(result.tokens))


def test_flags_mirror_the_engine_config():
    fv = flags.FlagValues()
    define_flags(fv)
    fv(
        [
            "prepare",
            "--concurrency=16",
            "--draft_tokens=7",
            "--proposal_depths=3,7",
            "--mixed_prefill",
            "--prefill_chunks=64,128",
            "--max_model_len=4096",
            "--speculation=fixed",
        ]
    )
    engine = engine_from_flags(fv)
    assert engine == EngineConfig(
        request_slots=16,
        draft_tokens=7,
        proposal_depths=(3, 7),
        mixed_prefill=True,
        prefill_chunks=(64, 128),
        max_model_len=4096,
        speculation="fixed",
        page_size=16,
        prefill_batch=(1, 4, 16),  # unset: 1, 4, 16 up to the concurrency
        decode_steps=(1, 4, 8),  # unset: width-one rounds of 1, 4 and 8 steps
    )
    fv.unparse_flags()
    fv(["prepare", "--speculation=off"])
    assert engine_from_flags(fv).catalog().mode == "ordinary"


def test_load_model_reads_a_checkpoint_folder(tmp_path):
    config, params = random_model(seed=3)
    save_checkpoint(tmp_path, config, params)
    loaded_model = load_engine_model(str(tmp_path), dtype="float32")
    loaded_config, loaded = loaded_model.config, loaded_model.params
    assert loaded_config == config
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=600)


@spec("mixed-execution/planning-same-catalog")
def test_the_conformance_command_passes_on_the_catalog_prepare_measures(tmp_path):
    """The two commands a deployment runs, end to end on a tiny checkpoint: `prepare --measure`
    compiles and times the engine's own catalog, and `conformance` holds on what it exported."""
    config, params = random_model(seed=1)
    save_checkpoint(tmp_path / "model", config, params)
    measured = tmp_path / "measured.json"
    prepared = _run(
        "helios_jax.prepare",
        f"--model={tmp_path / 'model'}",
        "--concurrency=1",
        "--prefill_chunks=16",
        "--max_model_len=32",
        "--page_size=8",
        "--speculation=adaptive",
        "--draft_tokens=1",
        "--measure",
        "--measure_runs=1",
        f"--catalog_out={measured}",
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    catalog = Catalog.load(measured)
    assert catalog.graphs and all(g.duration_ms > 0 for g in catalog.graphs)
    report = tmp_path / "report.json"
    # Every section but numerics, whose checks (logits against transformers, speculative against
    # plain decoding) run on their own models in tests/model and tests/programs.
    sections = "--sections=catalog,selection,startup,budgets,lifecycle"
    checked = _run(
        "helios_jax.conformance", f"--catalog={measured}", sections, "--cases=20", f"--json_out={report}"
    )
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    counts = json.loads(report.read_text())["counts"]
    # One request slot: the startup traces' 5 and 16 requests are "not achievable", never "fail".
    assert counts["fail"] == 0 and counts["pass"] >= 5, counts


def test_compile_on_threads_compiles_every_program_once(monkeypatch):
    """compile_all on several threads (a GPU's default) compiles every program of the catalog and
    reports each once, counting up to the catalog's size; the worker count comes from
    HELIOS_COMPILE_WORKERS when set."""
    from helios_jax.programs import program_set
    from helios_jax.programs.program_set import build_programs, compile_workers

    config, params = random_model()
    programs = build_programs(config, params, ENGINE, ENGINE.catalog("tiny"))
    heard, threads = [], set()
    compile_one = program_set.Program.compile

    def compile_on(program, *specs):
        threads.add(threading.current_thread().name)
        return compile_one(program, *specs)

    monkeypatch.setattr(program_set.Program, "compile", compile_on)
    programs.compile_all(lambda i, n, program: heard.append((i, n, program.key)), workers=3)
    assert threads and all(name.startswith("compile") for name in threads)  # not on the caller's thread
    n = len(programs)
    assert [i for i, _, _ in heard] == list(range(1, n + 1)) and {m for _, m, _ in heard} == {n}
    assert sorted(map(str, (key for _, _, key in heard))) == sorted(map(str, programs))
    assert all(p.compiled is not None and p.compile_seconds > 0 for p in programs.values())
    monkeypatch.setenv("HELIOS_COMPILE_WORKERS", "5")
    assert compile_workers() == 5
    monkeypatch.delenv("HELIOS_COMPILE_WORKERS")
    assert compile_workers() == (1 if jax.default_backend() == "cpu" else min(8, os.cpu_count() or 1))


class _Recording:
    """A program that records every row's cursor as each run of it starts."""

    def __init__(self, program, seen):
        self._program, self._seen = program, seen

    def __getattr__(self, name):
        return getattr(self._program, name)

    def __call__(self, params, state, inputs):
        self._seen.append((self._program.shape, np.asarray(state.cursor).copy()))
        return self._program(params, state, inputs)


def test_warm_up_runs_every_program_within_max_model_len():
    """warm_up runs the programs one after another on one state; each starts from reset cursors,
    so prompt rows never run past max_model_len (past their page windows, where the attention
    kernel would read beyond a row's page table: a fault on a GPU), even where the catalog's
    prefill chunks add up to more than max_model_len."""
    from helios_jax.prepare.measurement import warm_up

    engine = ENGINE.replace(prefill_chunks=(16, 32), speculation="off", draft_tokens=0, proposal_depths=None)
    config, params = random_model()
    out = prepare(config, params, engine, name="tiny", progress=None)
    seen = []
    recording = {key: _Recording(program, seen) for key, program in out.programs.items()}
    warm_up(dataclasses.replace(out.programs, programs=recording), out.params)
    assert len(seen) == len(out.programs)
    for shape, cursors in seen:
        if shape.kind.is_prefill:
            assert (cursors[: shape.lanes] + shape.prefill_capacity <= engine.max_model_len).all(), shape
        elif shape.kind.is_generation:
            reach = shape.width + shape.depth + shape.steps - 1
            assert (cursors[: shape.lanes] + reach <= engine.max_model_len).all(), shape


def test_a_failed_compilation_on_threads_raises_and_starts_no_more(monkeypatch):
    """A compilation that fails on a worker thread raises from compile_all, and the programs not
    yet started are not compiled."""
    from helios_jax.programs import program_set
    from helios_jax.programs.program_set import build_programs

    config, params = random_model()
    programs = build_programs(config, params, ENGINE, ENGINE.catalog("tiny"))
    started = []

    def failing(program, *specs):
        started.append(program.key)
        if len(started) > 1:
            time.sleep(0.2)  # the others are slow: the failure is seen while they run
        raise RuntimeError("compilation failed")

    monkeypatch.setattr(program_set.Program, "compile", failing)
    with pytest.raises(RuntimeError, match="compilation failed"):
        programs.compile_all(workers=1 + 1)
    assert 1 <= len(started) < len(programs)
