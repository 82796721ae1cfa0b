"""Suite-wide configuration: spec rule markers are checked against docs/spec/RULES.md.

Every test marks the rule ids it checks with ``@pytest.mark.spec("section/rule", ...)``. An id
that RULES.md does not define is a collection error, so the traceability table cannot drift.
"""
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RULES = ROOT / "docs" / "spec" / "RULES.md"

# Compile-heavy sessions reuse XLA executables across runs.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _rule_ids() -> set[str]:
    ids = set()
    for line in RULES.read_text().splitlines():
        m = re.match(r"\|\s*([a-z0-9-]+/[a-z0-9-]+)\s*\|", line)
        if m:
            ids.add(m.group(1))
    return ids


RULE_IDS = _rule_ids()


def pytest_collection_modifyitems(config, items):
    unknown = []
    for item in items:
        for mark in item.iter_markers("spec"):
            for rule_id in mark.args:
                if rule_id not in RULE_IDS:
                    unknown.append(f"{item.nodeid}: {rule_id}")
    if unknown:
        raise pytest.UsageError("unknown spec rule ids:\n  " + "\n  ".join(unknown))
