"""What a Scheduler built with its defaults charges and holds, the errors that name what needed a
missing program, seeded estimates' observation time, and host stops (``finish``): the default
reason, no effect on a request that already ended, and no plan frozen before a stop committing
after it."""

import dataclasses
import math

import pytest

from helios_jax.catalog import Catalog, GraphKind
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.plan import PlanRejected
from helios_jax.scheduler.view import Phase

from .helpers import SPEC
from .test_core import records, timing

MS = NS_PER_MS
DEFAULT_PAGE = 16  # tokens per KV page when none is given (the engine's --page_size default)
DEFAULT_CONTEXT = 8192  # the pool's per-slot context when max_model_len is left unbounded


def without(catalog: Catalog, kind: GraphKind) -> Catalog:
    """`catalog` with no program of `kind`."""
    return dataclasses.replace(catalog, graphs=tuple(g for g in catalog.graphs if g.kind is not kind))


def ceil_pages(tokens: int, page: int = DEFAULT_PAGE) -> int:
    return max(1, -(-tokens // page))


# == resources of a default-constructed scheduler ===========================================
def test_default_kv_pool_holds_every_request_slot_at_the_default_context():
    """Without kv_pages the pool holds request_slots x the pages of one context: max_model_len
    when bounded, else 8192 tokens (1 << 20, the default, means unbounded), in 16-token pages."""
    slots = SPEC.request_slots
    assert Scheduler(SPEC).pages.size == slots * math.ceil(DEFAULT_CONTEXT / DEFAULT_PAGE) == slots * 512
    assert Scheduler(SPEC, max_model_len=1 << 20).pages.size == slots * 512
    assert Scheduler(SPEC, max_model_len=4096).pages.size == slots * 256
    assert Scheduler(SPEC, max_model_len=100).pages.size == slots * 7  # a partial last page
    assert Scheduler(SPEC, page_size=32).pages.size == slots * 256
    assert Scheduler(SPEC, kv_pages=40).pages.size == 40


def test_default_scheduler_charges_the_execution_ceiling_in_sixteen_token_pages():
    """Admission reserves the pages of prompt + output limit + draft storage (the catalog's
    deepest draft by default) in 16-token pages; the page table holds exactly that many."""
    s = Scheduler(SPEC)
    depth = max(g.proposal_depth or 0 for g in s.graphs.graphs)
    assert s.draft_storage == depth == 7
    for prompt_len, max_output in [(300, 13), (300, 14), (1, 1), (40, 200)]:
        expected = ceil_pages(prompt_len + max_output + depth)
        assert s.pages_needed(prompt_len, max_output) == expected
        h = s.admit([1] * prompt_len, max_output=max_output)
        assert len(s.page_table(h)) == expected
    assert s.pages_needed(300, 13) == 20  # 320 tokens: exactly 20 pages of 16 (19 of 17 would not hold them)


def test_a_given_draft_storage_is_what_admission_charges():
    """An explicit draft_storage replaces the catalog's depth in the charged ceiling."""
    for storage in (0, 23):
        s = Scheduler(SPEC, draft_storage=storage)
        assert s.draft_storage == storage
        assert s.pages_needed(300, 20) == ceil_pages(320 + storage)
        h = s.admit([1] * 300, max_output=20)
        assert len(s.page_table(h)) == ceil_pages(320 + storage)
    assert Scheduler(SPEC).pages_needed(300, 20) == ceil_pages(327)  # the default (depth 7) differs


# == a missing program is named by what needed it ===========================================
def test_initialize_requests_without_an_initialize_program_is_refused_naming_the_option():
    catalog = without(SPEC, GraphKind.INITIALIZE)
    with pytest.raises(ValueError, match=r"^initialize_requests needs an eligible initialize program"):
        Scheduler(catalog, initialize_requests=True)
    assert not Scheduler(catalog).initialize_requests  # the option off needs no such program
    assert Scheduler(SPEC, initialize_requests=True).initialize_requests


def test_a_request_for_prompt_scores_without_a_scored_prefill_program_is_refused():
    """Admission refuses it (naming the request) before reserving anything; without scores the
    same prompt is admitted."""
    s = Scheduler(without(SPEC, GraphKind.SCORED_PREFILL))
    pattern = r"^a request for prompt scores needs an eligible scored_prefill program"
    with pytest.raises(ValueError, match=pattern):
        s.admit([1, 2, 3], max_output=4, needs_scores=True)
    assert not s.requests and not s.owned_pages() and not s.owned_slots()
    s.admit([1, 2, 3], max_output=4)
    Scheduler(SPEC).admit([1, 2, 3], max_output=4, needs_scores=True)


# == publication and seeded estimates ======================================================
def test_publication_before_any_completion_is_refused_with_a_value_error():
    s = Scheduler(SPEC)
    h = s.admit([1, 2, 3], max_output=4)
    with pytest.raises(ValueError, match=r"must precede the next completion \(last completed: None\)"):
        s.published_output(h, 0)


def test_seed_costs_observes_every_measured_program_at_time_zero_by_default():
    """The default seeding time is the scheduler's starting clock (0): each measured program's
    last valid observation is at 0, so its estimate expires exactly one ttl later."""
    s = Scheduler(SPEC)
    assert s.seed_costs() == sum(1 for g in SPEC.graphs if g.duration_ms is not None)
    ttl = s.costs.ttl_ns
    keys = {g.key for g in SPEC.graphs if g.duration_ms is not None}
    assert keys
    for key in keys:
        assert s.costs.last_valid_ns(key) == 0
        assert s.costs.observation_age_ns(key, 0) == 0
        assert s.costs.is_fresh(key, ttl) and s.costs.is_stale(key, ttl + 1)


def test_seed_costs_with_samples_observes_each_sample_and_ignores_the_descriptors():
    """A start-up measurement's samples are observations, one per run: an entry's estimate is
    their median (an even count averages the middle pair), not the descriptor's duration nor the
    first sample; invalid samples (zero) are not observed; entries without a valid sample stay
    unknown; the count is of entries with one."""
    s = Scheduler(SPEC)
    g1, g2, g3 = SPEC.graphs[:3]
    samples = {g1.key: [4.0, 1.0, 2.0], g2.key: [3.0, 0.0, 5.0, 1.0], g3.key: [0.0]}
    assert s.seed_costs(7 * MS, samples) == 2
    assert s.costs.estimate_ns(g1.key) == 2.0 * MS
    assert s.costs.estimate_ns(g2.key) == 3.0 * MS  # median of 3, 5, 1
    assert s.costs.samples(g1.key) == (4.0 * MS, 1.0 * MS, 2.0 * MS)
    assert s.costs.estimate_ns(g3.key) == 0  # unknown: the first service use measures it
    assert s.costs.last_valid_ns(g1.key) == 7 * MS
    for g in SPEC.graphs[3:]:
        assert s.costs.estimate_ns(g.key) == 0  # no descriptor duration is read
    even = Scheduler(SPEC)
    even.seed_costs(0, {g1.key: [1.0, 2.0, 4.0, 8.0]})
    assert even.costs.estimate_ns(g1.key) == 3.0 * MS


def test_seed_costs_refuses_samples_of_a_program_outside_the_catalog():
    """A key the catalog does not hold is an error naming it, and nothing is observed."""
    s = Scheduler(without(SPEC, GraphKind.SNAPSHOT))
    outside = next(g for g in SPEC.graphs if g.kind is GraphKind.SNAPSHOT)
    inside = s.catalog.graphs[0]
    with pytest.raises(ValueError, match="outside the catalog") as err:
        s.seed_costs(0, {inside.key: [1.0], outside.key: [1.0]})
    assert str(outside.key) in str(err.value)
    assert s.costs.estimate_ns(inside.key) == 0 and s.costs.version == 0


# == host stops (finish) ===================================================================
def step(s, fence, t):
    """Plan, commit as `fence`, complete after the expected duration, publish: (plan, generated, t)."""
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, fence)
    t += plan.expected_duration_ms
    s.advance_to(int(t * MS))
    gen = s.complete(fence, records(plan), timing(plan.expected_duration_ms))
    for g in gen:
        if g.tokens:
            s.published_output(g.handle, fence)
    return plan, gen, t


def decoding(rounds: int = 30):
    """A checkpointing scheduler whose one request (64-token prompt, anchor captured at its end)
    has decoded long enough to fund a terminal capture: (scheduler, handle, plans, fence, t)."""
    s = Scheduler(SPEC, checkpoints=True)
    s.seed_costs(0)
    h = s.admit([3] * 64, max_output=40)
    plans, t = [], 0.0
    for fence in range(1, rounds + 1):
        plan, _, t = step(s, fence, t)
        plans.append(plan)
    assert s.requests[h.rid].phase is Phase.DECODE
    return s, h, plans, rounds, t


def drain(s, h, fence, t):
    """Run until `h` is released: (kind, finished, reason) of every completion event of `h`."""
    events = []
    while h.rid in s.requests:
        fence += 1
        plan, gen, t = step(s, fence, t)
        events += [(plan.kind, g.finished, g.finish_reason) for g in gen if g.handle == h]
    return events


def test_a_host_stop_without_a_reason_ends_the_response_with_reason_stop():
    s, h, _, fence, t = decoding()
    s.finish(h)
    req = s.requests[h.rid]
    assert req.finish_reason == "stop" and req.phase is Phase.TERMINAL
    assert drain(s, h, fence, t) == [(GraphKind.SNAPSHOT, True, "stop")]


def test_finish_changes_nothing_for_a_request_that_already_ended():
    """A request already ended (preempted into its terminal capture, or stopped by the host)
    keeps its reason, epoch and phase: a later host stop is a no-op, the plan frozen before it
    still commits, and the response completes with the first reason."""
    for first in ("preempt", "finish"):
        s, h, _, fence, t = decoding()
        if first == "preempt":
            s.preempt(h)
        else:
            s.finish(h, "length")
        reason = "preempted" if first == "preempt" else "length"
        req = s.requests[h.rid]
        before = (req.finish_reason, req.epoch, req.phase, req.active)
        assert before[0] == reason and before[2] is Phase.TERMINAL and before[3]
        s.advance_to(int(t * MS))
        terminal = s.plan()
        s.finish(h)
        s.finish(h, "stop")
        assert (req.finish_reason, req.epoch, req.phase, req.active) == before
        assert s.requests[h.rid] is req
        s.commit(terminal, fence + 1)  # frozen before the no-op stops: still current
        t += terminal.expected_duration_ms
        s.advance_to(int(t * MS))
        gen = s.complete(fence + 1, records(terminal), timing(terminal.expected_duration_ms))
        assert [(g.handle, g.finished, g.finish_reason) for g in gen] == [(h, True, reason)]
        assert h.rid not in s.requests


def test_no_plan_frozen_before_a_host_stop_commits_after_it():
    """A host stop moves the request to a new epoch: every plan frozen for it earlier (its
    prefill, its anchor snapshot, its decode rounds), whatever epoch it was frozen at, is
    rejected at commit, while the request stays active for its terminal capture."""
    s, h, plans, fence, t = decoding()
    epochs = {lane.epoch for p in plans for lane in p.lanes}
    assert epochs == {0, 1, 2}  # prefill, anchor snapshot, decode rounds
    s.finish(h)
    assert s.requests[h.rid].active and s.requests[h.rid].phase is Phase.TERMINAL
    for plan in plans:
        with pytest.raises(PlanRejected, match="moved from epoch"):
            s.commit(plan, fence + 1)
    assert not s.in_flight
    assert drain(s, h, fence, t) == [(GraphKind.SNAPSHOT, True, "stop")]
