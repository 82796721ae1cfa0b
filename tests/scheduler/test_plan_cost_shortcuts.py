"""Cheap decisions (issue 14), fourth round: each shortcut equals the plain computation it
replaces, and each test fails when the shortcut is dropped or widened."""

from __future__ import annotations

import numpy as np
import pytest

from helios_jax.scheduler import rounds, utility
from helios_jax.scheduler.rounds import prefix_allocation_order


def _random_case(rng: np.random.Generator, n: int, depth: int, distinct: bool):
    """Adaptive ragged inputs; `distinct`: lanes whose three orderings differ (else every lane's
    extension is proportional to its pending value, so the orderings coincide)."""
    base = rng.uniform(0.5, 2.0, n)
    if distinct:
        extension = rng.uniform(0.0, 3.0, (n, depth))
        ceilings = rng.integers(1, depth + 2, n)
    else:
        extension = base[:, None] * np.linspace(0.9, 0.3, depth)[None, :]
        ceilings = np.full(n, depth + 1)
    lanes, depths = prefix_allocation_order(extension, ceilings)
    return base, extension, ceilings, lanes, depths


def _plain(monkeypatch, args, batch, rows):
    """adaptive_ragged with every ordering evaluated (no repeated ordering skipped)."""
    with monkeypatch.context() as m:
        m.setattr(utility, "_repeats", lambda order, earlier: False)
        return utility.adaptive_ragged(*args, batch, rows)


