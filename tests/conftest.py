"""Suite-wide configuration: spec rule markers are checked against the rule catalog.

Every test marks the rule ids it checks with ``@pytest.mark.spec("section/rule", ...)``. An id
that the catalog (helios_jax/conformance/RULES.md, the copy of docs/spec/RULES.md that ships
with the package) does not define is a collection error, so the traceability cannot drift.
"""

import json
import os
import pathlib

import pytest
from hypothesis import settings

from helios_jax.conformance.rules import rule_ids

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Compile-heavy sessions reuse XLA executables across runs, and across the files and subprocesses
# of one run (`prepare` in a subprocess after the same catalog compiled in-process): every
# executable is cached, however quickly it compiled (JAX's default keeps those over a second,
# and at the optimisation level below most of the suite's programs compile faster than that).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The suite runs on the CPU (compiled Pallas classes skip there). HELIOS_TEST_PLATFORM=gpu
# (scripts/gpu/check.sh) runs it on the GPU instead, and refuses to start on anything else, so
# the compiled kernel classes execute rather than skip while the run looks green.
TEST_PLATFORM = os.environ.get("HELIOS_TEST_PLATFORM", "cpu")
if TEST_PLATFORM == "gpu":
    os.environ["JAX_PLATFORMS"] = "cuda"
else:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # The suite's models are tiny: compiling their programs, not running them, is most of the
    # suite's time, and LLVM's optimisation passes are a quarter of a compile (the 17-program
    # engine catalog of tests/runtime/test_engine.py: 40.5 s at the default level, 30.2 s at 0).
    # XLA's own passes and floating-point semantics are the same at every level.
    # XLA's fusion emitters (the default) take another third of a compile over the elemental
    # emitters they replace: the 17-program engine of tests/runtime/test_engine.py, cold, 39.7 s
    # of compilation with them and 26.1 s without (`xla_cpu_use_fusion_emitters=false`).
    for flag in ("xla_backend_optimization_level=0", "xla_cpu_use_fusion_emitters=false"):
        if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --" + flag).strip()


RULE_IDS = rule_ids()

# `make mutation` (--hypothesis-profile=mutation): every mutant meets the same examples, and no
# example database carries one mutant's counterexamples into the next mutant's run.
settings.register_profile("mutation", derandomize=True, database=None)


def pytest_sessionstart(session):
    if TEST_PLATFORM not in ("cpu", "gpu"):
        raise pytest.UsageError(f"HELIOS_TEST_PLATFORM must be cpu or gpu, got {TEST_PLATFORM!r}")
    if TEST_PLATFORM == "gpu":
        import jax

        if jax.default_backend() != "gpu":
            raise pytest.UsageError(f"HELIOS_TEST_PLATFORM=gpu, but jax runs on {jax.default_backend()}")


def pytest_addoption(parser):
    parser.addoption(
        "--fastest-first",
        action="store_true",
        help="run tests in order of their durations in mutmut-stats.json (make mutation runs "
        "from mutants/, where mutmut records them): a mutant dies at its quickest failing test",
    )


def _mutmut_durations() -> dict[str, float]:
    try:
        return json.loads(pathlib.Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return {}


def _file_times() -> dict[str, float]:
    """Recorded seconds per test file (tests/durations.json, scripts/test_durations.py)."""
    try:
        return json.loads((ROOT / "tests" / "durations.json").read_text())
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config, items):
    unknown = []
    for item in items:
        for mark in item.iter_markers("spec"):
            for rule_id in mark.args:
                if rule_id not in RULE_IDS:
                    unknown.append(f"{item.nodeid}: {rule_id}")
    if unknown:
        raise pytest.UsageError("unknown spec rule ids:\n  " + "\n  ".join(unknown))
    if config.getoption("--fastest-first"):
        durations = _mutmut_durations()
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
    else:
        # Longest files first, so that two xdist workers taking whole files finish together
        # (`make test`: --dist loadfile --no-loadscope-reorder); a stable sort keeps each
        # file's own order.
        times = _file_times()
        items.sort(key=lambda item: -times.get(item.nodeid.split("::")[0], 0.0))
