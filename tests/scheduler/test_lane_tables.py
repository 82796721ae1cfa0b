"""Lane tables (policy/tables.py) against independent computations.

A decoder's lane value on a program of width W and depth D is its output price times the
expected committed tokens E(w) = 1 + sum_{d < w - 1} s_d ** alpha (monotone survival s, clipped
to [0, 1]) at its target rows w = max(min(row limit, W, D + 1), 1), plus its delivery price and
c * sigma * A (the age term at T = 0); equal values rank the less recently used request first,
then the lower slot. A prompt's chunk of capacity C consumes what `RequestView.prompt_work`
allows and is worth its prefill price per token, plus the output price when it ends the prompt.
Each check here recomputes those rules per view, in plain Python, and compares.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.policy import tables
from helios_jax.scheduler.policy.tables import DecoderTable, PromptTable, computed_once, padded_prefixes
from helios_jax.scheduler.view import LaneRole

from .helpers import decoder, inputs, plain_monotone, prompt


def _decision(views, *, alpha: float = 1.0, sigma: float = 1.7) -> utility.Decision:
    config = dataclasses.replace(PolicyConfig(), adaptive_verification_alpha=alpha)
    return utility.Decision.build(views, config, sigma_decode=sigma, sigma_terminal=1.0)


def _naive_monotone(row, depth: int) -> list[float]:
    """The row's first `depth` entries, zero-padded, clipped to [0, 1] and made non-increasing."""
    vals = [float(x) for x in np.asarray(row, dtype=np.float64).reshape(-1)[:depth]]
    return plain_monotone(vals + [0.0] * (depth - len(vals)))


def _naive_value(view, decision: utility.Decision, rows: int, depth: int) -> tuple[float, float]:
    """(E(rows), value at T = 0) of one decoder's lane of `rows` target rows, from its view alone."""
    s = _naive_monotone(view.survival, depth)
    expected = 1.0 + sum(s[d] ** decision.alpha for d in range(min(rows - 1, depth)))
    scale = math.exp(-decision.log_scale)
    value = math.exp(view.log_output_price) * scale * expected + math.exp(view.log_delivery_price) * scale
    return expected, value + decision.decode_age * decision.sigma_decode * view.age_ms


def _naive_lane_value(view, decision: utility.Decision, width: int, depth: int) -> tuple[int, float]:
    """(target rows, lane value at T = 0) of one decoder on a program of this width and depth."""
    rows = max(min(view.row_limit, width, depth + 1), 1)
    return rows, _naive_value(view, decision, rows, depth)[1]


def _random_decoders(rng, n: int, depth: int):
    views = []
    for rid in rng.permutation(40)[:n]:
        length = int(rng.integers(0, depth + 3))  # shorter, equal or longer than the depth
        views.append(
            decoder(
                int(rid),
                x=float(rng.choice([1.0, 2.0, 5.0])),
                z=float(rng.choice([0.1, 0.25])),
                age_ms=float(rng.choice([0.0, 3.0, 40.0])),
                survival=tuple(rng.uniform(-0.2, 1.2, length)),  # outside [0, 1] and not monotone
                output_remaining=int(rng.choice([0, 1, 2, 5, 100])),
                copy_limit=None if rng.random() < 0.7 else int(rng.integers(0, 4)),
                last_selected_ns=int(rng.choice([-1, 5, 9])),
            )
        )
    return views


def test_lane_values_equal_the_formula_computed_per_view():
    """Every table's widths, values and prefix sums equal the lane-value rule computed view by
    view, at every program width and depth (each read from its own cached table)."""
    rng = np.random.default_rng(11)
    for trial in range(40):
        depth = int(rng.integers(0, 6))
        max_width = int(rng.integers(1, 9))
        views = _random_decoders(rng, int(rng.integers(1, 7)), depth)
        decision = _decision(views, alpha=float(rng.choice([1.0, 0.6, 2.0])))
        table = DecoderTable(views, decision, max_width, depth)
        for width in range(1, max_width + 1):
            for d in range(depth + 1):
                lt = table.table(width, d)
                want = [_naive_lane_value(v, decision, width, d) for v in views]
                assert lt.widths.tolist() == [w for w, _ in want], (trial, width, d)
                np.testing.assert_allclose(lt.values, [x for _, x in want], rtol=1e-12, atol=1e-15)
                sums = np.concatenate([[0.0], np.cumsum([want[i][1] for i in lt.order])])
                np.testing.assert_allclose(lt.prefix_values, sums, rtol=1e-12, atol=1e-15)
                assert lt.work_key == np.asarray([w for w, _ in want], dtype=np.int64).tobytes()