@pytest.mark.parametrize("distinct", [False, True])
def test_adaptive_ragged_skipping_repeated_orderings_equals_every_ordering(monkeypatch, distinct):
    """A repeated ordering gives the same prefixes and totals, which only tie: skipping it
    changes no cohort, allocation or total (bit for bit)."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        n, depth = int(rng.integers(1, 12)), int(rng.integers(1, 5))
        args = _random_case(rng, n, depth, distinct)
        batch, rows = int(rng.integers(1, n + 2)), int(rng.integers(1, n * (depth + 1) + 2))
        got = utility.adaptive_ragged(*args, batch, rows)
        want = _plain(monkeypatch, args, batch, rows)
        assert got.total == want.total, trial
        assert got.cohort == want.cohort, trial
        assert got.rows.tolist() == want.rows.tolist(), trial


def _prefix_calls(monkeypatch, args, batch, rows) -> int:
    calls = []
    real = utility._ordering_prefixes
    with monkeypatch.context() as m:
        m.setattr(utility, "_ordering_prefixes", lambda *a: calls.append(1) or real(*a))
        utility.adaptive_ragged(*args, batch, rows)
    return len(calls)


def test_adaptive_ragged_evaluates_each_distinct_ordering_once(monkeypatch):
    """Coinciding orderings are evaluated once; three distinct ones three times."""
    rng = np.random.default_rng(3)
    assert _prefix_calls(monkeypatch, _random_case(rng, 8, 3, distinct=False), 4, 12) == 1
    # Lane 0 leads by full value, lane 1 by pending value, lane 2 by full value per row.
    base = np.array([1.0, 2.0, 0.5])
    extension = np.array([[3.0, 3.0], [0.0, 0.0], [2.5, 0.0]])
    ceilings = np.array([3, 1, 2])
    lanes, depths = prefix_allocation_order(extension, ceilings)
    assert _prefix_calls(monkeypatch, (base, extension, ceilings, lanes, depths), 1, 3) == 3


def test_cohort_rows_with_room_for_every_ceiling_equal_the_greedy(monkeypatch):
    """When the rows reach every lane's ceiling, the allocation is the ceilings (the greedy's
    end) without running the frontier; one row short, the frontier decides who waits."""
    prob = np.array([[0.9, 0.2, 0.1], [0.6, 0.5, 0.4], [0.3, 0.3, 0.3]])
    ceilings = np.array([4, 2, 3])
    calls = []
    real = rounds._greedy
    monkeypatch.setattr(rounds, "_greedy", lambda *a: calls.append(1) or real(*a))
    for capacity in (9, 10, 12):
        got = rounds.allocate_cohort_rows(prob, ceilings, capacity)
        assert got.dtype == np.int32
        assert got.tolist() == [4, 2, 3]
    assert calls == []
    assert rounds.allocate_cohort_rows(prob, ceilings, 8).tolist() == [3, 2, 3]
    assert rounds.allocate_cohort_rows(prob, ceilings, 7).tolist() == [2, 2, 3]
    assert len(calls) == 2
    with pytest.raises(ValueError, match="NaN"):
        rounds.allocate_cohort_rows(np.full_like(prob, np.nan), ceilings, 12)


def _decoding_scheduler():
    """An adaptive scheduler with learned and copy decoders, one without a prior (own evidence)."""
    from helios_jax.catalog import DecodeMode
    from helios_jax.scheduler.speculation import SOURCE_LEARNED, PrefixEstimate

    from .helpers import SPEC
    from .test_core import scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    own = PrefixEstimate(np.linspace(0.9, 0.2, 7), np.linspace(5.0, 1.0, 7), 0)  # origin None
    s.admit([1] * 8, max_output=300, acceptance_history={SOURCE_LEARNED: own})
    s.admit([1] * 8, max_output=300, proposal_source="copy")
    for n in (8, 60, 200, 9, 30):
        s.admit([1] * n, max_output=300)
    return s


def _same_value(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_views_without_optimistic_estimates_equal_the_full_views_but_for_them():
    """views(optimistic=False) leaves every decoder's optimistic estimate empty and every other
    field as views() has it (both the batched and the per-estimate path)."""
    from .test_core import run_once

    s, t, seen = _decoding_scheduler(), 0.0, 0
    for fence in range(1, 25):
        _, _, t = run_once(s, fence, t, accepted=fence % 4)
        full, lean = s.views(), s.views(optimistic=False)
        assert [v.rid for v in full] == [v.rid for v in lean]
        for a, b in zip(full, lean):
            assert b.optimistic.size == 0 and not b.optimistic.flags.writeable
            seen += a.optimistic.size > 0
            rest_a = {k: v for k, v in a.__dict__.items() if k != "optimistic"}
            rest_b = {k: v for k, v in b.__dict__.items() if k != "optimistic"}
            assert rest_a.keys() == rest_b.keys()
            assert all(_same_value(v, rest_b[k]) for k, v in rest_a.items()), a.rid
    assert seen > 0


def _single_decoder_scheduler():
    """An adaptive scheduler with one learned decoder: on its widest program most decisions,
    where no drafted row can widen its lane."""
    from helios_jax.catalog import DecodeMode

    from .helpers import SPEC
    from .test_core import scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    s.admit([1] * 8, max_output=300)
    return s


@pytest.mark.spec("acceptance-learning/probe-can-beat", "acceptance-learning/probe-deeper")
def test_plan_prices_optimistic_estimates_only_when_a_funded_probe_could_widen_a_lane(monkeypatch):
    """plan() prices the decoders' optimistic estimates (read only by an acceptance probe) only
    after the probe found that some drafted row could widen a lane (``learning._can_widen``), and
    each plan equals the one made from views priced with them up front (the eager form)."""
    from helios_jax.scheduler import learning, pricing
    from helios_jax.scheduler.core import Scheduler

    from .test_core import run_once

    events: list[object] = []
    real_acceptance, real_can_widen, real_views = pricing._acceptance, learning._can_widen, Scheduler.views
    real_explore = learning.explore

    def acceptance(inp, decoders):
        if inp.optimistic:
            events.append("priced")
        return real_acceptance(inp, decoders)

    def can_widen(*args):
        events.append(found := real_can_widen(*args))
        return found

    monkeypatch.setattr(pricing, "_acceptance", acceptance)
    monkeypatch.setattr(learning, "_can_widen", can_widen)

    def eager_plan(s):
        """The plan from views priced with every optimistic estimate when a probe is funded."""
        with monkeypatch.context() as m:
            m.setattr(
                Scheduler,
                "views",
                lambda self, start=None, optimistic=True: real_views(
                    self, start, self.acceptance_ledger.can_start()
                ),
            )
            m.setattr(learning, "explore", lambda *a, build_probe_views=None, **kw: real_explore(*a, **kw))
            s._plan_memo = None
            return s.plan()

    funded = {True: 0, False: 0}
    # Mixed acceptance; and one decoder accepting every proposal, whose ordinary lane soon is the
    # widest drafted one (a probe cannot widen it).
    for s, accepted in ((_decoding_scheduler(), lambda f: f % 4), (_single_decoder_scheduler(), lambda f: 7)):
        t = 0.0
        for fence in range(1, 40):
            if fence % 5 == 0:
                s.acceptance_ledger.earn(495.0)  # a full ledger (test_core: the probe's own test)
            s.advance_to(int(t * 1e6))
            expected = eager_plan(s)
            events.clear()
            s._plan_memo = None
            got = s.plan()
            assert got == expected, (fence, got.graph.name, got.reason, expected.graph.name, expected.reason)
            # Optimistic estimates are priced only right after a probe found it could widen.
            for k, event in enumerate(events):
                if event == "priced":
                    assert k > 0 and events[k - 1] is True, events
            if s.acceptance_ledger.can_start():
                widen = [e for e in events if isinstance(e, bool)]
                assert widen, "a funded decision asks whether a probe could widen"
                funded[widen[0]] += 1
                assert ("priced" in events) == widen[0]
            else:
                assert "priced" not in events
            _, _, t = run_once(s, fence, t, accepted=accepted(fence))
    assert funded[True] and funded[False], funded  # both kinds of funded decision were made


def _plain_best_prompt(sel, g):
    """One prefill program's pick as the selector made it before (one capacity at a time)."""
    from helios_jax.catalog import GraphKind

    prompts = sel.prompts
    work = prompts.work(g.token_capacity)
    allowed = (prompts.needs_scores == (g.kind is GraphKind.SCORED_PREFILL)) & (work > 0)
    smaller = sel.prepared.largest_smaller_chunk.get(id(g))
    if smaller is not None:
        allowed &= prompts.work(smaller) != work
    if not sel.costs.is_known(g.key):
        smaller_capacities = [h.token_capacity for h in sel.prepared.smaller_prefill[g]]
        allowed &= ~prompts.excluded_from_exploration(smaller_capacities, work)
    return prompts.pick(allowed, g.token_capacity)


