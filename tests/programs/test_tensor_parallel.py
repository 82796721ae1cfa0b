"""Tensor parallelism (docs/distributed.md): sharded programs equal the single-device programs.

The equality checks need several devices, which the CPU backend only offers when
XLA_FLAGS=--xla_force_host_platform_device_count is set before it starts; this suite's processes
run on one device, so they run in a subprocess (`tensor_parallel_run`): a random 8-head,
4-KV-head config at tensor_parallel=2 and 4 against its single-device programs over the same
trace (scored prefill, fixed and adaptive speculative rounds), and the embedded default model's
sharded load; the default model's own trace at 2 runs with the slow tests. The rest (flags,
refusals, the layout table) runs here on one device.
"""

import json
import os
import subprocess
import sys

import jax
import pytest
from absl import flags

from helios_jax.engine_options import EngineOptions
from helios_jax.model import tiny_config
from helios_jax.model.sharding import check_tensor_parallel, param_spec
from helios_jax.programs import build_programs

from ..environment import subprocess_env
from .helpers import MODEL, SPECULATIVE_ENGINE, speculative_catalog
from .tensor_parallel_trace import TOL

spec = pytest.mark.spec
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_cases(*cases: str) -> dict[str, dict]:
    env = subprocess_env()  # tensor_parallel_run forces its own four devices
    done = subprocess.run(
        [sys.executable, "-m", "tests.programs.tensor_parallel_run", *cases],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {r["case"]: r for r in map(json.loads, done.stdout.splitlines())}


@pytest.fixture(scope="module")
def kv4():
    """The 8-head, 4-KV-head model's trace at N = 1, 2 and 4 and the default model's sharded
    load, in one subprocess (three program sets of four programs: about a minute of a CPU)."""
    return _run_cases("kv4")["kv4"]


@spec("confidence-acceptance/rank-agreement", "confidence-acceptance/peer-valid-probs")
@pytest.mark.parametrize("degree", ["2", "4"])
def test_sharded_programs_equal_the_single_device_programs(kv4, degree):
    """Tokens, counts and query lengths identical, logits, log-probabilities, confidence and both
    KV pools within 1e-5 at N = 2 and N = 4 (asserted in the subprocess); every rank's copy of
    the outputs and row state agrees bitwise, and its confidence holds probabilities; each device
    holds only its block of the KV pools and split weights."""
    assert kv4["max_diff"][degree] < TOL
    assert set(kv4["seconds"]) == {"1", "2", "4"}
    # Every round emitted: the greedy tokens compared include a speculative round's.
    assert all(min(c) >= 1 for c in kv4["counts"])


def test_the_default_model_loads_into_its_shards(kv4):
    """`load_checkpoint(..., tensor_parallel=2)` puts each tensor of the embedded model in the
    layout the programs are lowered for, with the unsharded load's values (asserted in the
    subprocess)."""
    assert kv4["default_load_seconds"] > 0


@spec("confidence-acceptance/rank-agreement", "confidence-acceptance/peer-valid-probs")
@pytest.mark.slow  # the default model's programs compiled twice more (about a minute)
def test_the_default_model_at_two_equals_one_device_over_multi_token_rounds():
    """The embedded model at N = 2: its trained draft head gets up to three proposals accepted per
    round, so multi-token commits over sharded KV pools are compared too."""
    run = _run_cases("default-tp2")["default-tp2"]
    assert run["max_diff"]["2"] < TOL
    assert max(max(c) for c in run["counts"]) > 2


@pytest.mark.slow
def test_sharded_attention_kernel_equals_the_unsharded_kernel_on_both_paths():
    """The XLA path and the Pallas kernel (interpret mode) under shard_map at N = 2 and 4 equal
    the unsharded call (asserted in the subprocess within 1e-6) on shuffled, NaN-poisoned pages."""
    run = _run_cases("kernels")["kernels"]
    assert set(run["diffs"]) == {"xla-tp2", "xla-tp4", "pallas-tp2", "pallas-tp4"}


@pytest.mark.slow
def test_the_engine_serves_the_same_greedy_text_at_tensor_parallel_two():
    """The whole engine (every catalog program compiled sharded, scheduler, executor, fixed and
    adaptive speculative programs) over the default model: three concurrent greedy requests
    produce the same tokens at N = 1 and N = 2 (asserted in the subprocess; about 8 minutes)."""
    run = _run_cases("engine-tp2")["engine-tp2"]
    assert [len(t) for t in run["tokens"]] == [24, 24, 24]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_heads=6, num_kv_heads=2), "num_attention_heads"),
        (dict(num_heads=8, num_kv_heads=2), "num_key_value_heads"),
        (dict(num_heads=8, num_kv_heads=4, intermediate_size=66), "intermediate_size"),
        (dict(num_heads=8, num_kv_heads=4, vocab_size=258), "vocab_size"),
    ],
)
def test_degrees_that_do_not_divide_the_model_are_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        check_tensor_parallel(tiny_config(**overrides), 4)
    check_tensor_parallel(tiny_config(**overrides), 1)


def test_more_devices_than_present_are_refused():
    engine = SPECULATIVE_ENGINE.replace(tensor_parallel=jax.device_count() * 2)
    with pytest.raises(ValueError, match="devices"):
        build_programs(MODEL, None, engine, speculative_catalog())
    with pytest.raises(ValueError, match="tensor_parallel"):
        SPECULATIVE_ENGINE.replace(tensor_parallel=0)


def test_one_device_builds_no_mesh():
    programs = build_programs(MODEL, _shapes(), SPECULATIVE_ENGINE, speculative_catalog())
    assert programs.mesh is None
    params = {"w": jax.numpy.ones(2)}
    assert programs.place_params(params) is params


def test_the_flag_reaches_the_engine_config():
    fv = flags.FlagValues()
    EngineOptions.define_flags(fv)
    fv(["prog", "--tensor_parallel=8"])
    assert EngineOptions.from_flags(fv).engine_config(MODEL).tensor_parallel == 8
    fv = flags.FlagValues()
    EngineOptions.define_flags(fv)
    fv(["prog"])
    assert EngineOptions.from_flags(fv).engine_config(MODEL).tensor_parallel == 1


def test_layout_splits_heads_mlp_and_vocabulary():
    column, row, whole = ("tp",), ("tp", None), ()
    layer = ("layers_0",)
    assert tuple(param_spec(layer + ("self_attn", "q_proj", "kernel")))[1:] == column
    assert tuple(param_spec(layer + ("self_attn", "k_proj", "kernel")))[1:] == column
    assert tuple(param_spec(layer + ("self_attn", "o_proj", "kernel"))) == row
    assert tuple(param_spec(layer + ("mlp", "up_proj", "kernel")))[1:] == column
    assert tuple(param_spec(layer + ("mlp", "down_proj", "kernel"))) == row
    assert tuple(param_spec(("mtp", "layers_0", "mlp", "gate_proj", "kernel")))[1:] == column
    assert tuple(param_spec(("embed_tokens", "embedding"))) == row
    assert tuple(param_spec(("lm_head", "kernel")))[1:] == column
    assert tuple(param_spec(("norm", "weight"))) == whole
    assert tuple(param_spec(("mtp", "fc", "kernel"))) == whole


def _shapes():
    from helios_jax.model import param_shapes

    return param_shapes(MODEL)
