"""The decoders' views as per-slot columns (``view_columns``): the columns hold what each
decoder's state gives, read as views they are those views, and a selection from the columns is
the selection from the same views as objects, decision by decision."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode
from helios_jax.scheduler import learning, policy, pricing
from helios_jax.scheduler.policy import ranking
from helios_jax.scheduler.speculation import SOURCE_COPY
from helios_jax.scheduler.view import Phase, RequestView
from helios_jax.scheduler.view_columns import NO_LIMIT, DecoderColumns, ResidentViews

from .helpers import ORDINARY, SPEC
from .test_core import run_once, scheduler


def _population(catalog=SPEC, mode=DecodeMode.ADAPTIVE):
    """A scheduler with decoders of every kind a view distinguishes: a host mask, a width
    limit, copy proposals (where the catalog drafts), long and short outputs, and prompts still
    arriving."""
    s = scheduler(catalog, mode=mode)
    s.admit([1] * 8, max_output=300, host_mask=True)
    s.admit([1] * 8, max_output=3)
    if s.graphs.max_depth:
        s.admit([1] * 40, max_output=300, proposal_source=SOURCE_COPY)
    for n in (8, 60, 200):
        s.admit([1] * n, max_output=200)
    return s


def _steps(s, decisions=24):
    """Run `decisions` frames, yielding between them (width limits and copies change)."""
    t = 0.0
    for fence in range(1, decisions + 1):
        yield fence
        for r in s.requests.values():
            if r.phase is Phase.DECODE and not r.inflight:
                if r.proposal_source == SOURCE_COPY:
                    s.offer_copy(r.handle, fence % 5)
                elif r.max_output == 200 and r.slot % 2:
                    s.restrict_width(r.handle, None if fence % 3 else 2)
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
        if fence == 9:
            s.admit([1] * 30, max_output=50)


def test_each_decoder_row_holds_what_its_request_state_gives():
    """Output left after the queued rounds (at least 0; runnable while any), context left, the
    width and copy limits (a copy limit only for a copy source), host mask, slot and last
    selection: read from the requests, not from the columns' own code."""
    s = _population()
    seen = set()
    for _ in _steps(s):
        views = s.views()
        assert isinstance(views, ResidentViews)
        c, by_rid = views.decoders, {v.rid: v for v in views}
        for i, rid in enumerate(c.rid.tolist()):
            r = s.requests[rid]
            queued = pricing.queued_advance(r, s.frames)
            left = r.max_output - len(r.output) - queued
            assert c.output_remaining[i] == max(left, 0) and c.runnable[i] == (left > 0)
            assert c.context_remaining[i] == s.max_model_len - (r.cursor + queued)
            assert c.width_cap[i] == (NO_LIMIT if r.width_limit is None else r.width_limit)
            copy = r.copy_limit if r.proposal_source == SOURCE_COPY else None
            assert c.copy_cap[i] == (NO_LIMIT if copy is None else copy)
            assert (c.slot[i], c.last_selected_ns[i], c.host_mask[i]) == (
                r.slot,
                r.last_selected_ns,
                r.host_mask,
            )
            assert c.age_ms[i] >= 0.0
            assert c.row_limit[i] == by_rid[rid].row_limit  # RequestView's own arithmetic
            assert (by_rid[rid].width_limit, by_rid[rid].copy_limit) == (r.width_limit, copy)
            seen.add((c.width_cap[i] != NO_LIMIT, c.copy_cap[i] != NO_LIMIT, bool(c.host_mask[i])))
        decoding = [v.rid for v in views if v.phase is Phase.DECODE]
        split = ResidentViews.of(list(views))  # a list of the same views, split again
        assert ResidentViews.of(views) is views
        assert decoding == c.rid.tolist() == split.decoders.rid.tolist()
        assert [v.rid for v in split] == [v.rid for v in views] and len(split.others) == len(views.others)
    assert {(True, False, False), (False, True, False), (False, False, True)} <= seen