def test_decode_lanes_carry_the_lane_value_at_the_program_duration():
    """`lanes`: a DECODE lane per listed decoder, its expected tokens E(rows) and its value the
    lane value plus c * sigma * T; host allocation sets the query length (rows), device
    allocation the ceiling instead (rows then only predict it)."""
    rng = np.random.default_rng(13)
    for trial in range(20):
        views = _random_decoders(rng, int(rng.integers(1, 6)), 4)
        decision = _decision(views, alpha=float(rng.choice([1.0, 0.5])))
        table = DecoderTable(views, decision, 5, 4)
        rows = rng.integers(1, 6, len(views))
        ceilings = rng.integers(1, 9, len(views))
        idx = [int(i) for i in rng.permutation(len(views))[: int(rng.integers(1, len(views) + 1))]]
        until = float(rng.choice([0.0, 2.5]))
        for device in (False, True):
            lanes = table.lanes(idx, rows, until, ceilings=ceilings if device else None)
            assert [lane.rid for lane in lanes] == [views[i].rid for i in idx], trial
            for i, lane in zip(idx, lanes):
                expected, value = _naive_value(views[i], decision, int(rows[i]), 4)
                value += decision.decode_age * decision.sigma_decode * until
                assert lane.role is LaneRole.DECODE and lane.slot == views[i].slot and lane.prompt_tokens == 0
                assert (lane.query_length, lane.ceiling) == ((0, ceilings[i]) if device else (rows[i], 0))
                assert math.isclose(lane.expected_tokens, expected, rel_tol=1e-12), trial
                assert math.isclose(lane.value, value, rel_tol=1e-12, abs_tol=1e-15), trial


def test_a_decision_without_decoders_or_prompts_has_empty_tables():
    """No runnable decoder (a prompt-only decision, whose mixed programs still read the decode
    tables): every lane table is empty, of integer widths and order, with the empty sum. No
    prompt (a decode-only decision): no chunk at any capacity, no pick."""
    views = [prompt(1, 100)]
    table = DecoderTable([], _decision(views), max_width=4, depth=3)
    for width, depth in [(1, 0), (4, 3), (2, 3)]:
        lt = table.table(width, depth)
        assert lt.widths.dtype == np.int64 and lt.widths.size == 0 and lt.work_key == b""
        assert lt.values.size == 0 and lt.order.size == 0 and lt.prefix_values.tolist() == [0.0]
    assert table.lanes([], np.zeros(0, dtype=np.int64), 1.0) == []
    assert table.survival.shape == (0, 3) and table.forecast.shape == (0, 3)
    prompts = PromptTable([], _decision([decoder(1)]))  # a decode-only decision's
    assert prompts.count == 0 and prompts.work(64).size == 0 and prompts.pick(np.zeros(0, bool), 64) is None


def test_lane_order_is_value_then_less_recent_use_then_lower_slot():
    """The solvers' order: higher lane value first; equal values the less recently used request
    first, then the lower slot (never the rid or the view order); one lane is its own order."""
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(1, 8))
        slots = rng.permutation(16)[:n]
        views = [
            decoder(
                int(rid),
                slot=int(slots[k]),
                x=float(rng.choice([2.0, 3.0])),  # few distinct values: many exact ties
                age_ms=10.0,
                survival=(0.5, 0.25),
                output_remaining=int(rng.choice([1, 3])),
                last_selected_ns=int(rng.choice([-1, 4, 7])),
            )
            for k, rid in enumerate(rng.permutation(30)[:n])
        ]
        table = DecoderTable(views, _decision(views), max_width=4, depth=2)
        lt = table.table(4, 2)
        want = sorted(range(n), key=lambda i: (-lt.values[i], views[i].last_selected_ns, views[i].slot))
        assert [int(i) for i in lt.order] == want, trial
        assert lt.prefix_values.tolist() == [0.0, *np.cumsum(lt.values[want]).tolist()], trial


