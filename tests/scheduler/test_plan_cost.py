"""Cheap decisions (issue 14): every cache and shortcut of the planning path equals the plain
computation it replaces, and each test fails when its invalidation or key is dropped."""

from __future__ import annotations

import math

import pytest

from helios_jax.catalog import DecodeMode, GraphKind
from helios_jax.scheduler import service
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.service import ServiceHistory

from .helpers import ORDINARY, SPEC, measured


def _uncached_share(norm: service.Normalizers, k: int) -> float:
    return service.Normalizers(norm.generation).share_log_rate(k)


def test_cached_shares_equal_a_fresh_computation_for_every_stream_count():
    norm = service.Normalizers.measure(SPEC.eligible(DecodeMode.ADAPTIVE), measured(SPEC))
    for k in (4, 1, 16, 4, 64, 1, 2, 16, 3):
        assert norm.share_log_rate(k) == _uncached_share(norm, k)
    assert len({norm.share_log_rate(k) for k in (1, 4, 16)}) == 3
    cold = service.Normalizers(())
    assert cold.share_log_rate(4) == math.log(service.COLD_RATE / 4)
    assert cold.share_log_rate(2) == math.log(service.COLD_RATE / 2)


def test_normalizers_follow_the_cost_version():
    """The scheduler keeps one Normalizers per cost version: a new estimate must show."""
    s = Scheduler(SPEC)
    s.seed_costs(0)
    before = s._normalizers()
    assert s._normalizers() is before
    g = next(g for g in s.graphs.delivery if g.kind.is_generation)
    s.costs.observe(g.key, (int(50 * service.NS_PER_MS),), 0)
    after = s._normalizers()
    assert after != before
    assert after == service.Normalizers.measure(s.graphs.delivery, s.costs)


def test_views_price_a_missing_history_like_missing_rate():
    """views() computes the shared missing-rate base once; each price equals missing_rate's."""
    s = Scheduler(SPEC)
    s.seed_costs(0)
    handles = [s.admit([1] * n, max_output=8) for n in (10, 300, 5000)]
    s.advance_to(7 * service.NS_PER_MS)
    views = {v.rid: v for v in s.views()}
    known = service.resident_rates(s.requests, {r.rid: r.history for r in s.requests.values()})
    for h in handles:
        req = s.requests[h.rid]
        assert req.history.log_x is None
        log_x = service.missing_rate(req, s.now_ns, s._normalizers(), known, s.policy)
        prices = service.log_prices(s.policy, log_x, None)
        assert views[h.rid].log_prefill_price == prices.prefill_token
        assert views[h.rid].log_output_price == prices.output_token


@pytest.mark.parametrize("k", [1, 5])
def test_missing_base_is_the_undecayed_missing_rate(k):
    norm = service.Normalizers(((4, 3.0), (16, 5.0)))
    known = [None, -2.0, -0.5][:k]
    assert service.missing_base(norm, len(known), known) == service.missing_log_token_rate(
        norm, len(known), known, 0.0, 100.0
    )


def test_with_survival_equals_dataclasses_replace():
    import dataclasses

    import numpy as np

    from helios_jax.scheduler.view import Phase, RequestView

    v = RequestView(rid=3, slot=1, phase=Phase.DECODE, survival=np.ones(2), optimistic=np.zeros(2))
    got, want = v.with_survival(v.optimistic), dataclasses.replace(v, survival=v.optimistic)
    assert type(got) is RequestView and got is not v
    for f in dataclasses.fields(RequestView):
        assert getattr(got, f.name) is getattr(want, f.name), f.name
    assert v.survival.tolist() == [1.0, 1.0]  # the original is unchanged


def test_monotone_equals_the_clipped_running_minimum():
    import numpy as np

    from helios_jax.scheduler.speculation import monotone

    x = np.array([[1.5, -0.0, 0.7, np.nan, 0.2], [0.3, 0.9, -2.0, 0.1, np.inf]])
    want = np.minimum.accumulate(np.clip(x, 0.0, 1.0), axis=-1)
    np.testing.assert_array_equal(monotone(x), want)
    assert np.signbit(monotone(x)).tolist() == np.signbit(want).tolist()


