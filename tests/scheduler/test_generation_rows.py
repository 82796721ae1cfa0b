"""Cheap decisions (issue 14), ninth round: ``generation_candidates`` builds rows only for the
generation programs whose row the dominance filter could keep (``prepared.GenerationRows``),
read from the decoders' counts before any ranking. Each test fails when the shortcut leaves out
a row that survives the filter, or when it is dropped."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios_jax import catalog_family
from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler import policy
from helios_jax.scheduler.policy import generation, prepared
from helios_jax.scheduler.policy.ranking import prune_dominated

from .helpers import ORDINARY, RAGGED, SPEC, decoder, geometric, inputs

spec = pytest.mark.spec
FAMILY = list(catalog_family.family(4, 0))


def _narrower_rectangles(catalog):
    """The catalog plus, for each rectangular speculative program of width W > 2, a copy of width
    W / 2 at the same proposal depth (P = B x W / 2): programs of one depth and two lane tables."""
    extra = tuple(
        dataclasses.replace(
            g,
            token_capacity=g.token_capacity // 2,
            target_capacity=g.batch_capacity * (g.token_capacity // 2),
            duration_ms=g.duration_ms * 0.7,
        )
        for g in catalog.of_kind(GraphKind.SPECULATIVE)
        if g.is_rectangular and g.token_capacity > 2 and g.duration_ms is not None
    )
    return dataclasses.replace(catalog, graphs=catalog.graphs + extra)


CATALOGS = {
    "ordinary-k": (with_decode_steps(ORDINARY, (4, 8), 0.5), "ordinary"),
    "spec": (SPEC, "adaptive"),
    "ragged": (RAGGED, "adaptive"),
    "spec-fixed": (SPEC, "fixed"),
    "spec-widths": (_narrower_rectangles(SPEC), "adaptive"),
    **{
        f"family-{i}": (
            with_decode_steps(m.catalog, (4,), 0.6),
            "ordinary" if m.params["mode"] == "ordinary" else "adaptive",
        )
        for i, m in enumerate(FAMILY)
    },
}


def _decoders(rng: np.random.Generator) -> list:
    """1 to 20 decoders (often one or two) of random prices, ages, acceptance and limits, some
    with a grammar's host mask or a width limit."""
    n = int(rng.choice([1, 1, 2, 3, int(rng.integers(1, 21))]))
    views = []
    for rid in range(n):
        kw = {"last_selected_ns": int(rng.choice([-1, 3, 7]))}
        if rng.random() < 0.2:
            kw["width_limit"] = int(rng.integers(1, 6))
        if rng.random() < 0.15:
            kw["host_mask"] = True
        views.append(
            decoder(
                rid,
                x=float(rng.choice([0.5, 2.0, 8.0])),
                age_ms=float(rng.uniform(0.0, 60.0)),
                survival=geometric(float(rng.uniform(0.1, 0.95))),
                output_remaining=int(rng.choice([1, 2, 3, 5, 9, 1000])),
                **kw,
            )
        )
    return views


def _rows(inp, monkeypatch, every: bool) -> list[tuple]:
    """The generation rows after the dominance filter, built (`every`: for every program)."""
    with monkeypatch.context() as m:
        if every:
            m.setattr(prepared.GenerationRows, "live", lambda self, *_: (True,) * self.batch.size)
        sel = policy.Selection(inp)
        rows = prune_dominated(generation.generation_candidates(sel), sel.prepared)
    return [(r.graph.name, r.score, r.duration_ms, r.signature, r.build().lanes) for r in rows]


@spec("useful-service/dominance-prune", "useful-service/all-capacities-compete")
@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_generation_rows_left_out_are_only_dominated_ones(name, monkeypatch):
    """On hand-made and generated catalogs with K-step decode programs, in every mode: the rows
    that survive the dominance filter are the same, in the same order, whether every program
    builds its row or only the live ones; and the shortcut leaves some programs out."""
    catalog, mode = CATALOGS[name]
    rng, skipped = np.random.default_rng(sorted(CATALOGS).index(name)), 0
    for _ in range(40):
        inp = inputs(_decoders(rng), catalog=catalog, mode=mode)
        assert _rows(inp, monkeypatch, every=False) == _rows(inp, monkeypatch, every=True)
        sel = policy.Selection(inp)
        skipped += sel.prepared.generation_rows.live(sel.decoders.count, _extent(sel)).count(False)
    assert skipped > 0


def _extent(sel):
    return generation.KStepRanking(sel.decoders).extent


def _live_names(catalog, mode, views) -> set[str]:
    sel = policy.Selection(inputs(views, catalog=catalog, mode=mode))
    live = sel.prepared.generation_rows.live(sel.decoders.count, _extent(sel))
    return {g.name for (g, *_), alive in zip(sel.prepared.generation_routes, live) if alive}


