"""Suite-wide configuration: spec rule markers are checked against the rule catalog.

Every test marks the rule ids it checks with ``@pytest.mark.spec("section/rule", ...)``. An id
that the catalog (helios_jax/conformance/RULES.md, the copy of docs/spec/RULES.md that ships
with the package) does not define is a collection error, so the traceability cannot drift.
"""
import os
import pathlib

import pytest

from helios_jax.conformance.rules import rule_ids

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Compile-heavy sessions reuse XLA executables across runs.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


RULE_IDS = rule_ids()


def pytest_collection_modifyitems(config, items):
    unknown = []
    for item in items:
        for mark in item.iter_markers("spec"):
            for rule_id in mark.args:
                if rule_id not in RULE_IDS:
                    unknown.append(f"{item.nodeid}: {rule_id}")
    if unknown:
        raise pytest.UsageError("unknown spec rule ids:\n  " + "\n  ".join(unknown))
