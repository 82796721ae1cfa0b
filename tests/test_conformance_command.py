"""The conformance command: verdicts, 'not achievable' catalogs, and the command line."""
import dataclasses
import json
import subprocess
import sys

from helios_jax.catalog import shipped_catalog
from helios_jax.conformance import checks
from helios_jax.scheduler.config import PolicyConfig


def test_a_catalog_too_slow_for_a_bound_is_not_achievable_rather_than_failed():
    slow = shipped_catalog("synthetic-h200-ordinary")
    slow = dataclasses.replace(slow, graphs=tuple(dataclasses.replace(g, duration_ms=g.duration_ms * 30)
                                                  for g in slow.graphs))
    rows = checks.startup_checks(slow, PolicyConfig())
    verdicts = {r.check: r for r in rows}
    sixteen = verdicts["16 requests, 0 accepted drafts, untrained"]
    assert sixteen.verdict == "not achievable" and "> 100 ms" in sixteen.figure  # 16 x 145.6 ms
    assert verdicts["5 requests, 3 accepted drafts, untrained"].verdict == "n/a"  # an ordinary catalog
    assert not any(r.verdict == "fail" for r in rows)


def test_command_line(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "helios_jax.conformance", "--sections=catalog,selection",
                           "--cases=20", f"--json_out={out}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "## selection" in proc.stdout and "0 failed" in proc.stdout
    report = json.loads(out.read_text())
    assert report["counts"]["fail"] == 0 and report["counts"]["pass"] == 2