def test_prepared_durations_and_sigmas_follow_the_cost_version():
    """PreparedGraphs keeps estimates and reference intervals per cost version: after a new
    observation both equal a fresh computation (a cache that ignored the version would not)."""
    from helios_jax.scheduler import utility
    from helios_jax.scheduler.cost import CostModel
    from helios_jax.scheduler.policy import PreparedGraphs

    prepared = PreparedGraphs(SPEC.eligible(DecodeMode.ADAPTIVE))
    costs = measured(SPEC)

    def check(c):
        assert prepared.durations(c) == {id(g): c.estimate_ms(g.key) for g in prepared.graphs}
        for family in ("delivery", "snapshots"):
            for k in (1, 3, 16):
                graphs = getattr(prepared, family)
                assert prepared.reference_interval(family, k, c) == utility.reference_interval(k, graphs, c)

    check(costs)
    g = prepared.delivery[0]
    before = prepared.reference_interval("delivery", 1, costs)
    for _ in range(3):  # the median moves to the new duration
        costs.observe(g.key, (int(0.01 * service.NS_PER_MS),), 0)
    check(costs)
    assert prepared.reference_interval("delivery", 1, costs) != before
    other = CostModel()
    other.version = costs.version
    check(other)  # another cost model, even at the same version, is read afresh
    check(costs)


def test_views_read_acceptance_estimates_like_each_estimate_would():
    """views() computes every decoder's survival and optimistic estimates per source at once
    (speculation.batch_estimates); each row equals the estimate's own means(pool) and
    optimistic(tokens, pool), bit for bit, and is read-only like them."""
    import numpy as np

    from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    own = PrefixEstimate(  # origin None; the catalog's depth, 7
        np.array([0.9, 0.7, 0.2, 0.2, 0.1, 0.1, 0.1]), np.array([5.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]), 0
    )
    s.admit([1] * 8, max_output=300, acceptance_history={SOURCE_LEARNED: own})
    s.admit([1] * 8, max_output=300, proposal_source="copy")
    for n in (8, 60, 200):
        s.admit([1] * n, max_output=300)
    t = 0.0
    for fence in range(1, 30):
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
        views = {v.rid: v for v in s.views()}
        for r in s.requests.values():
            v = views.get(r.rid)
            if v is None or v.phase.value != "decode":
                continue
            est, pool = r.acceptance.get(r.proposal_source), s.population.acceptance_pools[r.proposal_source]
            np.testing.assert_array_equal(v.survival, est.means(pool), strict=True)
            np.testing.assert_array_equal(v.optimistic, est.optimistic(len(r.output), pool), strict=True)
            assert not v.survival.flags.writeable and not v.optimistic.flags.writeable


def test_a_catalog_without_proposals_computes_no_acceptance_estimates():
    """With no program of proposal depth > 0 (ordinary decode) views() leaves every decoder's
    survival and optimistic estimates empty (no decision reads them), and each decision equals
    the one made from views that carry them."""
    from unittest import mock

    from helios_jax.scheduler import pricing

    from .test_core import run_once, scheduler

    s = scheduler(ORDINARY)
    assert s.graphs.max_depth == 0
    for n in (8, 60, 200):
        s.admit([1] * n, max_output=300)
    real = pricing.views

    def with_estimates(inp, start_ns):
        import dataclasses

        return real(dataclasses.replace(inp, survival=True, optimistic=True), start_ns)

    t, decoders = 0.0, 0
    for fence in range(1, 20):
        views = s.views()
        decoding = [v for v in views if v.phase.value == "decode"]
        decoders += len(decoding)
        assert all(v.survival.size == 0 and v.optimistic.size == 0 for v in decoding)
        with mock.patch.object(pricing, "views", with_estimates):
            assert any(v.survival.size for v in s.views() if v.phase.value == "decode") or not decoding
            forced = s.plan()
        s._plan_memo = None  # plan afresh from the views without estimates
        assert s.plan() == forced
        _, _, t = run_once(s, fence, t, accepted=0)
    assert decoders


