"""Captures and image windows, rule by rule: window grouping at the storage limit, what an
admission needs, the store a catalog without state copies gets, the rows and offsets plan lanes
carry, and the dates restores give checkpoints (docs/mutation.md: the captures pass)."""

import dataclasses
import math

import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.checkpoints import Role
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, SPEC
from .test_checkpoints import sched, step

spec = pytest.mark.spec


@spec("prerequisites/image-windows")
@pytest.mark.parametrize(
    "sizes, limit, windows",
    [
        ((200, 200), 400, [(0, 1)]),  # two images exactly filling the window share it
        ((400,), 400, [(0,)]),  # an image of exactly the window's size fits
        ((300, 200, 200), 400, [(0,), (1, 2)]),  # a new window starts empty, then fills exactly
        ((100, 100, 100), 250, [(0, 1), (2,)]),  # the window's use is the sum of its images
        ((100, 100, 100), None, [(0, 1, 2)]),  # no storage limit: one window
    ],
)
def test_image_windows_hold_whole_images_up_to_exactly_the_storage(sizes, limit, windows):
    s = Scheduler(SPEC, vision_window_tokens=limit)
    spans, start = [], 10
    for size in sizes:
        spans.append((start, start + size))
        start += size + 5
    got = s.captures.image_windows(spans)
    assert [images for _, images in got] == windows
    assert [first for first, _ in got] == [spans[w[0]][0] for w in windows]


def test_the_window_storage_must_be_positive():
    assert Scheduler(SPEC, vision_window_tokens=1).captures.vision_window_tokens == 1
    with pytest.raises(ValueError, match="positive"):
        Scheduler(SPEC, vision_window_tokens=0)


@spec("prerequisites/multiwindow-snapshot-row")
def test_only_a_request_of_two_or_more_windows_needs_a_private_snapshot_row():
    """Without snapshot rows, one window is admitted (its features never leave the request's own
    state), two are refused: crossing a window snapshots the exact state into a private row."""
    s = Scheduler(SPEC, vision_window_tokens=300, snapshot_rows=0)
    h = s.admit(list(range(1, 1001)), max_output=2, image_spans=[(10, 210)])
    assert s.requests[h.rid].image_windows.row is None
    with pytest.raises(ResourceError, match="private snapshot row"):
        s.admit(list(range(1, 1001)), max_output=2, image_spans=[(10, 210), (250, 450)])


def without_state_copies(catalog):
    kinds = (GraphKind.SNAPSHOT, GraphKind.RESTORE)
    return dataclasses.replace(catalog, graphs=tuple(g for g in catalog.graphs if g.kind not in kinds))


def test_a_catalog_without_state_copies_holds_no_snapshot_rows_whatever_is_asked():
    for rows in (None, 4):
        s = Scheduler(without_state_copies(ORDINARY), checkpoints=True, snapshot_rows=rows)
        assert s.checkpoints.size == 0 and s.checkpoints.free_rows == 0 and not s.captures.enabled
    assert Scheduler(ORDINARY, checkpoints=True).checkpoints.size == ORDINARY.request_slots
    assert Scheduler(ORDINARY, checkpoints=True, snapshot_rows=3).checkpoints.size == 3


def test_lanes_that_copy_no_state_carry_no_snapshot_row_and_no_feature_offset():
    s = sched()
    s.admit(list(range(1, 200)), max_output=3, message_endpoints=[100])
    t, fence, roles = 0.0, 0, set()
    while s.requests and fence < 30:
        fence += 1
        plan, _, t = step(s, fence, t)
        for lane in plan.lanes:
            if lane.role in (LaneRole.PROMPT, LaneRole.DECODE):
                roles.add(lane.role)
                assert lane.snapshot_row is None and lane.images == () and lane.feature_offset == 0
    assert roles == {LaneRole.PROMPT, LaneRole.DECODE}


@spec("planning-queue/victim-ranking")
def test_a_restore_dates_the_demand_of_the_checkpoint_it_reads():
    """Two stored checkpoints, the first demanded longest ago (victims rank by role, then demand
    recency); a later admission that restores the first dates its demand at that admission."""
    s = sched(snapshot_rows=2)
    prompts = [list(range(1, 101)), list(range(201, 301))]
    t, fence = 0.0, 0
    for prompt in prompts:
        fence, t = run_out(s, s.admit(prompt, max_output=1, message_endpoints=[100]), fence, t)
        t += 5.0
    rows = [s.checkpoints.lookup(p + [1]).row for p in prompts]
    assert s.checkpoints.victims(-1) == rows  # the first captured is demanded longest ago
    s.advance_to(int((t + 50) * NS_PER_MS))
    h = s.admit(prompts[0] + [7] * 20, max_output=1)
    assert s.requests[h.rid].capture.restore_row == rows[0]
    assert s.checkpoints.entries[rows[0]].last_demand_ns == int((t + 50) * NS_PER_MS)