def _prompt_views(rng: np.random.Generator):
    """Prompts of random length, stops, spans, endpoints, scores and recency; some exact ties."""
    from .helpers import prompt

    out = []
    for rid in range(int(rng.integers(1, 14))):
        tokens = int(rng.choice([1, 40, 64, 100, 128, 300, 700, 5000]))
        kw = {"last_selected_ns": int(rng.choice([-1, 5, 9]))}
        if rng.random() < 0.3:
            kw["prompt_limit"] = int(rng.integers(0, tokens + 1))  # 0: a stop at the cursor
        if rng.random() < 0.2 and tokens > 80:
            kw["atomic_spans"] = ((int(rng.choice([0, 50])), 80),)  # from 0: no work below 80
        if rng.random() < 0.3:
            kw["endpoint"] = int(rng.integers(1, tokens + 1))
        kw["needs_scores"] = bool(rng.random() < 0.25)
        out.append(prompt(rid, tokens, x=float(rng.choice([1.0, 2.0])), **kw))
    return out


def test_prefill_picks_of_every_program_at_once_equal_each_programs_own():
    """prefill_candidates scores every prefill program from [programs, prompts] matrices; each
    pick, value and score equals the per-program computation, ties, spans, limits, scored
    prompts and unmeasured capacities (exploration exclusion) included."""
    from helios_jax.scheduler import policy
    from helios_jax.scheduler.cost import CostModel
    from helios_jax.scheduler.policy.prefill import prefill_candidates

    from .helpers import POLICY, SPEC, inputs, measured

    rng = np.random.default_rng(11)
    prefill = [g for g in SPEC.graphs if g.kind.is_prefill and g.batch_capacity == 1]
    measured_costs = measured(SPEC)
    for trial in range(40):
        costs = measured_costs
        if trial % 3 == 0:  # some capacities unmeasured: exploration exclusion applies
            unmeasured = {g.key for g in prefill[int(rng.integers(0, 4)) :: 3]}
            costs = CostModel(POLICY.estimate_ttl_ns)
            for g in SPEC.graphs:
                if g.duration_ms is not None and g.key not in unmeasured:
                    costs.observe(g.key, [g.duration_ms * 1e6], 0)
        sel = policy.Selection(inputs(_prompt_views(rng), costs=costs))
        fresh = policy.Selection(sel.inp)  # its per-capacity work and values, one at a time
        plain = [(g, _plain_best_prompt(fresh, g)) for g in sel.prepared.prefill]
        want = [(g.key, i) for g, i in plain if g.batch_capacity == 1 and i is not None]
        got = prefill_candidates(sel)
        assert [(r.graph.key, r.build().lanes[0].rid) for r in got] == [
            (k, int(sel.prompts.rids[i])) for k, i in want
        ], trial
        for r, (g, i) in zip(got, [(g, i) for g, i in plain if g.batch_capacity == 1 and i is not None]):
            assert r.build().lanes[0].value == float(sel.prompts.values(g.token_capacity)[i])


