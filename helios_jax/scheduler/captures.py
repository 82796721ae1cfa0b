"""Captures and image windows: which state operations a request's lifecycle passes through.

``checkpoints.py`` owns the snapshot rows and the prefix index; this module decides, for one
request at a time, when those rows are used (docs/checkpoints.md; spec, checkpoint paragraphs
of "Planning and the execution queue" and "Prerequisites and completion"):

- at admission: restore a stored prefix, encode the first image window, or initialize;
- during prefill: the capture endpoints (the conversation anchor, then extras within the
  request-local allowance), a snapshot at each endpoint a chunk reaches, and at an image-window
  boundary a snapshot, a restore into a fresh generation and the next window's vision work;
- at the end: a funded terminal capture, then the release of every row the request holds.

The scheduler (``core.py``) delegates to one :class:`Captures`; the clock is passed in. A
request's own rows and windows are grouped on it as ``Request.capture`` and
``Request.image_windows`` (``requests.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from helios_jax.catalog import GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.checkpoints import CheckpointStore, Role, capture_endpoints
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.requests import Request, ResourceError
from helios_jax.scheduler.view import LaneRole, Phase

Window = tuple[int, tuple[int, ...]]  # (first token of the window's first image, image indices)


def next_capture(req: Request) -> int | None:
    """The next capture endpoint beyond the consumed prompt (None: none left)."""
    for endpoint, _ in req.capture.endpoints:
        if endpoint > req.consumed:
            return endpoint
    return None


def window_stop(req: Request) -> int | None:
    """Prefill stops before the next window's first image dependency."""
    windows = req.image_windows
    if windows.active + 1 < len(windows.bounds):
        return windows.bounds[windows.active + 1][0]
    return None