def test_one_decoder_builds_one_row_per_step_count():
    """One decoder on decode programs of B = 1, 2, 4, ... and K = 1, 2, 4, 8: only the B = 1
    program of each K can keep its row (each larger B takes the same lane); with 3 tokens left,
    K = 8 would run 3 steps as K = 4 does and only the smaller K = 4 keeps it; with one left,
    K = 1 alone; a host-masked decoder is no K-step lane at all. With three decoders, B = 8 and
    more take the same three lanes as B = 4 would, so B = 1, 2 and 4 build theirs."""
    cat = with_decode_steps(ORDINARY, (2, 4, 8), 0.5)
    names = {(g.batch_capacity, g.steps): g.name for g in cat.of_kind(GraphKind.DECODE)}

    def _decode(b: int, steps: int = 1) -> str:
        return names[(b, steps)]

    assert sorted(b for b, k in names if k == 1)[:4] == [1, 2, 4, 8]
    one = {_decode(1, k) for k in (1, 2, 4, 8)}
    assert _live_names(cat, "ordinary", [decoder(0)]) == one
    assert _live_names(cat, "ordinary", [decoder(0, output_remaining=3)]) == one - {_decode(1, 8)}
    assert _live_names(cat, "ordinary", [decoder(0, output_remaining=1)]) == {_decode(1)}
    assert _live_names(cat, "ordinary", [decoder(0, host_mask=True)]) == {_decode(1)}
    three = [decoder(i) for i in range(3)]
    assert _live_names(cat, "ordinary", three) == {_decode(b, k) for b in (1, 2, 4) for k in (1, 2, 4, 8)}
    # A host-masked decoder beside two others: the K-step programs see two eligible lanes.
    masked = [decoder(0, host_mask=True), decoder(1), decoder(2)]
    assert _live_names(cat, "ordinary", masked) == {_decode(b) for b in (1, 2, 4)} | {
        _decode(b, k) for b in (1, 2) for k in (2, 4, 8)
    }


def test_the_cover_is_the_largest_same_route_dominator():
    """cohort_cover: the largest B among an unconstrained program's dominators of its route and
    lane table; a K-step or ragged program has none (0)."""
    cat = with_decode_steps(ORDINARY, (4,), 0.5)
    p = prepared.PreparedGraphs(cat.eligible(DecodeMode.ORDINARY))
    for g in p.generation:
        want = max(
            (h.batch_capacity for h in p.dominators[g] if h.steps == 1 and g.steps == 1),
            default=0,
        )
        assert prepared.cohort_cover(g, p.dominators[g]) == want
    spec_p = prepared.PreparedGraphs(_narrower_rectangles(SPEC).eligible(DecodeMode.ADAPTIVE))
    for g in spec_p.generation:
        route = prepared.generation_route(g)
        same = [
            h.batch_capacity
            for h in spec_p.dominators[g]
            if prepared.generation_route(h) is route
            and (h.token_capacity, h.proposal_depth) == (g.token_capacity, g.proposal_depth)
        ]
        expected = max(same, default=0) if route in (prepared.Route.WIDE, prepared.Route.DEVICE_WIDE) else 0
        assert prepared.cohort_cover(g, spec_p.dominators[g]) == expected


def test_kept_answers_equal_computed_ones(monkeypatch):
    """GenerationRows.live keeps each answer by (decoders, eligible, limit up to the largest K):
    over random counts and limits (many beyond K = 8) every kept answer equals the mask computed
    afresh, the memo stays within its bound, and a catalog without K-step programs never asks
    for the extent."""
    monkeypatch.setattr(prepared, "MEMO", 16)
    rows = prepared.PreparedGraphs(
        with_decode_steps(ORDINARY, (2, 7, 8), 0.5).eligible(DecodeMode.ORDINARY)
    ).generation_rows  # K = 7 and 8: a limit of 7 and one of 8 or more read differently
    rng, hits = np.random.default_rng(5), 0
    for _ in range(300):
        d = int(rng.integers(1, 12))
        e, longest = int(rng.integers(0, d + 1)), int(rng.integers(1, 40))
        hits += (d, e, min(longest, 8)) in rows._memo
        want = tuple(rows.mask(d, e, longest).tolist())
        assert rows.live(d, lambda e=e, longest=longest: (e, longest)) == want
        assert len(rows._memo) <= 16
    assert hits > 0 and rows.most_steps == 8

    def refuse():
        raise AssertionError("asked for the K-step extent")

    plain = prepared.PreparedGraphs(SPEC.eligible(DecodeMode.ADAPTIVE)).generation_rows
    for d in (1, 3, 1):
        assert plain.live(d, refuse) == tuple(plain.mask(d).tolist())
