"""The traceability table is generated from the suite and every checkable rule is accounted for."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_packaged_rule_catalog_is_the_docs_copy():
    packaged = ROOT / "helios_jax" / "conformance" / "RULES.md"
    assert packaged.read_text() == (ROOT / "docs" / "spec" / "RULES.md").read_text()


def test_conformance_table_is_current_and_complete():
    """Regenerates docs/conformance.md from the collected markers: it must equal the committed
    file, every checkable rule must have a test or an open entry, and no open entry may have
    gained a test."""
    out = subprocess.run(
        [sys.executable, "-m", "helios_jax.conformance.trace", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