def test_request_view_make_equals_the_constructor():
    import dataclasses

    import numpy as np

    from helios_jax.catalog import GraphKind
    from helios_jax.scheduler.view import Phase, RequestView

    cases = [
        dict(rid=1, slot=0, phase=Phase.TERMINAL, terminal_age_ms=3.0),
        dict(rid=2, slot=5, phase=Phase.DECODE, runnable=False, survival=np.ones(2), width_limit=3),
        dict(rid=3, slot=1, phase=Phase.BLOCKED, prerequisites=(GraphKind.RESTORE,), enables=Phase.PREFILL),
        dict(rid=4, slot=2, phase=Phase.PREFILL, prompt_remaining=9, atomic_spans=((1, 4),), endpoint=7),
    ]
    for fields in cases:
        want = RequestView(**fields)
        for got in (RequestView.make(**fields), RequestView.unchecked(dict(fields))):
            assert type(got) is RequestView
            for f in dataclasses.fields(RequestView):
                a, b = getattr(got, f.name), getattr(want, f.name)
                if isinstance(b, np.ndarray):
                    np.testing.assert_array_equal(a, b, strict=True)
                else:
                    assert a == b and type(a) is type(b), f.name
        assert got.forecast is not RequestView.make(**fields).forecast  # a fresh default each
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.rid = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        RequestView.make(rid=1, slot=0, phase=Phase.DECODE, no_such_field=1)
    with pytest.raises(TypeError):
        RequestView.make(rid=1, phase=Phase.DECODE)


def test_views_subtract_each_requests_own_queued_advance():
    """views() sums the queued lanes' advances once per decision (pricing.queued_advances); each
    decoder's output and context left equal the per-request sum over the frames in flight."""
    from helios_jax.scheduler import pricing

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 8):
        s.admit([1] * n, max_output=300)
    t, fence, checked = 0.0, 0, 0
    for fence in range(1, 12):
        _, _, t = run_once(s, fence, t, accepted=fence % 3)
    while (plan := s.plan()) is not None and not plan.needs_empty_window and len(s.frames) < 3:
        fence += 1
        s.commit(plan, fence)
        advances = pricing.queued_advances(s.frames)
        for v in s.views():
            r = s.requests[v.rid]
            queued = pricing.queued_advance(r, s.frames)
            assert advances.get(r.handle, 0) == queued
            if v.phase.value == "decode":
                assert v.output_remaining == max(r.max_output - len(r.output) - queued, 0)
                assert v.context_remaining == s.max_model_len - (r.cursor + queued)
                checked += queued > 0
    assert checked


def _every_participants_projection(inp) -> tuple[dict, dict]:
    """projected_histories' token and delivery rates, computing every participant's missing rate
    (each history copied field by field), and the end of each request's last queued delivery."""
    from helios_jax.scheduler import pricing

    histories = {rid: ServiceHistory(r.history.log_x, r.history.log_z) for rid, r in inp.requests.items()}
    delivered_at = {}
    for f in inp.frames:
        if f.plan.expected_duration_ms is None:  # a frame of unknown length projects nothing
            continue
        for h in f.participants:
            if h.rid not in histories:  # released since dispatch
                continue
            hist, dt = histories[h.rid], f.plan.expected_duration_ms
            tokens, deliveries = f.expected_service.get(h.rid, (0.0, 0.0))
            known = service.resident_rates(inp.requests, histories)
            req = inp.requests[h.rid]
            prior = service.missing_rate(req, f.committed_ns, f.normalizers, known, inp.policy)
            service.update_token_history(hist, tokens, dt, inp.policy, prior)
            hist.log_z = service.delivery_update(hist.log_z, deliveries, dt, inp.policy)
            if deliveries:
                delivered_at[h.rid] = f.expected_end_ns
    assert pricing.projected_histories(inp)[0].keys() == histories.keys()
    return {rid: (h.log_x, h.log_z) for rid, h in histories.items()}, delivered_at