def _probe_views(views, rng):
    """The same requests with other survival estimates (an acceptance probe's views)."""
    return [v.with_survival(np.asarray(rng.uniform(0.0, 1.0, 4))) for v in views]


def _assert_same_table(probe: DecoderTable, fresh: DecoderTable, max_width: int, depth: int) -> None:
    for name in ("rids", "slots", "last_selected_ns", "output_price", "delivery_price", "row_floor"):
        assert getattr(probe, name).tolist() == getattr(fresh, name).tolist(), name
    assert probe.delivery_value.tolist() == fresh.delivery_value.tolist()
    assert probe.age_value_per_ms == fresh.age_value_per_ms
    np.testing.assert_array_equal(probe.survival, fresh.survival)
    np.testing.assert_array_equal(probe.expected_output, fresh.expected_output)
    np.testing.assert_array_equal(probe.forecast, fresh.forecast)
    np.testing.assert_array_equal(probe.extension_value, fresh.extension_value)
    for width in range(1, max_width + 1):
        for d in range(depth + 1):
            a, b = probe.table(width, d), fresh.table(width, d)
            assert a.widths.tolist() == b.widths.tolist() and a.order.tolist() == b.order.tolist()
            assert a.values.tolist() == b.values.tolist() and a.work_key == b.work_key


def test_a_table_built_on_a_base_equals_one_built_fresh():
    """An acceptance probe's table shares its base's survival-free parts (the same arrays) and
    reads its own survival; every array and lane table equals a table built from its views alone.
    A base of other requests, another order or another depth shares nothing."""
    rng = np.random.default_rng(8)
    for trial in range(20):
        views = _random_decoders(rng, int(rng.integers(2, 6)), 4)
        decision = _decision(views, alpha=float(rng.choice([1.0, 0.5])))
        base = DecoderTable(views, decision, 6, 4)
        if trial % 2:  # read first: the probe shares it (its views' forecasts are the base's)
            assert base.forecast.shape == (len(views), 4)
        probe_views = _probe_views(views, rng)
        probe = DecoderTable(probe_views, decision, 6, 4, base=base)
        assert probe.rids is base.rids and probe.delivery_value is base.delivery_value
        assert ("forecast" in probe.__dict__) == bool(trial % 2)
        if trial % 2:
            assert probe.forecast is base.forecast
        _assert_same_table(probe, DecoderTable(probe_views, decision, 6, 4), 6, 4)
        for other in (probe_views[::-1], probe_views[1:]):
            unshared = DecoderTable(other, decision, 6, 4, base=base)
            assert unshared.rids is not base.rids
            _assert_same_table(unshared, DecoderTable(other, decision, 6, 4), 6, 4)
        deeper = DecoderTable(probe_views, decision, 6, 5, base=base)
        assert deeper.rids is not base.rids
        _assert_same_table(deeper, DecoderTable(probe_views, decision, 6, 5), 6, 5)


def test_padded_prefixes_equal_each_row_clipped_padded_and_made_monotone():
    """padded_prefixes: each request's first `depth` estimates, zero-padded, in [0, 1] and
    non-increasing, whether the rows share one length (stacked at once) or not."""
    rng = np.random.default_rng(2)
    for trial in range(60):
        depth = int(rng.integers(0, 6))
        same = trial % 2 == 0
        rows = [
            rng.uniform(-0.3, 1.3, depth if same else int(rng.integers(0, depth + 3)))
            for _ in range(int(rng.integers(0, 5)))
        ]
        got = padded_prefixes(rows, depth)
        assert got.shape == (len(rows), depth) and got.dtype == np.float64, trial
        assert got.tolist() == [_naive_monotone(r, depth) for r in rows], trial
    assert padded_prefixes([np.zeros((2, 3))], 4).tolist() == [[0.0] * 4]  # rows flattened first


def _random_prompts(rng, n: int):
    views = []
    for rid in rng.permutation(30)[:n]:
        tokens = int(rng.choice([0, 1, 40, 64, 100, 300]))
        spans = () if rng.random() < 0.6 else ((int(rng.integers(0, 50)), int(rng.integers(50, 120))),)
        views.append(
            prompt(
                int(rid),
                tokens,
                log_x=float(rng.choice([0.0, 0.5, 1.0])),
                prompt_limit=None if rng.random() < 0.5 else int(rng.choice([0, 1, 30, 64, 200])),
                endpoint=None if rng.random() < 0.5 else int(rng.choice([10, 64, 500])),
                atomic_spans=spans,
                last_selected_ns=int(rng.choice([-1, 5, 9])),
                needs_scores=bool(rng.random() < 0.3),
            )
        )
    return views


