"""Plan reuse (``reuse.py``): a reused plan equals a fresh one, and every change that plan()
reads drops the memo. Each test here fails when an invalidation is removed."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from helios_jax.catalog import DecodeMode
from helios_jax.scheduler import reuse
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.reads import SchedulerReads

from .helpers import SPEC
from .test_core import run_once, scheduler

MS = NS_PER_MS


def _decoding(n=3, max_output=400):
    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    handles = [s.admit([1] * (8 + 40 * i), max_output=max_output) for i in range(n)]
    t, fence = 0.0, 1
    while any(s.requests[h.rid].phase.value != "decode" for h in handles):
        _, _, t = run_once(s, fence, t)
        fence += 1
    s.advance_to(int(t * MS))
    return s, handles, t, fence


def _fresh(s):
    return s._plan()


def test_a_repeated_call_returns_the_same_plan():
    s, _, _, _ = _decoding()
    p = s.plan()
    again = s.plan()
    # Proof mode (HELIOS_PLAN_REUSE_CHECK=1) returns the fresh plan it compared the memo with.
    assert p is not None and (again is p or (reuse.CHECK and again == p)) and p == _fresh(s)


def _changes(s, handles, t, fence):
    """(name, change) pairs, each through one mutator; every one changes the next plan."""
    h0, h1 = handles[0], handles[1]
    return [
        ("restrict_width", lambda: s.restrict_width(h0, 1)),
        ("restrict_width lifted", lambda: s.restrict_width(h0, None)),
        ("cancel", lambda: s.cancel(h1)),
        ("finish", lambda: s.finish(h0)),
        ("admit", lambda: s.admit([1] * 30, max_output=8)),
        ("advance_to", lambda: s.advance_to(s.now_ns + 40 * MS)),
    ]


def test_every_mutator_drops_the_memo():
    """After each change plan() equals a fresh computation (and, for the test to bite, differs
    from the plan before the change wherever the change moves the decision)."""
    s, handles, t, fence = _decoding()
    moved = 0
    for name, change in _changes(s, handles, t, fence):
        before = s.plan()
        change()
        after = s.plan()
        assert after == _fresh(s), name
        moved += after != before
    assert moved >= 4  # the changes really move decisions: a stale memo would show


def test_commit_complete_and_publication_drop_the_memo():
    s, _, t, fence = _decoding()
    for i in range(4):
        before = s.plan()
        _, _, t = run_once(s, fence + i, t)
        assert s.plan() == _fresh(s)
        assert s.plan() != before


def test_a_change_through_a_collaborator_misses_the_memo():
    """costs.observe and the ledgers are reached without a Scheduler method: the key sees them."""
    s, _, _, _ = _decoding()
    before = s.plan()
    s.costs.observe(before.graph.key, (int(500 * MS),), s.now_ns)
    after = s.plan()
    assert after == _fresh(s) and after != before
    s.acceptance_ledger.balance_ms = s.acceptance_ledger.cap_ms
    assert s.plan() == _fresh(s)


def test_check_mode_raises_on_a_stale_reuse(monkeypatch):
    """Proof mode computes the fresh plan beside every reuse: a missed invalidation raises."""
    s, handles, _, _ = _decoding()
    monkeypatch.setattr(reuse, "CHECK", True)
    s.plan()
    assert s.plan() == _fresh(s)  # a true reuse passes the check
    s.requests[handles[1].rid].cancelled = True  # behind the scheduler's back: not invalidated
    with pytest.raises(reuse.StalePlan):
        s.plan()


def test_every_public_state_changing_method_is_a_listed_mutator():
    """A new public method of the Scheduler is either a read (pure) or listed in MUTATORS."""
    reads = {"plan", "views", "can_admit", "pages_needed", "preemption_candidate"}
    reads |= {n for n, _ in inspect.getmembers(SchedulerReads) if not n.startswith("_")}
    # Names with "ǁ" are the trampolines `make mutation` adds (xǁSchedulerǁadmit__mutmut_1).
    public = {n for n, _ in inspect.getmembers(Scheduler, callable) if not n.startswith("_") and "ǁ" not in n}
    completions = {n for n in public if n.startswith("complete")}
    assert public - reads - completions <= set(reuse.MUTATORS)
    for n in completions:
        assert "self._complete(" in inspect.getsource(getattr(Scheduler, n))


def test_install_makes_every_mutator_drop_the_memo_before_and_after():
    """`install` wraps each of MUTATORS: the method runs with no memo, its result and arguments
    pass through, and no memo survives it, not even one made during the call or left by a raise."""
    seen = {}

    def mutator(name):
        def method(self, *args, **kwargs):
            seen[name] = (self._plan_memo, args, kwargs)
            self._plan_memo = ("key", "plan made during the call")
            if kwargs.get("fail"):
                raise RuntimeError(name)
            return name

        method.__name__ = name
        return method

    cls = type("Mutable", (), {name: mutator(name) for name in reuse.MUTATORS})
    assert reuse.install(cls) is cls and cls._plan_memo is None
    obj = cls()
    assert obj._plan_memo is None  # a new instance starts without a memo
    for name in reuse.MUTATORS:
        obj._plan_memo = ("key", "plan")
        assert getattr(obj, name)(1, k=2) == name and getattr(cls, name).__name__ == name
        assert seen[name] == (None, (1,), {"k": 2}) and obj._plan_memo is None
        obj._plan_memo = ("key", "plan")
        with pytest.raises(RuntimeError, match=name):
            getattr(obj, name)(fail=True)
        assert obj._plan_memo is None


class _NaNPlan:
    """A plan-like value holding a NaN: unequal to its own recomputation (NaN != NaN) while
    describing the same decision, which its repr shows."""

    def __init__(self):
        self.duration = float("nan")

    def __eq__(self, other):
        return isinstance(other, _NaNPlan) and self.duration == other.duration

    def __repr__(self):
        return f"_NaNPlan({self.duration})"


def _bare_scheduler():
    ledger = SimpleNamespace(balance_ms=0.0, episode_active=False)
    return SimpleNamespace(
        _plan_memo=None,
        now_ns=0,
        costs=SimpleNamespace(version=0),
        requests={},
        frames=[],
        timing_ledger=ledger,
        acceptance_ledger=ledger,
        population=SimpleNamespace(acceptance_pools={}),
        policy=None,
    )


def test_check_mode_accepts_a_recomputation_that_differs_only_by_nan(monkeypatch):
    """Proof mode calls a reuse stale only when the fresh plan differs from the memo: a NaN field
    is unequal to itself, so the two are also compared by repr (and a real difference raises)."""
    monkeypatch.setattr(reuse, "CHECK", True)
    sched = _bare_scheduler()
    first = reuse.memoized(sched, _NaNPlan)
    again = reuse.memoized(sched, _NaNPlan)
    assert first != again and repr(first) == repr(again) and sched._plan_memo[1] is again
    with pytest.raises(reuse.StalePlan):
        reuse.memoized(sched, lambda: "another plan")
