"""From a chosen candidate to a frame in flight, and the two-slot window it enters.

``plan()`` selects a :class:`~helios_jax.scheduler.view.Candidate`; :func:`freeze` turns it into
the plain-data ``ScheduledPlan`` the executor receives, each lane frozen against its request's
current epoch, cursor and state rows (``commit`` later rechecks exactly those). ``commit`` then
records the plan as a :class:`~helios_jax.scheduler.plan.Frame` (:func:`frame_record`): its
participants, its expected end behind queued work and its frozen expected service.

The window has two frame slots (oldest first). :func:`window_blocked` says when no frame may be
appended; :func:`planning_start_ns` is where the next frame would start, the time ``plan()``
projects prices and ages to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from helios_jax.catalog import Allocation, DecodeMode, GraphKind
from helios_jax.scheduler import service
from helios_jax.scheduler.captures import Captures
from helios_jax.scheduler.plan import ExecutionClass, Frame, PlanLane, ScheduledPlan
from helios_jax.scheduler.requests import Request
from helios_jax.scheduler.service import NS_PER_MS
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase, assemble


def freeze(
    c: Candidate,
    reason: ExecutionClass,
    credit: float,
    start_ns: int,
    *,
    requests: Mapping[int, Request],
    captures: Captures,
    mode: DecodeMode,
    now_ns: int,
) -> ScheduledPlan:
    """The chosen candidate as a frozen plan, planned at `now_ns` for a start at `start_ns`.

    Only ordinary decode and complete speculative generation may share the window; every other
    kind, an indeterminate or stale cost, a refresh or probe and a lane that needs completion
    feedback (host stops) ask for an empty window.
    """
    lanes = [plan_lane(requests[lane.rid], c.graph.kind, lane, captures) for lane in c.lanes]
    needs_empty = (
        not c.graph.kind.may_share_window
        or c.indeterminate
        or c.stale
        or reason is not ExecutionClass.ORDINARY
        or any(requests[lane.rid].needs_feedback for lane in c.lanes)
    )
    if c.graph.allocation is Allocation.PREFIX_LIMIT:
        # The device breaks frontier ties by lane position: lanes in slot order make that
        # the original request slot, the order the host priced the allocation with.
        lanes.sort(key=lambda lane: lane.slot)
    return assemble(
        ScheduledPlan,
        graph=c.graph,
        lanes=tuple(lanes),
        decode_mode=mode,
        expected_duration_ms=c.duration_ms,
        value_rate=c.score,
        log_scale=c.log_scale,
        reason=reason,
        exploration_credit_ms=credit,
        needs_empty_window=needs_empty,
        planned_at_ns=now_ns,
        planning_start_ns=start_ns,
        following=c.following,
    )


def plan_lane(req: Request, kind: GraphKind, lane: Lane, captures: Captures) -> PlanLane:
    """A candidate lane frozen against its request's current epoch, cursor and rows."""
    prompt = lane.role is LaneRole.PROMPT
    row, images, offset = captures.lane_state(req, lane.role, kind)
    # Every field, set without the frozen constructor's per-field dispatch (a plan of 16 lanes
    # paid about 40 us for it); test_plan_cost_bounds checks the field names.
    return assemble(
        PlanLane,
        handle=req.handle,
        slot=req.slot,
        epoch=req.epoch,
        role=lane.role,
        prompt_tokens=lane.prompt_tokens,
        prompt_start=req.consumed if prompt else 0,
        query_length=lane.query_length,
        ceiling=lane.ceiling,
        expected_tokens=lane.expected_tokens,
        finishes_prompt=prompt and req.consumed + lane.prompt_tokens == req.prompt_len,
        snapshot_row=row,
        images=images,
        feature_offset=offset,
    )


def frame_record(
    plan: ScheduledPlan,
    fence: int,
    *,
    frames: Sequence[Frame],
    requests: Mapping[int, Request],
    normalizers: service.Normalizers,
    now_ns: int,
) -> Frame:
    """The frame a plan committed at `now_ns` becomes: its participants, expected end (behind
    the `frames` already in flight) and frozen expected service."""
    # Participants: resident, selectable requests at dispatch (later admissions are not).
    participants = tuple(r.handle for r in requests.values() if r.active and r.phase is not Phase.BLOCKED)
    previous_end = frames[-1].expected_end_ns if frames else now_ns
    expected_end = None
    if plan.expected_duration_ms is not None:
        start = max(now_ns, previous_end or now_ns)
        expected_end = start + int(plan.expected_duration_ms * NS_PER_MS)
    # Expected output tokens (a finishing prompt lane's first token included): the token
    # rate x counts output, not prompt tokens (docs/scheduling-utility.md).
    expected_service = {
        lane.handle.rid: (lane.expected_tokens, float(lane.role is LaneRole.DECODE)) for lane in plan.lanes
    }
    return Frame(fence, plan, now_ns, expected_end, participants, normalizers, expected_service)


def reanchor(frames: Sequence[Frame], completed_ns: int) -> None:
    """After the oldest frame's completion is observed at `completed_ns`, the frames still queued
    expect to end one estimate after their predecessor's observed end, not after its expected one
    (RESOLUTIONS 38): the feedback that lifts an overrun's suspension also dates the queue."""
    previous_end = completed_ns
    for f in frames:
        if f.plan.expected_duration_ms is None:
            return
        f.expected_end_ns = previous_end + int(f.plan.expected_duration_ms * NS_PER_MS)
        previous_end = f.expected_end_ns


def window_blocked(frames: Sequence[Frame], now_ns: int) -> bool:
    """No frame can be appended: a draining frame, a full window or an overrun is in flight."""
    if not frames:
        return False
    if len(frames) >= 2 or any(not f.plan.graph.kind.may_share_window for f in frames):
        return True
    last = frames[-1]
    return last.expected_end_ns is None or now_ns > last.expected_end_ns  # overrun


def planning_start_ns(frames: Sequence[Frame], now_ns: int) -> int:
    """Where the next frame would start: now, or the expected end of the queued work."""
    if not frames:
        return now_ns
    return max(now_ns, frames[-1].expected_end_ns or now_ns)
