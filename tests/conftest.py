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

# Compile-heavy sessions reuse XLA executables across runs.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


RULE_IDS = rule_ids()

# `make mutation` (--hypothesis-profile=mutation): every mutant meets the same examples, and no
# example database carries one mutant's counterexamples into the next mutant's run.
settings.register_profile("mutation", derandomize=True, database=None)


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