def _naive_prompt_value(view, decision, capacity: int) -> tuple[int, float]:
    n = view.prompt_work(capacity)
    if n <= 0:
        return n, 0.0
    scale = math.exp(-decision.log_scale)
    value = math.exp(view.log_prefill_price) * scale * n
    if n == view.prompt_remaining:
        value += math.exp(view.log_output_price) * scale
    return n, value


def test_prompt_rows_at_equal_work_and_values_one_capacity_at_a_time():
    """rows_at's [capacity, prompt] matrices equal the chunk rule per view (prompt_work; prefill
    price per token, plus the output price when the chunk ends the prompt; nothing for no work)
    and what a fresh table's `work` and `values` give per capacity; it leaves those per-capacity
    entries equal as well, whichever was asked first."""
    rng = np.random.default_rng(17)
    caps = [16, 64, 128, 512]
    for trial in range(30):
        views = _random_prompts(rng, int(rng.integers(1, 7)))
        decision = policy.Selection(inputs(views)).decision
        table, fresh = PromptTable(views, decision), PromptTable(views, decision)
        if trial % 3 == 0:
            table.values(64)  # one capacity already kept: rows_at must agree with it
        work, values = table.rows_at(caps)
        assert work.shape == values.shape == (len(caps), len(views)), trial
        assert table.needs_scores.tolist() == [v.needs_scores for v in views], trial
        assert table.span_rows == [i for i, v in enumerate(views) if v.atomic_spans], trial
        for j, c in enumerate(caps):
            want = [_naive_prompt_value(v, decision, c) for v in views]
            assert work[j].tolist() == [n for n, _ in want], (trial, c)
            np.testing.assert_allclose(values[j], [x for _, x in want], rtol=1e-12, atol=0.0)
            assert fresh.work(c).tolist() == work[j].tolist() == table.work(c).tolist(), (trial, c)
            assert fresh.values(c).tolist() == values[j].tolist() == table.values(c).tolist(), (trial, c)


def _naive_pick(views, values, work, allowed) -> int | None:
    rows = [i for i in range(len(views)) if allowed[i]]
    if not rows:
        return None
    top = max(values[i] for i in rows)
    tied = [i for i in rows if values[i] >= top - utility.REL_TIE * max(1.0, abs(top))]
    return min(tied, key=lambda i: (views[i].last_selected_ns, -work[i], views[i].rid))


def test_prompt_picks_equal_the_best_value_then_less_recent_use_larger_work_lower_rid():
    """pick and pick_rows choose, among allowed prompts, the highest value; values within the
    tie tolerance tie, then the less recently used request, the larger chunk, the lower rid."""
    rng = np.random.default_rng(23)
    caps = [64, 128, 512]
    for trial in range(40):
        views = _random_prompts(rng, int(rng.integers(1, 8)))
        table = PromptTable(views, policy.Selection(inputs(views)).decision)
        if trial % 2:  # equal values from different work: the order after the value decides
            table.prefill_price = np.full(len(views), 1.0)
            table.output_price = 300.0 - table.prefill_price * np.minimum(table.prompt_remaining, 300)
        work, values = table.rows_at(caps)
        allowed = (rng.random(work.shape) < 0.7) & (work > 0)
        want = [_naive_pick(views, values[j], work[j], allowed[j]) for j in range(len(caps))]
        assert table.pick_rows(allowed, values, work) == want, trial
        assert [table.pick(allowed[j], c) for j, c in enumerate(caps)] == want, trial