def test_prompt_rows_picked_at_once_equal_one_capacity_at_a_time():
    """PromptTable.pick_rows equals pick row by row on a table in any order: values within the
    tie tolerance tie (then the less recent use, the larger work, the lower rid), just beyond
    it they do not, and a row with no allowed prompt picks none."""
    from helios_jax.scheduler import policy
    from helios_jax.scheduler.policy.tables import PromptTable

    from .helpers import inputs, prompt

    rng = np.random.default_rng(5)
    for trial in range(30):
        n = int(rng.integers(2, 9))
        views = [
            prompt(
                int(rid),
                int(rng.choice([64, 100, 300])),
                log_x=float(rng.choice([0.0, 1e-10, 3e-9])),  # values equal, within or beyond REL_TIE
                last_selected_ns=int(rng.choice([-1, 5, 9])),
                prompt_limit=int(rng.choice([0, 64, 500])),
            )
            for rid in rng.permutation(20)[:n]
        ]
        table = PromptTable(views, policy.Selection(inputs(views)).decision)  # in the given order
        caps = [64, 128, 512]
        if trial % 2:  # equal values at capacity 512 from different work: the work order decides
            at_512 = np.minimum(np.minimum(table.prompt_remaining, table.prompt_limit), 512)
            table.prefill_price = 600.0 / np.maximum(at_512, 1)
            table.output_price = np.zeros(n)
        work, values = table.rows_at(caps)
        allowed = (rng.random((3, n)) < 0.7) & (work > 0)
        got = table.pick_rows(allowed, values, work)
        assert got == [table.pick(allowed[j], c) for j, c in enumerate(caps)], trial


def test_a_prompt_table_without_prompts_shares_empty_arrays_of_the_built_kinds():
    """No prompts: the table's arrays are shared, read-only and of the dtypes and shapes the
    constructor builds (those of a one-prompt table with its row removed); its work and values
    are empty at every capacity."""
    from helios_jax.scheduler import policy
    from helios_jax.scheduler.policy.tables import PromptTable

    from .helpers import inputs, prompt

    views = [prompt(3, 100, endpoint=40, atomic_spans=((10, 20),))]
    decision = policy.Selection(inputs(views)).decision
    one, empty, again = PromptTable(views, decision), PromptTable([], decision), PromptTable([], decision)
    for name in ("rids", "last_selected_ns", "prefill_price", "output_price", "prompt_remaining"):
        assert getattr(empty, name) is getattr(again, name), name
    for name in ("prompt_limit", "needs_scores", "endpoint") + ("rids", "prefill_price", "output_price"):
        built, shared = getattr(one, name)[:0], getattr(empty, name)
        assert (shared.dtype, shared.shape) == (built.dtype, built.shape), name
        assert not shared.flags.writeable, name
    assert empty.count == 0 and list(empty.span_rows) == [] and one.span_rows == [0]
    assert empty.work(64).shape == (0,) and empty.values(64).shape == (0,)
    assert empty.pick(np.zeros(0, dtype=bool), 64) is None


def test_lane_widths_take_the_floor_of_one_once_per_table():
    """DecoderTable.lane_widths: each lane's rows are its row limit (output and context left,
    copy and width limits) within the program's width and its proposals plus one, and at least
    one: a limit of zero or less still gets the pending token's row."""
    from helios_jax.scheduler import utility
    from helios_jax.scheduler.config import PolicyConfig
    from helios_jax.scheduler.policy.tables import DecoderTable

    from .helpers import decoder

    limits = [1, 3, 10, 0, 5, -2]
    views = [decoder(i, output_remaining=n, survival=(0.9,) * 7) for i, n in enumerate(limits)]
    decision = utility.Decision.build(views, PolicyConfig(), sigma_decode=1.0, sigma_terminal=1.0)
    table = DecoderTable(views, decision, max_width=8, depth=7)
    for width, depth in [(1, 0), (4, 3), (8, 3), (4, 7), (8, 7), (2, 5)]:
        cap = min(width, depth + 1)
        want = [max(min(n, cap), 1) for n in limits]
        got = table.lane_widths(width, depth)
        assert got.dtype == np.int64 and got.tolist() == want, (width, depth)
