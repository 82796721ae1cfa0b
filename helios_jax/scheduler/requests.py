"""Per-request host state and the resource pools the scheduler owns.

A request is *resident* from admission until it retires and its last submitted fence has
completed; only then are its request slot, KV pages and state rows returned. Cancellation stops
selection at once but keeps that fenced ownership, so a cancelled handle can never charge or
corrupt a later request that reuses its slot (the slot's generation changes).

A :class:`Request` keeps what the client asked, its progress and its learned estimates flat; the
state that ``captures.py`` manages is grouped: its checkpoint rows and pending capture endpoints
(:class:`CaptureState`) and its image windows (:class:`ImageWindows`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.checkpoints import Role
from helios_jax.scheduler.plan import Handle
from helios_jax.scheduler.service import ServiceHistory
from helios_jax.scheduler.speculation import SOURCES, AcceptanceHistory, PrefixEstimate
from helios_jax.scheduler.view import Phase


class Pool:
    """A free list of integer resources (request slots, KV pages, snapshot rows)."""

    def __init__(self, size: int, name: str):
        self.name = name
        self.size = size
        self._free = list(range(size - 1, -1, -1))  # pop() hands out the lowest id first
        self._owner: dict[int, int] = {}

    @property
    def available(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int = 1) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int, owner: int) -> list[int]:
        if n > len(self._free):
            raise ResourceError(f"{self.name}: {n} requested, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        for x in out:
            self._owner[x] = owner
        return out

    def free(self, items: Iterable[int], owner: int) -> None:
        for x in items:
            if self._owner.get(x) != owner:
                raise ResourceError(f"{self.name}: {x} is not owned by request {owner}")
            del self._owner[x]
            self._free.append(x)
        self._free.sort(reverse=True)

    def owned(self) -> dict[int, int]:
        return dict(self._owner)


class ResourceError(RuntimeError):
    """A request slot, KV page or state row is not available (admission is refused)."""


@dataclasses.dataclass
class CaptureState:
    """A request's checkpoint rows, capture endpoints still to reach and capture allowances."""

    restore_row: int | None = None  # the checkpoint a pending RESTORE reads
    row: int | None = None  # the armed destination of a pending SNAPSHOT
    endpoints: list[tuple[int, Role]] = dataclasses.field(default_factory=list)  # still to capture
    terminal_allowance_ms: float = 0.0  # earned by productive decode toward a terminal capture


