"""Image windows: whole images per window, the private snapshot row, restore into a fresh
generation, compact feature offsets."""

import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.requests import ResourceError
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, SPEC
from .test_core import records, timing

spec = pytest.mark.spec
SPANS = [(10, 210), (250, 450), (600, 800)]


def run(s, h, limit=80):
    t, fence, plans = 0.0, 0, []
    req = s.requests[h.rid]
    while req.phase is not Phase.DECODE and fence < limit:
        fence += 1
        s.advance_to(int(t * NS_PER_MS))
        plan = s.plan()
        s.commit(plan, fence)
        t += plan.expected_duration_ms
        s.advance_to(int(t * NS_PER_MS))
        s.complete(fence, records(plan), timing(plan.expected_duration_ms))
        plans.append(plan)
    return plans


@spec(
    "prerequisites/image-windows",
    "prerequisites/vision-active-window",
    "prerequisites/prefill-window-stop",
    "prerequisites/atomic-span-chunk",
    "prerequisites/multiwindow-snapshot-row",
    "prerequisites/window-drain",
    "prerequisites/restore-fresh-generation",
    "prerequisites/feature-offsets-zero",
    "prerequisites/logical-request-kept",
    "prerequisites/private-no-prefix-cache",
    "prerequisites/private-no-host-cache",
    "useful-service/prefill-logical-limits",
)
def test_three_windows():
    s = Scheduler(SPEC, vision_window_tokens=300)
    s.seed_costs(0)
    prompt = list(range(1, 1001))
    h = s.admit(prompt, max_output=5, image_spans=SPANS, sampling={"seed": 7})
    req = s.requests[h.rid]
    assert [w[1] for w in req.image_windows.bounds] == [(0,), (1,), (2,)]
    assert req.image_windows.row is not None
    plans = run(s, h)
    kinds = [p.kind for p in plans]
    vision = [p for p in plans if p.kind is GraphKind.VISION]
    assert [p.lanes[0].images for p in vision] == [(0,), (1,), (2,)]
    assert all(p.lanes[0].feature_offset == 0 for p in vision)  # compact offsets from zero
    # Each later window: snapshot (drained state) -> restore (fresh generation) -> vision -> prefill.
    for first in [i for i, k in enumerate(kinds) if k is GraphKind.SNAPSHOT]:
        assert kinds[first : first + 3] == [GraphKind.SNAPSHOT, GraphKind.RESTORE, GraphKind.VISION]
        private = req.image_windows.row
        assert plans[first].lanes[0].snapshot_row == plans[first + 1].lanes[0].snapshot_row == private
    assert kinds.count(GraphKind.SNAPSHOT) == 2 and req.generation == 2
    # Prefill chunks stop at window starts and never cut an image span.
    ends = []
    for p in plans:
        for lane in p.lanes:
            if lane.role is LaneRole.PROMPT:
                ends.append(lane.prompt_start + lane.prompt_tokens)
    assert {250, 600} <= set(ends)
    assert not any(s_ < e < t_ for e in ends for s_, t_ in SPANS)
    # The logical request keeps its prompt and settings; its private row is never a cache entry.
    assert req.prompt == tuple(prompt) and req.sampling == {"seed": 7}
    assert s.checkpoints.lookup(prompt + [1]) is None
    row = req.image_windows.row
    s.cancel(h)
    assert row not in s.checkpoints.entries  # released once drained


def test_single_window_needs_no_private_row():
    s = Scheduler(SPEC)
    s.seed_costs(0)
    h = s.admit(list(range(300)), max_output=2, image_spans=[(5, 50)])
    req = s.requests[h.rid]
    assert req.image_windows.row is None and req.prerequisites == [GraphKind.VISION]


def test_image_inputs_need_vision_programs_and_rows():
    with pytest.raises(ValueError, match="no vision programs"):
        Scheduler(
            ORDINARY.__class__(
                **{
                    **ORDINARY.__dict__,
                    "graphs": tuple(g for g in ORDINARY.graphs if g.kind is not GraphKind.VISION),
                }
            )
        ).admit([1] * 20, max_output=1, image_spans=[(0, 5)])
    s = Scheduler(SPEC, vision_window_tokens=300, snapshot_rows=0)
    with pytest.raises(ResourceError, match="private snapshot row"):
        s.admit(list(range(1000)), max_output=1, image_spans=SPANS)
    with pytest.raises(ValueError, match="feature tokens"):
        Scheduler(SPEC, vision_window_tokens=100).admit(list(range(1000)), max_output=1, image_spans=SPANS)


@spec("prerequisites/feature-offsets-zero")
def test_images_of_one_window_are_encoded_one_execution_each_at_compact_offsets():
    """A window holding all three images, vision programs of one image each: three vision
    executions, each encoding the next image at the feature offset of the images before it in
    the window (their token lengths summed, from zero), then the prefill."""
    s = Scheduler(SPEC, vision_window_tokens=1000)
    s.seed_costs(0)
    assert s.captures.images_per_execution == 1
    h = s.admit(list(range(1, 1001)), max_output=5, image_spans=SPANS)
    plans = run(s, h)
    vision = [(p.lanes[0].images, p.lanes[0].feature_offset) for p in plans if p.kind is GraphKind.VISION]
    assert vision == [((0,), 0), ((1,), 200), ((2,), 400)]
    assert [p.kind for p in plans[:4]] == [GraphKind.VISION] * 3 + [GraphKind.PREFILL]


@spec("planning-queue/commit-checks")
def test_each_completed_prerequisite_moves_its_request_to_a_later_epoch():
    """Snapshot, restore and vision executions each end in a new epoch of their request, later
    than every epoch before it, so that a plan frozen before one of them can never be committed
    after it (the run of three windows: seven prerequisites)."""
    s = Scheduler(SPEC, vision_window_tokens=300)
    s.seed_costs(0)
    h = s.admit(list(range(1, 1001)), max_output=5, image_spans=SPANS)
    plans = run(s, h)
    prerequisites = [p.lanes[0].epoch for p in plans if p.lanes[0].role is LaneRole.PREREQUISITE]
    assert len(prerequisites) == 7
    assert all(a < b for a, b in zip(prerequisites, prerequisites[1:]))
    epochs = [p.lanes[0].epoch for p in plans]
    assert epochs == sorted(epochs) and s.requests[h.rid].epoch > prerequisites[-1]