class Captures:
    """Checkpoint captures and image windows over one catalog's state-copy and vision programs."""

    def __init__(
        self,
        graphs: policy.PreparedGraphs,
        costs: CostModel,
        *,
        checkpoints: bool,
        snapshot_rows: int | None,
        request_slots: int,
        vision_window_tokens: int | None,
    ):
        kinds = {g.kind for g in graphs.graphs}
        self.graphs = graphs
        self.costs = costs
        # Checkpoint retention (anchors, extras, terminal captures, the prefix cache) needs snapshot
        # and restore programs; it is opt-in (docs/checkpoints.md says why).
        self.state_copies = {GraphKind.SNAPSHOT, GraphKind.RESTORE} <= kinds
        self.enabled = checkpoints and self.state_copies
        if not self.state_copies:
            snapshot_rows = 0  # no program could fill or read a row
        elif snapshot_rows is None:
            snapshot_rows = request_slots
        self.checkpoints = CheckpointStore(snapshot_rows)
        vision = [g for g in graphs.graphs if g.kind is GraphKind.VISION]
        self.images_per_execution = max((g.image_capacity for g in vision), default=0)
        if vision_window_tokens is not None and vision_window_tokens < 1:
            raise ValueError("vision_window_tokens must be positive")
        self.vision_window_tokens = vision_window_tokens  # prepared feature storage per window

    # == admission ==========================================================================
    def admission_windows(self, spans: tuple[tuple[int, int], ...]) -> list[Window]:
        """The image windows of an admission; raises when the catalog cannot serve them."""
        windows = self.image_windows(spans)
        if spans and not self.images_per_execution:
            raise ValueError("this catalog has no vision programs; image inputs are not supported")
        if len(windows) > 1 and not (self.state_copies and self.checkpoints.obtainable(-1, mandatory=True)):
            raise ResourceError("a multi-window image request needs a private snapshot row")
        return windows

    def admit(
        self, req: Request, windows: list[Window], initialize: bool, fraction: float, now_ns: int
    ) -> None:
        """A new request's first prerequisites (vision, restore or initialize) and capture plan."""
        hit = self.checkpoints.lookup(req.prompt) if self.enabled and not req.image_spans else None
        if windows:
            req.image_windows.bounds = windows
            req.phase, req.enables = Phase.BLOCKED, Phase.PREFILL
            req.prerequisites = [GraphKind.VISION] * self._vision_executions(req, 0)
            if len(windows) > 1:
                req.image_windows.row = self.checkpoints.arm(req.rid, (), Role.WINDOW, now_ns, mandatory=True)
        elif hit is not None:
            req.cached = req.consumed = hit.length
            req.capture.restore_row = hit.row
            self.checkpoints.pin(hit.row, now_ns)
            req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.RESTORE], Phase.PREFILL
        elif initialize:
            req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.INITIALIZE], Phase.PREFILL
        if self.enabled and not req.image_spans:
            # Checkpoints are keyed by token ids; a prompt with images holds image features that
            # the same placeholder ids in another prompt do not, so it publishes none.
            self._plan_captures(req, fraction, now_ns)

    # == image windows ======================================================================
    def image_windows(self, spans: Sequence[tuple[int, int]]) -> list[Window]:
        """Group image spans into whole-image windows bounded by the prepared feature storage.

        Returns [(first token of the window's first image, (image indices...)), ...]; a span is
        one image and its tokens are its features.
        """
        windows: list[Window] = []
        current: list[int] = []
        used = 0
        limit = self.vision_window_tokens
        for i, (start, end) in enumerate(spans):
            size = end - start
            if limit is not None and size > limit:
                raise ValueError(f"image {i} needs {size} feature tokens, the window holds {limit}")
            if current and limit is not None and used + size > limit:
                windows.append((spans[current[0]][0], tuple(current)))
                current, used = [], 0
            current.append(i)
            used += size
        if current:
            windows.append((spans[current[0]][0], tuple(current)))
        return windows

    def _vision_executions(self, req: Request, window: int) -> int:
        images = len(req.image_windows.bounds[window][1])
        return -(-images // max(1, self.images_per_execution))

    def cross_window(self, req: Request, now_ns: int) -> bool:
        """At a window boundary: drain, snapshot the exact state, restore into a fresh generation,
        then encode the next window's images (compact feature offsets from zero)."""
        stop = window_stop(req)
        if stop is None or req.consumed != stop:
            return False
        windows = req.image_windows
        assert windows.row is not None  # more than one window: a private row was armed at admission
        windows.active += 1
        windows.encoded = 0
        req.capture.row = windows.row
        self.checkpoints.pin(windows.row, now_ns)
        req.phase, req.enables = Phase.BLOCKED, Phase.PREFILL
        req.prerequisites = [GraphKind.SNAPSHOT, GraphKind.RESTORE] + [
            GraphKind.VISION
        ] * self._vision_executions(req, windows.active)
        return True

    def vision_lane(self, req: Request) -> tuple[tuple[int, ...], int]:
        """The images the next vision execution encodes and their compact feature offset."""
        windows = req.image_windows
        images = windows.bounds[windows.active][1]
        done = windows.encoded
        batch = images[done : done + max(1, self.images_per_execution)]
        offset = sum(req.image_spans[i][1] - req.image_spans[i][0] for i in images[:done])
        return batch, offset

    def lane_state(
        self, req: Request, role: LaneRole, kind: GraphKind
    ) -> tuple[int | None, tuple[int, ...], int]:
        """A plan lane's snapshot row, vision images and feature offset."""
        row = None
        if role is LaneRole.TERMINAL or (role is LaneRole.PREREQUISITE and kind is GraphKind.SNAPSHOT):
            row = req.capture.row
        elif role is LaneRole.PREREQUISITE and kind is GraphKind.RESTORE:
            row = req.capture.restore_row
        if role is LaneRole.PREREQUISITE and kind is GraphKind.VISION:
            return (row, *self.vision_lane(req))
        return row, (), 0

    # == capture costs ======================================================================
    def cost_ms(self, kind: GraphKind, now_ns: int) -> float | None:
        """The fastest fresh estimate among the loaded programs of one kind (None: unknown)."""
        known = [
            ms
            for g in self.graphs.graphs
            if g.kind is kind
            and self.costs.is_fresh(g.key, now_ns)
            and (ms := self.costs.estimate_ms(g.key)) is not None
        ]
        return min(known) if known else None

    def prefill_ms_per_token(self) -> float | None:
        rates = [
            ms / g.token_capacity
            for g in self.graphs.prefill
            if self.costs.is_known(g.key) and (ms := self.costs.estimate_ms(g.key)) is not None
        ]
        return min(rates) if rates else None

    def extra_capture_cost_ms(self, now_ns: int) -> float | None:
        """An extra capture: one snapshot copy plus one additional prefill split (the smallest
        measured chunk's duration stands for the launch a split adds). None: unknown."""
        snap = self.cost_ms(GraphKind.SNAPSHOT, now_ns)
        splits = [
            ms
            for g in self.graphs.prefill
            if self.costs.is_fresh(g.key, now_ns) and (ms := self.costs.estimate_ms(g.key)) is not None
        ]
        if snap is None or not splits:
            return None
        return snap + min(splits)

    # == captures ===========================================================================
    def _plan_captures(self, req: Request, fraction: float, now_ns: int) -> None:
        """Choose the request's capture endpoints: the anchor, then extras within the allowance.

        The anchor is best effort (captured when a destination row is obtainable then; a free row
        is guarded for it now); extras need known costs and the request-local allowance of
        `fraction` (checkpoint_extra_work_fraction) x its estimated uncached prefill work.
        """
        anchor, extras = capture_endpoints(req.message_endpoints, req.prompt_len, req.consumed)
        if anchor is None:
            return
        points = []
        if not self.checkpoints.holds(req.prompt[:anchor]):
            points.append((anchor, Role.ANCHOR))
            self.checkpoints.guard(req.rid)
        per_token = self.prefill_ms_per_token()
        cost = self.extra_capture_cost_ms(now_ns)
        if per_token is not None and cost is not None:
            allowance = fraction * per_token * req.prompt_remaining
            for e in extras:
                if cost <= allowance and not self.checkpoints.holds(req.prompt[:e]):
                    points.append((e, Role.EXTRA))
                    allowance -= cost
        req.capture.endpoints = sorted(points)

    def drop_captures(self, req: Request) -> None:
        """Cancellation or retirement: pending captures and the guard go. An armed row stays
        pinned until the request's last fence: :meth:`release` returns it then (every caller
        reaches it at once when nothing is in flight)."""
        req.capture.endpoints = []
        self.checkpoints.release_guards(req.rid)

    def reach_endpoint(self, req: Request, enables: Phase, now_ns: int) -> None:
        """A prompt chunk ended at a capture endpoint: snapshot the exact consumed state first."""
        point = next(((e, r) for e, r in req.capture.endpoints if e == req.consumed), None)
        if point is None:
            return
        req.capture.endpoints.remove(point)
        endpoint, role = point
        if role is Role.EXTRA and self.cost_ms(GraphKind.SNAPSHOT, now_ns) is None:
            return  # its cost expired after the split was dispatched: skip the copy
        if self.checkpoints.holds(req.prompt[:endpoint]):
            # Stored, or being captured by an identical prompt admitted alongside: never twice.
            if role is Role.ANCHOR:
                self.checkpoints.release_guards(req.rid)
            return
        if not self.checkpoints.obtainable(req.rid, role=role):
            return  # best effort: no destination row now
        req.capture.row = self.checkpoints.arm(req.rid, req.prompt[:endpoint], role, now_ns)
        req.phase, req.prerequisites, req.enables = Phase.BLOCKED, [GraphKind.SNAPSHOT], enables
        if role is Role.ANCHOR:
            self.checkpoints.release_guards(req.rid)

    def ends_at_anchor(self, req: Request) -> bool:
        """The request ends right at its anchor (its prompt end, with one output token)."""
        return len(req.output) <= 1 and any(
            e == req.consumed and r is Role.ANCHOR for e, r in req.capture.endpoints
        )

    def begin_terminal_capture(self, req: Request, now_ns: int, *, funded: bool = False) -> bool:
        """Enter the terminal phase with an armed destination row, when the capture is funded
        (productive decode allowance covers a snapshot, or a preemption) and obtainable.

        Only a decoding request holds the state of prompt + output[:-1]; one preempted or ended
        before its prompt is prefilled (or restored) retires without a capture."""
        if not self.enabled or req.cancelled or req.phase is not Phase.DECODE or req.image_spans:
            return False
        cost = self.cost_ms(GraphKind.SNAPSHOT, now_ns)
        tokens = req.prompt + tuple(req.output[:-1])
        if (
            cost is None
            or (not funded and req.capture.terminal_allowance_ms < cost)
            or self.checkpoints.holds(tokens)
        ):
            return False
        if not self.checkpoints.obtainable(req.rid, role=Role.TERMINAL):
            return False
        req.capture.row = self.checkpoints.arm(req.rid, tokens, Role.TERMINAL, now_ns)
        req.phase, req.prerequisites, req.enables = Phase.TERMINAL, [], None
        req.terminal_since_ns = now_ns
        req.capture.terminal_allowance_ms -= cost
        return True

    # == completed state operations =========================================================
    def prerequisite_done(self, req: Request, kind: GraphKind, now_ns: int) -> None:
        """A completed prerequisite of `kind` (the request's next one): its rows, then the next
        prerequisite or the phase it enables, in a new epoch."""
        if not req.prerequisites or req.prerequisites[0] is not kind:
            return
        self._state_operation_done(req, kind, now_ns)
        req.prerequisites.pop(0)
        if not req.prerequisites:
            req.phase = req.enables or Phase.PREFILL
        req.epoch += 1

    def _state_operation_done(self, req: Request, kind: GraphKind, now_ns: int) -> None:
        """The effects of a completed SNAPSHOT, RESTORE or VISION prerequisite on its rows."""
        capture, windows = req.capture, req.image_windows
        if kind is GraphKind.SNAPSHOT and capture.row is not None:
            self.checkpoints.captured(capture.row, now_ns)
            capture.row = None
            if windows.row is not None and req.prerequisites[1:2] == [GraphKind.RESTORE]:
                capture.restore_row = windows.row  # private window state, restored next
                self.checkpoints.pin(windows.row, now_ns)
        elif kind is GraphKind.RESTORE and capture.restore_row is not None:
            self.checkpoints.unpin(capture.restore_row)
            capture.restore_row = None
            req.generation += 1  # the state is bound to a fresh request generation
        elif kind is GraphKind.VISION:
            windows.encoded += max(1, self.images_per_execution)

    def terminal_done(self, req: Request, now_ns: int) -> None:
        """The terminal capture completed: its checkpoint is ready."""
        if req.capture.row is not None:
            self.checkpoints.captured(req.capture.row, now_ns)
            req.capture.row = None

    def retire(self, req: Request) -> None:
        """A finished request leaves selection: pending captures and a pending restore go."""
        self.drop_captures(req)
        if req.capture.restore_row is not None:
            self.checkpoints.unpin(req.capture.restore_row)
            req.capture.restore_row = None

    def release(self, req: Request) -> None:
        """Its last fence has completed: an armed capture that never ran (or was cancelled while
        in flight) returns its row, a restore that never ran drops its pin, and a multi-window
        request's private row is freed."""
        capture, windows = req.capture, req.image_windows
        if capture.row is not None and capture.row != windows.row:
            self.checkpoints.abandon(capture.row)
        if capture.restore_row is not None and capture.restore_row != windows.row:
            self.checkpoints.unpin(capture.restore_row)
        capture.row = capture.restore_row = None
        if windows.row is not None:
            self.checkpoints.release_private(windows.row)
            windows.row = None