def test_read_as_views_the_columns_give_back_the_views_they_came_from():
    """``of(views).views()`` is `views` field for field, with plain Python values, for decoders
    with and without width and copy limits (the None limits round-trip through NO_LIMIT)."""
    s = _population()
    for _ in _steps(s, 12):
        decoders = [v for v in s.views() if v.phase is Phase.DECODE]
        again = DecoderColumns.of(decoders).views()
        assert len(again) == len(decoders)
        for a, b in zip(decoders, again):
            fields = dataclasses.fields(RequestView)
            for f in fields:
                x, y = getattr(a, f.name), getattr(b, f.name)
                if isinstance(x, np.ndarray):
                    np.testing.assert_array_equal(x, y)
                else:
                    assert x == y and type(x) is type(y), f.name


def test_the_decision_scale_reads_the_largest_finite_price_and_zero():
    def columns(*prices):
        views = [
            RequestView.make(
                rid=i, slot=i, phase=Phase.DECODE, log_output_price=p, log_delivery_price=-np.inf
            )
            for i, p in enumerate(prices)
        ]
        return DecoderColumns.of(views)

    assert columns(1.5, 3.25, -2.0).max_finite_price() == 3.25
    assert columns(1.5, np.inf, np.nan).max_finite_price() == 1.5
    assert columns(-1.0, -3.0).max_finite_price() == 0.0
    assert columns(np.inf).max_finite_price() == 0.0
    unpriced = RequestView.make(
        rid=0,
        slot=0,
        phase=Phase.DECODE,
        log_prefill_price=np.inf,
        log_output_price=np.nan,
        log_delivery_price=-np.inf,
    )
    assert DecoderColumns.of([unpriced]).max_finite_price() == 0.0  # no finite price at all
    assert columns().max_finite_price() == 0.0


def test_runnable_rows_go_least_recently_selected_first_then_by_rid():
    views = [
        RequestView.make(rid=rid, slot=rid, phase=Phase.DECODE, last_selected_ns=last, runnable=ok)
        for rid, last, ok in [(5, 30, True), (2, 30, True), (9, -1, True), (1, 50, False), (4, 10, True)]
    ]
    ordered = DecoderColumns.of(views).tie_ordered_runnable()
    assert ordered.rid.tolist() == [9, 4, 2, 5]
    one = DecoderColumns.of(views[:1])
    assert one.tie_ordered_runnable().rid.tolist() == [5]
    assert DecoderColumns.of(views[3:4]).tie_ordered_runnable().count == 0


