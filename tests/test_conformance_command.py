"""The conformance command: verdicts, 'not achievable' catalogs, and the command line."""

import dataclasses
import json
import subprocess
import sys

import pytest

from helios_jax import catalog_family
from helios_jax.catalog import Catalog, GraphKind, shipped_catalog
from helios_jax.conformance import checks
from helios_jax.scheduler.config import PolicyConfig


def test_a_catalog_too_slow_for_a_bound_is_not_achievable_rather_than_failed():
    slow = shipped_catalog("synthetic-h200-ordinary")
    slow = dataclasses.replace(
        slow, graphs=tuple(dataclasses.replace(g, duration_ms=g.duration_ms * 30) for g in slow.graphs)
    )
    rows = checks.startup_checks(slow, PolicyConfig())
    verdicts = {r.check: r for r in rows}
    sixteen = verdicts["16 requests, 0 accepted drafts, untrained"]
    assert sixteen.verdict == "not achievable" and "> 100 ms" in sixteen.figure  # 16 x 145.6 ms
    assert verdicts["5 requests, 3 accepted drafts, untrained"].verdict == "n/a"  # an ordinary catalog
    assert not any(r.verdict == "fail" for r in rows)


def test_command_line(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "helios_jax.conformance",
            "--sections=catalog,selection",
            "--cases=20",
            f"--json_out={out}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "## selection" in proc.stdout and "0 failed" in proc.stdout
    report = json.loads(out.read_text())
    assert report["counts"]["fail"] == 0 and report["counts"]["pass"] == 2


def _catalog(**keywords):
    return Catalog.from_json(catalog_family.build(**keywords))


def test_more_requests_than_slots_are_not_achievable_rather_than_failed(monkeypatch):
    """Sixteen startup requests on eight request slots: eight are never admitted (no slot frees),
    which is the catalog's limit, not the scheduler's failure (it used to read "first output inf")."""
    eight = _catalog(slots=8, R=32)
    assert "request slots" in checks.startup_achievability(eight, 16)
    assert checks.startup_achievability(eight, 5) is None
    ran = []
    monkeypatch.setattr(
        checks,
        "startup_trace",
        lambda catalog, policy, n, *args, **kw: ran.append(n) or checks.Result("startup", "run", "pass", ""),
    )
    rows = {
        r.check: r for r in checks.startup_checks(eight, PolicyConfig()) if r.check.startswith("16 requests")
    }
    assert ran == [5] * 6  # only the five-request traces run
    assert len(rows) == 6 and all(r.verdict == "not achievable" for r in rows.values())
    assert "16 requests > 8 request slots" in rows["16 requests, 7 accepted drafts, preseeded"].figure


def test_gap_achievability_counts_mixed_programs_among_generation_rounds():
    """A catalog whose separate decode programs are too slow for the gap bound but whose mixed
    programs are fast can still meet it: the fastest round is a mixed one."""
    base = shipped_catalog("synthetic-h200-ordinary")
    slow_decode = dataclasses.replace(
        base,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=g.duration_ms * 60) if g.kind is GraphKind.DECODE else g
            for g in base.graphs
        ),
    )
    fastest_mixed = min(g.duration_ms for g in base.graphs if g.kind is GraphKind.MIXED)
    assert min(g.duration_ms for g in slow_decode.graphs if g.kind is GraphKind.DECODE) >= checks.GAP_MS
    assert checks._fastest_round_ms(slow_decode) == fastest_mixed
    assert checks.startup_achievability(slow_decode, 5) is None
    everything_slow = dataclasses.replace(
        slow_decode,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=g.duration_ms * 60) if g.kind is GraphKind.MIXED else g
            for g in slow_decode.graphs
        ),
    )
    assert "fastest generation round" in checks.startup_achievability(everything_slow, 5)


def test_gap_needs_a_rotation_within_the_bound():
    """Sixteen streams on programs that serve at most two at a time, 20 ms each: serving every
    stream once takes at least 160 ms, so the 150 ms gap bound is out of reach."""
    base = shipped_catalog("synthetic-h200-ordinary")
    narrow = dataclasses.replace(
        base,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=20.0) if g.kind.is_generation else g
            for g in base.graphs
            if not (g.kind.is_generation and g.batch_capacity > 2)
        ),
    )
    assert checks._rotation_ms(narrow, 16) == pytest.approx(160.0)
    why = checks.startup_achievability(narrow, 16)
    assert why is not None and "serving each of 16 streams once" in why
    assert checks.startup_achievability(narrow, 5) is None  # 5 x 10 ms = 50 ms


def test_first_output_achievability_counts_mixed_prompt_rows():
    base = shipped_catalog("synthetic-h200-ordinary")
    prompt_programs = [g for g in base.graphs if g.kind in (GraphKind.PREFILL, GraphKind.MIXED)]
    assert checks._prompt_ms(base, 64) == min(g.duration_ms for g in prompt_programs)
    fast_mixed = dataclasses.replace(
        base,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=1.0)
            if g.kind is GraphKind.MIXED and g.prefill_capacity == 64
            else g
            for g in base.graphs
        ),
    )
    assert checks._prompt_ms(fast_mixed, 64) == 1.0
    assert checks._prompt_ms(base, 100) == min(
        g.duration_ms
        for g in prompt_programs
        if (g.token_capacity if g.kind is GraphKind.PREFILL else g.prefill_capacity) >= 128
    )


def test_generated_family_on_the_command_line(tmp_path):
    out = tmp_path / "family.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "helios_jax.conformance",
            "--generated=2",
            "--generated_seed=5",
            "--sections=catalog",
            f"--json_out={out}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[1/2] generated-5-000" in proc.stdout and "in total over 2 catalogs" in proc.stdout
    report = json.loads(out.read_text())
    assert report["generated"] == 2 and [c["params"] for c in report["catalogs"]] == [
        m.params for m in catalog_family.family(2, 5)
    ]
    assert report["counts"]["pass"] == 2 and report["counts"]["fail"] == 0


def test_generated_startup_tallies_verdicts():
    """The family runner on one small generated catalog: every trace is run or ruled out, and the
    tally adds up (pass + fail = runnable, failed bounds named)."""
    member = next(catalog_family.family(1, seed=0))
    eight = dataclasses.replace(member, catalog=_catalog(slots=8, R=32, mode="ordinary"))
    rows = checks.startup_checks(eight.catalog, PolicyConfig())
    counts = checks.tally(rows)
    assert counts["runnable"] + counts["not achievable"] + counts["n/a"] == 12
    assert counts["not achievable"] == 2 and counts["n/a"] == 8  # 16 > 8 slots; no drafts when ordinary
    for r in rows:
        if r.verdict in ("pass", "fail"):
            assert set(r.details) >= {"first_output_ms", "largest_gap_ms", "spread_tokens", "failed"}
            assert (r.verdict == "fail") == bool(r.details["failed"])