@dataclasses.dataclass
class ImageWindows:
    """A request's image windows: whole images bounded by the prepared feature storage."""

    bounds: list[tuple[int, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    # [(first token of the window's first image, image indices)] per window
    active: int = 0  # the active image window
    encoded: int = 0  # images of the active window already encoded
    row: int | None = None  # the private snapshot row of a multi-window request


@dataclasses.dataclass
class Request:
    """Host state of one resident request."""

    handle: Handle
    slot: int
    prompt: tuple[int, ...]
    max_output: int
    stop_token_ids: frozenset[int]
    message_endpoints: tuple[int, ...]
    image_spans: tuple[tuple[int, int], ...]
    needs_scores: bool
    host_stops: bool  # stop strings or output parsing on the host: rounds need feedback
    sampling: Any  # opaque to the scheduler; the engine's sampling settings
    proposal_source: str
    pages: list[int]
    admitted_ns: int
    history: ServiceHistory
    acceptance: AcceptanceHistory
    forecast: PrefixEstimate
    phase: Phase = Phase.PREFILL
    prerequisites: list[GraphKind] = dataclasses.field(default_factory=list)
    enables: Phase | None = None
    epoch: int = 0
    cached: int = 0  # prompt tokens restored from a cache (never prefilled, never charged)
    consumed: int = 0  # prompt tokens in the cache (cached + prefilled)
    output: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False
    retired: bool = False
    terminal_since_ns: int | None = None
    last_publication_ns: int | None = None
    last_selected_ns: int = -1
    inflight: list[int] = dataclasses.field(default_factory=list)  # fences with a lane of it
    capture: CaptureState = dataclasses.field(default_factory=CaptureState)
    image_windows: ImageWindows = dataclasses.field(default_factory=ImageWindows)
    generation: int = 0  # bumped when a restore binds the state to a fresh request generation
    width_limit: int | None = (
        None  # grammar or stop restrictions: target rows per round, pending token included
    )
    copy_limit: int | None = None  # host copy prefix for the next round (sources.py); None: none
    host_mask: bool = False  # samples take a host token mask (a grammar): no K-step lanes

    @property
    def rid(self) -> int:
        return self.handle.rid

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def prompt_remaining(self) -> int:
        return self.prompt_len - self.consumed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def active(self) -> bool:
        """Still selectable: not cancelled or retired, and generating or awaiting its terminal
        capture."""
        if self.cancelled or self.retired:
            return False
        return not self.finished or self.phase is Phase.TERMINAL

    @property
    def delivery_bearing(self) -> bool:
        """Decoding, or blocked on a prerequisite that enables decoding (a delivery coordinate)."""
        return self.phase is Phase.DECODE or (self.phase is Phase.BLOCKED and self.enables is Phase.DECODE)

    @property
    def needs_feedback(self) -> bool:
        """Its next round needs completion feedback of its queued rounds (host stops, or copy
        proposals drafted from what those rounds commit: ``sources.py``)."""
        return bool(self.inflight) and (self.host_stops or self.copy_limit is not None)

    @property
    def cursor(self) -> int:
        """Tokens whose KV is committed (prompt consumed plus all outputs but the pending one)."""
        return self.consumed + max(0, len(self.output) - 1)

    def next_endpoint(self) -> int | None:
        """Tokens from the cursor to the next message endpoint (None: only the prompt end)."""
        for end in self.message_endpoints:
            if end > self.consumed:
                return end - self.consumed
        return None

    def spans_from_cursor(self) -> tuple[tuple[int, int], ...]:
        return tuple((s - self.consumed, e - self.consumed) for s, e in self.image_spans if e > self.consumed)

    def commit_tokens(self, tokens: Iterable[int]) -> list[int]:
        """Append output up to the first stop token or the output limit; returns what was kept."""
        out = []
        for t in tokens:
            if len(self.output) >= self.max_output:
                break
            self.output.append(int(t))
            out.append(int(t))
            if t in self.stop_token_ids:
                self.finish_reason = "stop"
                break
        if self.finish_reason is None and len(self.output) >= self.max_output:
            self.finish_reason = "length"
        return out


def check_width_limit(width_limit: int | None) -> None:
    if width_limit is not None and (
        isinstance(width_limit, bool) or not isinstance(width_limit, int) or width_limit < 1
    ):
        raise ValueError(f"width_limit must be a positive integer or None, got {width_limit!r}")


Spans = tuple[tuple[int, int], ...]


class Admission(TypedDict):
    """A checked admission: the :class:`Request` fields set by what the client asked."""

    prompt: tuple[int, ...]
    max_output: int
    stop_token_ids: frozenset[int]
    message_endpoints: tuple[int, ...]  # sorted
    image_spans: Spans  # sorted
    needs_scores: bool
    host_stops: bool
    sampling: Any
    proposal_source: str
    width_limit: int | None
    host_mask: bool


def admission_fields(
    prompt: Sequence[int],
    max_output: int,
    *,
    max_model_len: int,
    message_endpoints: Iterable[int],
    image_spans: Iterable[tuple[int, int]],
    stop_token_ids: Iterable[int],
    needs_scores: bool,
    host_stops: bool,
    sampling: Any,
    proposal_source: str,
    width_limit: int | None,
    host_mask: bool,
) -> Admission:
    """``Scheduler.admit``'s arguments checked and normalized; raises ValueError."""
    tokens = tuple(int(t) for t in prompt)
    if not tokens:
        raise ValueError("a prompt needs at least one token")
    if any(t < 0 for t in tokens):
        raise ValueError("prompt token ids must be nonnegative")
    if max_output < 1:
        raise ValueError(f"max_output must be at least 1, got {max_output}")
    if len(tokens) + max_output > max_model_len:
        raise ValueError(
            f"prompt ({len(tokens)}) plus max_output ({max_output}) exceeds the "
            f"context of {max_model_len} tokens"
        )
    if proposal_source not in SOURCES:
        raise ValueError(f"unknown proposal source {proposal_source!r}")
    check_width_limit(width_limit)
    endpoints = tuple(sorted(int(e) for e in message_endpoints))
    if any(not 0 < e <= len(tokens) for e in endpoints):
        raise ValueError("message endpoints must lie within the prompt")
    spans = tuple(sorted((int(s), int(e)) for s, e in image_spans))
    if any(not 0 <= s < e <= len(tokens) for s, e in spans):
        raise ValueError("image spans must be nonempty and lie within the prompt")
    return Admission(
        prompt=tokens,
        max_output=int(max_output),
        stop_token_ids=frozenset(int(t) for t in stop_token_ids),
        message_endpoints=endpoints,
        image_spans=spans,
        needs_scores=bool(needs_scores),
        host_stops=bool(host_stops),
        sampling=sampling,
        proposal_source=proposal_source,
        width_limit=width_limit,
        host_mask=bool(host_mask),
    )


def pages_for(tokens: int, page_size: int) -> int:
    return max(1, math.ceil(tokens / page_size))