def _projection_checked(s) -> tuple[int, int]:
    """Checks the scheduler's projection against :func:`_every_participants_projection`; returns
    how many missing histories it starts and how many published delivery rates it projects."""
    from helios_jax.scheduler import pricing

    pools, norm = s.population.acceptance_pools, s._normalizers()
    inp = pricing.PricingInputs(s.requests, tuple(s.frames), s.policy, norm, pools, s.max_model_len)
    projected, delivered_at = pricing.projected_histories(inp)
    got = {rid: (h.log_x, h.log_z) for rid, h in projected.items()}
    assert (got, delivered_at) == _every_participants_projection(inp)
    started = sum(s.requests[rid].history.log_x is None and x is not None for rid, (x, _) in got.items())
    rated = sum(z is not None and z != s.requests[rid].history.log_z for rid, (_, z) in got.items())
    return started, rated


def test_projected_histories_read_missing_rates_only_where_they_start_a_history():
    """pricing.projected_histories computes a participant's missing rate only where a queued
    frame's expected service starts its missing history (a finishing prompt's first token:
    update_token_history's only read of it); the projection equals computing it for every
    participant, with one frame in flight (which starts histories) and with several. Bursts are
    published, so the projection also decays published delivery rates and records each queued
    delivery's expected end."""
    from .test_core import records, scheduler, timing

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 8):
        s.admit([1] * n, max_output=300)
    started, rated, now = 0, 0, 0
    for fence in range(1, 12):  # one frame at a time: the prompts finish, histories start
        plan = s.plan()
        s.commit(plan, fence)
        started += _projection_checked(s)[0]
        now += int((plan.expected_duration_ms or 1.0) * service.NS_PER_MS)
        s.advance_to(now)
        for burst in s.complete(fence, records(plan, 1), timing(plan.expected_duration_ms or 1.0)):
            s.published_output(burst.handle, fence)
    while (plan := s.plan()) is not None and not (plan.needs_empty_window and s.frames) and fence < 16:
        fence += 1
        s.commit(plan, fence)
        rated += _projection_checked(s)[1]
    assert started and rated and len(s.frames) >= 2


def test_a_projection_skips_frames_of_unknown_length_and_released_participants_only():
    """With two frames in flight, the first made of unknown length and the second frame's first
    participant released, projected_histories still projects every later frame and every later
    participant (against :func:`_every_participants_projection`)."""
    import dataclasses

    from helios_jax.scheduler import pricing

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 8):
        s.admit([1] * n, max_output=300)
    t = 0.0
    for fence in range(1, 12):
        t = run_once(s, fence, t, accepted=1)[2]
    while (plan := s.plan()) is not None and len(s.frames) < 2:
        fence += 1
        s.commit(plan, fence)
    first, *rest = s.frames
    assert len(rest) == 1 and len(rest[-1].participants) >= 2
    unknown = dataclasses.replace(first, plan=dataclasses.replace(first.plan, expected_duration_ms=None))
    released = rest[-1].participants[0].rid
    requests = {rid: r for rid, r in s.requests.items() if rid != released}
    pools, norm = s.population.acceptance_pools, s._normalizers()
    inp = pricing.PricingInputs(requests, (unknown, *rest), s.policy, norm, pools, s.max_model_len)
    projected, delivered_at = pricing.projected_histories(inp)
    want = _every_participants_projection(inp)
    assert ({rid: (h.log_x, h.log_z) for rid, h in projected.items()}, delivered_at) == want
    assert want[1] and all(rid != released for rid in want[1])