@pytest.mark.parametrize(
    "catalog, mode",
    [(SPEC, DecodeMode.ADAPTIVE), (SPEC, DecodeMode.FIXED), (ORDINARY, DecodeMode.ORDINARY)],
    ids=["adaptive", "fixed", "ordinary"],
)
def test_a_selection_from_the_columns_is_the_selection_from_the_views(catalog, mode):
    """Decision by decision, the selector given the scheduler's columns chooses (and scores,
    row for row) what it chooses given the same views as a list of objects, and so does an
    acceptance probe given each."""
    s = _population(catalog, mode)
    compared = 0
    for _ in _steps(s):
        views = s.views(optimistic=False)
        listed = list(views)
        a = policy.SelectionInput(views, s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        b = dataclasses.replace(a, views=listed)
        rows_a, rows_b = policy.selection_rows(a)[1], policy.selection_rows(b)[1]
        assert [(r.graph.name, r.score) for r in rows_a] == [(r.graph.name, r.score) for r in rows_b]
        assert policy.select(a, rows=rows_a) == policy.select(b, rows=rows_b)
        assert sorted(policy.candidates(a), key=repr) == sorted(policy.candidates(b), key=repr)
        probe_a, probe_b = s._probe_views(views), learning.probe_views(listed, _optimistic(s, listed))
        assert isinstance(probe_a, ResidentViews)
        _assert_same_views(list(probe_a), list(probe_b))
        pa = dataclasses.replace(a, views=probe_a)
        pb = dataclasses.replace(a, views=list(probe_b))
        assert policy.select(pa) == policy.select(pb)
        compared += 1
    assert compared == 24


def _assert_same_views(a, b):
    assert [v.rid for v in a] == [v.rid for v in b]
    for x, y in zip(a, b):
        for f in dataclasses.fields(RequestView):
            vx, vy = getattr(x, f.name), getattr(y, f.name)
            if isinstance(vx, np.ndarray):
                np.testing.assert_array_equal(vx, vy)
            else:
                assert vx == vy or (vx != vx and vy != vy), f.name


def test_a_probe_of_views_priced_with_optimistic_estimates_reads_their_own():
    """Without estimates given, a probe's views take each decoder's own optimistic estimate,
    from the columns as from a list of the same views."""
    s = _population()
    for _ in _steps(s, 10):
        views = s.views()  # optimistic estimates priced in
        _assert_same_views(list(learning.probe_views(views)), list(learning.probe_views(list(views))))
        for v in learning.probe_views(views):
            if v.phase is Phase.DECODE:
                np.testing.assert_array_equal(v.survival, v.optimistic)


def test_the_preferred_of_no_candidates_is_none_and_of_one_is_it():
    s = _population()
    views = s.views()
    assert ranking.best([], views) is None
    only = policy.candidates(policy.SelectionInput(views, s.graphs, s.costs, s.now_ns, s.policy, s.mode))[:1]
    assert only and ranking.best(only, views) is only[0]


def _optimistic(s, listed):
    decoders = [v.rid for v in listed if v.phase is Phase.DECODE]
    return pricing.optimistic_estimates(s._pricing_inputs(True), decoders)


def test_resident_views_read_as_a_sequence_in_the_residents_order():
    """Iteration, indexing and len give every resident once, decoders and others in the order
    of the request table; recency and output left cover every resident."""
    s = _population()
    both = 0  # decisions with decoders and other residents
    for _ in _steps(s, 14):
        views = s.views()
        rids = [v.rid for v in views]
        assert rids == [r.rid for r in s.requests.values() if r.active]
        assert len(views) == len(rids) and [views[i].rid for i in range(len(views))] == rids
        assert views.recency() == {v.rid: v.last_selected_ns for v in views}
        assert views.output_remaining() == {v.rid: v.output_remaining for v in views}
        assert views.any_runnable() == any(v.runnable for v in views)
        both += bool(views.decoders.count and views.others)
    assert both


def test_row_limits_bind_on_output_copy_and_width_alike():
    """Near the end of their output, with and without copy proposals and width limits: each
    row's limit is its view's ``row_limit`` (RequestView's own arithmetic), and each bound is
    the binding one somewhere. (Context left never binds alone: admission holds prompt plus
    output within the context, so output left is never above it.)"""
    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    copy_short = s.admit([1] * 8, max_output=3, proposal_source=SOURCE_COPY)  # output binds
    copy_narrow = s.admit([1] * 8, max_output=300, proposal_source=SOURCE_COPY)  # the width binds
    s.admit([1] * 8, max_output=300, proposal_source=SOURCE_COPY)  # the copy prefix binds
    s.admit([1] * 8, max_output=3)  # output binds, no copy
    narrow = s.admit([1] * 8, max_output=300)  # the width binds, no copy
    binding = set()
    for _ in _steps(s, 6):
        for h in (copy_short, copy_narrow):
            r = s.requests.get(h.rid)
            if r is not None and not r.inflight and r.phase is Phase.DECODE:
                s.offer_copy(h, 6)
        for h in (narrow, copy_narrow):
            if h.rid in s.requests:
                s.restrict_width(h, 2)
        views = s.views()
        c, by_rid = views.decoders, {v.rid: v for v in views}
        for i, rid in enumerate(c.rid.tolist()):
            v = by_rid[rid]
            assert c.row_limit[i] == v.row_limit
            bounds = {
                "output": v.output_remaining,
                "copy": np.inf if v.copy_limit is None else v.copy_limit + 1,
                "width": np.inf if v.width_limit is None else v.width_limit,
            }
            for k, x in bounds.items():
                if x == v.row_limit < min(y for j, y in bounds.items() if j != k):
                    binding.add((k, v.copy_limit is not None))
    assert {("output", True), ("output", False), ("copy", True), ("width", True), ("width", False)} <= binding