def stale(s):
    """Every catalog estimate known but none fresh: the clock past the freshness interval."""
    s.advance_to(s.policy.estimate_ttl_ns + 1)
    return s


@spec("planning-queue/unknown-no-extras")
def test_known_prefill_rates_without_a_fresh_snapshot_cost_allow_no_extras():
    s = stale(sched())
    assert (
        s.captures.prefill_ms_per_token() is not None and s.captures.extra_capture_cost_ms(s.now_ns) is None
    )
    h = s.admit(list(range(1, 1001)), max_output=5, message_endpoints=[100, 300, 700])
    assert s.requests[h.rid].capture.endpoints == [(700, Role.ANCHOR)]


@spec("planning-queue/unknown-no-extras")
def test_an_extra_capture_costs_nothing_known_until_the_snapshot_is_fresh_again():
    """A fresh prefill split is not enough: without a fresh snapshot estimate the extra's cost is
    unknown; a fresh snapshot observation makes it the snapshot plus the fastest fresh split."""
    s = stale(sched())
    prefill = min(s.graphs.prefill, key=lambda g: s.costs.estimate_ms(g.key))
    s.costs.observe(prefill.key, [2e6], s.now_ns)
    assert s.captures.extra_capture_cost_ms(s.now_ns) is None
    snapshot = min(
        (g for g in s.graphs.graphs if g.kind is GraphKind.SNAPSHOT), key=lambda g: s.costs.estimate_ms(g.key)
    )
    s.costs.observe(snapshot.key, [1e6], s.now_ns)
    assert s.captures.extra_capture_cost_ms(s.now_ns) == pytest.approx(1.0 + 2.0)


def one_extra_prompt_len(s):
    """A prompt length whose extra-work allowance is one and a half extra captures."""
    per_token, cost = s.captures.prefill_ms_per_token(), s.captures.extra_capture_cost_ms(s.now_ns)
    return math.ceil(1.5 * cost / (s.policy.checkpoint_extra_work_fraction * per_token))


def extra_then_anchor(s):
    """A prompt whose allowance admits one extra capture (at 200) before its anchor (at 300)."""
    h = s.admit([3] * one_extra_prompt_len(s), max_output=4, message_endpoints=[100, 200, 300])
    assert s.requests[h.rid].capture.endpoints == [(200, Role.EXTRA), (300, Role.ANCHOR)]
    return h


@spec("planning-queue/extra-allowance", "planning-queue/guard-protects")
def test_a_reached_extra_is_snapshotted_and_the_anchor_keeps_its_guard():
    """The extra at 200 is snapshotted when the chunk reaches it (its cost fresh), and arming it
    leaves the row guarded for the later anchor; the anchor at 300 is then captured too."""
    s = sched()
    h = extra_then_anchor(s)
    req = s.requests[h.rid]
    t, fence, armed = 0.0, 0, []
    while h.rid in s.requests and fence < 40:
        fence += 1
        plan, _, t = step(s, fence, t)
        if req.capture.row is not None and req.phase is Phase.BLOCKED and req.consumed not in armed:
            armed.append(req.consumed)
            role = s.checkpoints.entries[req.capture.row].role
            assert (h.rid in s.checkpoints.guards.values()) is (role is Role.EXTRA)
    assert armed == [200, 300]
    assert sorted(cp.length for cp in s.checkpoints.entries.values() if cp.role is not Role.TERMINAL) == [
        200,
        300,
    ]


@spec("planning-queue/exact-endpoints", "planning-queue/guard-protects")
def test_an_anchor_already_stored_releases_the_guard_when_reached():
    """Two identical conversations admitted together both guard a row for their anchor; the
    second reaches it when the first has armed it, so it copies nothing and gives its guard
    back at once (it keeps decoding: the guard is not held until it retires)."""
    s = sched()
    prompt = list(range(1, 301))
    first, second = (s.admit(prompt, max_output=30, message_endpoints=[250]) for _ in range(2))
    assert sorted(s.checkpoints.guards.values()) == [first.rid, second.rid]
    t, fence = 0.0, 0
    req = s.requests[second.rid]
    while req.consumed < 250 and fence < 40:
        fence += 1
        _, _, t = step(s, fence, t)
    assert s.checkpoints.holds(prompt[:250]) and req.capture.endpoints == [] and not req.finished
    assert second.rid not in s.checkpoints.guards.values()