def test_a_probe_selection_sharing_the_ordinary_tables_equals_a_fresh_one():
    """learning.probe builds its selection with the ordinary one as `base` (shared decision,
    prompt table and survival-free decoder arrays); it equals a selection built from nothing,
    array for array and score for score, at every decision of a run."""
    import dataclasses

    import numpy as np

    from helios_jax.scheduler import policy

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 8, 900):
        s.admit([1] * n, max_output=300)
    t, shared = 0.0, 0
    for fence in range(1, 40):
        if fence % 7 == 0:
            s.admit([1] * 30, max_output=50)
        inp = policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        base = policy.Selection(inp)
        opt = [v if v.optimistic.size == 0 else v.with_survival(v.optimistic) for v in inp.views]
        prepared = policy.as_prepared(inp.graphs)
        opt_inp = dataclasses.replace(inp, views=opt, graphs=prepared.drafted(), reference=prepared)
        got, want = policy.Selection(opt_inp, base), policy.Selection(opt_inp)
        assert got.decision == want.decision
        own_scale = dataclasses.replace(opt_inp, reference=None)  # sigma from the drafted programs
        assert policy.Selection(own_scale, base).decision == policy.Selection(own_scale).decision
        for sel in (got, want):  # the arrays built on first read, compared as well
            assert sel.decoders.forecast is not None and sel.decoders.extension_value is not None
        for table in ("decoders", "prompts"):
            a, b = vars(getattr(got, table)), vars(getattr(want, table))
            for name, x in b.items():
                if isinstance(x, np.ndarray):
                    np.testing.assert_array_equal(a[name], x, strict=True, err_msg=name)
        shared += got.prompts is base.prompts and got.decoders.row_floor is base.decoders.row_floor
        scores = [(r.graph.name, r.score) for r in policy.scored(opt_inp, got)]
        assert scores == [(r.graph.name, r.score) for r in policy.scored(opt_inp, want)]
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
    assert shared > 10


def test_mixed_prompt_rows_shared_per_dominance_rule_equal_each_shapes_own():
    """MixedFamily keeps the undominated prompt rows and their pick per (capacity, largest
    same-work smaller capacity); every shape's prompt-row candidate equals the one a family
    computing only that shape finds, at every decision of a run with prompts and decoders."""
    from helios_jax.scheduler import policy
    from helios_jax.scheduler.policy.mixed import MixedFamily

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 8, 900, 3000):
        s.admit([1] * n, max_output=300)
    t, compared = 0.0, 0
    for fence in range(1, 30):
        if fence % 5 == 0:
            s.admit([1] * (40 * fence), max_output=50)
        sel = policy.Selection(
            policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        )
        shared = MixedFamily(sel)
        for g in sel.prepared.mixed:
            table = sel.decoders.table(g.token_capacity, g.proposal_depth)
            got, want = (
                shared._prompt_row_candidate(g, table),
                MixedFamily(sel)._prompt_row_candidate(g, table),
            )
            assert (got is None) == (want is None)
            if got is not None:
                assert (got.score, got.build().lanes) == (want.score, want.build().lanes)
                compared += 1
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
    assert compared > 100


def test_mixed_dominance_rules_kept_across_decisions_equal_each_decisions_own():
    """MixedFamily.rules keeps every shape's dominance rule on the prepared programs under the
    decoder count and lane widths. With a narrower mixed shape of the same depth (W = 4 beside
    W = 8, D = 7), one decoder near its output limit has the same widths on both and one far from
    it does not; at every population the kept rules equal the ones computed afresh."""
    import dataclasses

    from helios_jax.scheduler import policy
    from helios_jax.scheduler.policy.mixed import MixedFamily

    from .helpers import decoder, geometric, inputs, prompt

    wide = next(
        g for g in SPEC.graphs if g.kind is GraphKind.MIXED and (g.batch_capacity, g.token_capacity) == (2, 8)
    )
    narrow = dataclasses.replace(wide, token_capacity=4)
    prepared = policy.PreparedGraphs([*SPEC.eligible(DecodeMode.ADAPTIVE), narrow])
    seen = []
    for count, remaining in ((1, 3), (1, 100), (1, 3), (2, 3), (2, 100), (1, 100)):
        views = [decoder(i, survival=geometric(0.7), output_remaining=remaining) for i in range(count)]
        views.append(prompt(9, 700))
        sel = policy.Selection(dataclasses.replace(inputs(views), graphs=prepared))
        kept = MixedFamily(sel).rules()
        fresh = MixedFamily(sel)
        assert kept == {id(g): fresh._dominance_rule(g) for g in prepared.mixed}
        seen.append(kept)
    assert seen[0] != seen[1] and seen[2] == seen[0] and len(prepared.mixed_rules) == 4