def test_prompt_values_within_the_tie_tolerance_of_the_best_tie_inclusively():
    """Prompt values tie when within REL_TIE * max(1, |best|) of the best, the bound included
    (the less recently used then wins); just beyond it the better value wins. A best of 1 and
    of 4 (tolerances 1e-9 and 4e-9), in `pick` and `pick_rows` alike."""
    views = [prompt(1, 1, last_selected_ns=9), prompt(2, 1, last_selected_ns=-1)]
    allowed = np.ones((1, 2), dtype=bool)
    for best, gap, want in [(1.0, 1.0, 1), (4.0, 1.0, 1), (1.0, 1.5, 0), (4.0, 1.5, 0), (0.5, 1.0, 1)]:
        table = PromptTable(views, policy.Selection(inputs(views)).decision)
        other = best - gap * utility.REL_TIE * max(1.0, abs(best))
        table.prefill_price, table.output_price = np.array([best, other]), np.zeros(2)  # one token each
        work, values = table.rows_at([64])
        assert values.tolist() == [[best, other]]
        assert table.pick_rows(allowed, values, work) == [want] and table.pick(allowed[0], 64) == want


def test_prompt_lanes_carry_their_chunk_and_its_value():
    """`lane`: a PROMPT lane of the chunk a capacity allows (prompt_work), worth its priced
    tokens (and the output price when it ends the prompt), expecting one token exactly then."""
    rng = np.random.default_rng(31)
    for trial in range(20):
        views = _random_prompts(rng, int(rng.integers(1, 6)))
        decision = policy.Selection(inputs(views)).decision
        table = PromptTable(views, decision)
        for c in (1, 16, 64, 512):
            for i, v in enumerate(views):
                lane, (n, value) = table.lane(i, c), _naive_prompt_value(v, decision, c)
                assert (lane.rid, lane.slot, lane.role) == (v.rid, v.slot, LaneRole.PROMPT), trial
                assert (lane.prompt_tokens, lane.query_length, lane.ceiling) == (n, 0, 0), trial
                assert lane.expected_tokens == (1.0 if n == v.prompt_remaining else 0.0), trial
                assert math.isclose(lane.value, value, rel_tol=1e-12), trial


def test_excluded_from_exploration_equals_a_smaller_capacity_reaching_the_same_endpoint():
    """A prompt is left out of a capacity's exploration when some smaller prepared capacity
    consumes the same tokens up to its next endpoint (message end, prompt end or stop)."""
    rng = np.random.default_rng(29)
    caps = [16, 64, 128, 512]
    for trial in range(30):
        views = _random_prompts(rng, int(rng.integers(1, 7)))
        table = PromptTable(views, policy.Selection(inputs(views)).decision)
        for k, c in enumerate(caps):
            got = table.excluded_from_exploration(caps[:k], table.work(c)).tolist()
            want = []
            for v in views:
                end = min(v.prompt_remaining if v.endpoint is None else v.endpoint, v.prompt_remaining)
                end = min(end, v.prompt_remaining if v.prompt_limit is None else v.prompt_limit)
                mine = min(v.prompt_work(c), end)
                want.append(any(min(v.prompt_work(s), end) == mine for s in caps[:k]))
            assert got == want, (trial, c)


def test_computed_once_runs_its_function_once_per_instance_and_keeps_its_docstring():
    """computed_once (the lock-free cached_property of tables and populations): the first read
    computes the value and stores it under the attribute's own name, so later reads, and a
    probe table's check for a shared forecast, find it without a call; each instance computes
    its own; the class attribute is the descriptor, documented as the function."""
    calls = []

    class Owner:
        def __init__(self, k):
            self.k = k

        @computed_once
        def doubled(self):
            """Twice k."""
            calls.append(self.k)
            return [2 * self.k]

    a, b = Owner(1), Owner(5)
    first = a.doubled
    assert first == [2] and a.doubled is first and a.__dict__["doubled"] is first
    assert b.doubled == [10] and b.doubled == [10]
    assert calls == [1, 5]
    assert isinstance(Owner.__dict__["doubled"], computed_once) and Owner.doubled.__doc__ == "Twice k."
    assert DecoderTable.forecast.__doc__.startswith("f64[n, D]: the joint prefix probabilities")


def test_the_shared_empty_prompt_arrays_are_read_only():
    """A decode-only decision's prompt table shares module-level empty arrays: `_read_only`
    (which builds them) returns its array, no longer writeable, and every shared one is so."""
    a = np.arange(3)
    assert tables._read_only(a) is a and not a.flags.writeable
    for name, shared in tables._NO_PROMPTS.items():
        if isinstance(shared, np.ndarray):
            assert not shared.flags.writeable and shared.size == 0, name