@spec("planning-queue/decode-terminal-capture")
def test_a_request_ending_on_an_extra_endpoint_gets_no_funded_terminal_capture():
    """Only an anchor at the prompt end funds the capture of a request that ends there: one
    whose prompt end is an extra (its anchor an earlier message) and that earned no decode
    allowance retires without a terminal capture."""
    s = sched()
    n = one_extra_prompt_len(s)
    prompt = [3] * n
    h = s.admit(prompt, max_output=1, message_endpoints=[100])
    assert s.requests[h.rid].capture.endpoints == [(100, Role.ANCHOR), (n, Role.EXTRA)]
    t, fence = 0.0, 0
    while h.rid in s.requests and fence < 40:
        fence += 1
        plan, _, t = step(s, fence, t)
        assert plan.kind is not GraphKind.SNAPSHOT or s.requests[h.rid].consumed == 100
    assert not s.checkpoints.holds(prompt) and s.checkpoints.holds(prompt[:100])


def run_out(s, h, fence=0, t=0.0):
    """Frames until the request of `h` has left; returns the last fence and time."""
    while h.rid in s.requests:
        fence += 1
        _, _, t = step(s, fence, t)
    return fence, t


def restoring(s, prompt):
    """`prompt`'s first 100 tokens stored as an anchor, then a longer prompt admitted to restore it."""
    fence, t = run_out(s, s.admit(prompt[:100], max_output=1, message_endpoints=[100]))
    h = s.admit(prompt, max_output=3)
    req = s.requests[h.rid]
    assert req.prerequisites == [GraphKind.RESTORE]
    return h, req.capture.restore_row, fence, t


@spec("planning-queue/armed-retained", "planning-queue/victim-ranking")
def test_a_completed_restore_unpins_the_checkpoint_it_read():
    s = sched()
    h, row, fence, t = restoring(s, list(range(1, 151)))
    assert s.checkpoints.entries[row].pins == 1 and row not in s.checkpoints.victims(-1)
    plan, _, t = step(s, fence + 1, t)
    assert plan.kind is GraphKind.RESTORE and s.requests[h.rid].capture.restore_row is None
    assert s.checkpoints.entries[row].pins == 0 and row in s.checkpoints.victims(-1)


@spec("planning-queue/armed-retained")
def test_a_preempted_request_gives_back_its_restore_pin_at_retirement():
    """Retired while its restore is in flight, a request drops its reader's pin at once: frames
    run in fence order, so a later capture into that row runs after the restore has read it."""
    s = sched()
    h, row, fence, t = restoring(s, list(range(1, 151)))
    s.advance_to(int(t * NS_PER_MS))
    plan = s.plan()
    assert plan.kind is GraphKind.RESTORE
    s.commit(plan, fence + 1)
    s.preempt(h)
    req = s.requests[h.rid]
    assert req.retired and req.inflight and req.capture.restore_row is None
    assert s.checkpoints.entries[row].pins == 0


@spec("prerequisites/restore-fresh-generation", "prerequisites/window-drain")
def test_a_window_restore_binds_a_fresh_generation_when_it_completes():
    """Crossing into each later window, the restore's completion itself binds the fresh
    generation and drops its read of the private row; the vision work that follows changes
    neither."""
    s = Scheduler(SPEC, vision_window_tokens=300)
    s.seed_costs(0)
    h = s.admit(list(range(1, 1001)), max_output=5, image_spans=[(10, 210), (250, 450), (600, 800)])
    req = s.requests[h.rid]
    private = req.image_windows.row
    t, fence, seen = 0.0, 0, []
    while req.phase is not Phase.DECODE and fence < 80:
        fence += 1
        generation, pins = req.generation, s.checkpoints.entries[private].pins
        plan, _, t = step(s, fence, t)
        if plan.kind is GraphKind.RESTORE:
            assert req.generation == generation + 1 and req.capture.restore_row is None
            assert s.checkpoints.entries[private].pins == pins - 1
            seen.append(req.generation)
        else:
            assert req.generation == generation
    assert seen == [1, 2]


@spec("planning-queue/extra-allowance")
def test_an_extra_capture_costing_exactly_the_allowance_is_admitted():
    """Measured so that every figure is exact in binary: prefill at 0.5 ms a token (the smallest
    split, 64 tokens, 32 ms), snapshots 1 ms, fraction 0.25. A 264-token prompt's allowance is
    0.25 x 0.5 x 264 = 33 ms, exactly one extra's cost (1 + 32): the extra is admitted."""
    from helios_jax.scheduler.config import PolicyConfig

    s = Scheduler(SPEC, checkpoints=True)
    s.configure_policy(PolicyConfig(checkpoint_extra_work_fraction=0.25))
    for g in s.graphs.prefill:
        s.costs.observe(g.key, [g.token_capacity * 500_000], 0)
    for g in s.graphs.graphs:
        if g.kind is GraphKind.SNAPSHOT:
            s.costs.observe(g.key, [1_000_000], 0)
    assert s.captures.prefill_ms_per_token() == 0.5 and s.captures.extra_capture_cost_ms(0) == 33.0
    h = s.admit([3] * 264, max_output=2, message_endpoints=[100, 200])
    assert s.requests[h.rid].capture.endpoints == [(100, Role.EXTRA), (200, Role.ANCHOR)]