def test_lane_tables_of_one_decoder_equal_the_sorted_running_sum():
    """DecoderTable.table skips the sort and running sum for a single lane; its order and prefix
    sums equal the general computation's, bit for bit and dtype for dtype."""
    import numpy as np

    from helios_jax.scheduler import policy

    from .test_core import run_once, scheduler

    for count in (1, 3):
        s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
        for _ in range(count):
            s.admit([1] * 8, max_output=300)
        t = 0.0
        for fence in range(1, 12):
            _, _, t = run_once(s, fence, t, accepted=fence % 4)
            sel = policy.Selection(
                policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
            )
            d = sel.decoders
            for width, depth in {(g.token_capacity, g.proposal_depth) for g in sel.prepared.generation}:
                table = d.table(width, depth)
                order = np.lexsort((d.slots, d.last_selected_ns, -table.values))
                np.testing.assert_array_equal(table.order, order, strict=True)
                prefix = np.concatenate([[0.0], np.cumsum(table.values[order])])
                np.testing.assert_array_equal(table.prefix_values, prefix, strict=True)


def _uncached_rows(inp):
    """selector.scored's rows computed afresh: every family, then the dominance filter."""
    from helios_jax.scheduler.policy import selector

    sel = selector.Selection(inp)
    families = (
        selector.generation_candidates,
        selector.prefill_candidates,
        selector.batch_prefill_candidates,
        selector.mixed_candidates,
        selector.terminal_candidates,
        selector.prerequisite_candidates,
    )
    return selector.prune_dominated([r for f in families for r in f(sel)], sel.prepared)


def test_rows_scored_once_per_decision_equal_a_fresh_scoring():
    """plan() scores a selection's rows once (policy.selection_rows) and hands them to select
    and the refresh alternative; at every decision of a run, with estimates going stale, they
    equal rows computed afresh, and the refresh alternative chosen from them is the one a
    fresh scoring gives. The rows are not kept on the selection (no reference cycle)."""
    from helios_jax.scheduler import learning, policy
    from helios_jax.scheduler.policy.prepared import is_unconstrained

    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200, 900):
        s.admit([1] * n, max_output=200)
    t, refreshed = 0.0, 0
    for fence in range(1, 30):
        if fence % 6 == 0:
            t += s.policy.estimate_ttl_ns / service.NS_PER_MS  # every estimate goes stale
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
        inp = policy.SelectionInput(s.views(), s.graphs, s.costs, s.now_ns, s.policy, s.mode)
        sel, kept = policy.selection_rows(inp)
        ordinary = policy.select(inp, rows=kept)
        if ordinary is None:
            continue
        assert ordinary == policy.select(inp)
        assert not any(kept is x for x in vars(sel).values())
        fresh = _uncached_rows(inp)
        # selection_rows leaves out fresh adaptive ragged and mixed rows below the best
        # (test_plan_cost_bounds)
        kept_keys = {(id(r.graph), r.score, r.signature) for r in kept}
        left = [r for r in fresh if (id(r.graph), r.score, r.signature) not in kept_keys]
        assert all(r.score < ordinary.score for r in left)
        assert all(r.graph.kind is GraphKind.MIXED or not is_unconstrained(r.graph) for r in left)
        assert not any(s.costs.is_stale(r.graph.key, s.now_ns) for r in left)
        fresh = [r for r in fresh if r not in left]
        assert [(r.graph, r.score, r.signature) for r in kept] == [
            (r.graph, r.score, r.signature) for r in fresh
        ]
        assert [r.build() for r in kept] == [r.build() for r in fresh]
        got = learning.refresh_alternative(inp, ordinary, s.graphs.graphs, sel, kept)
        assert got == learning.refresh_alternative(inp, ordinary, s.graphs.graphs)
        refreshed += got is not None
    assert refreshed
