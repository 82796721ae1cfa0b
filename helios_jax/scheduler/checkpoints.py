"""Checkpoint retention: snapshot rows, the prefix cache, capture allowances, guards and victims
(spec, "Planning and the execution queue", checkpoint paragraphs; "Prerequisites and completion").

A snapshot row holds the exact state of a request at a token endpoint (the KV of that prefix and
the per-request state). Rows serve three purposes:

- **conversation anchors**: the last eligible completed message of a prompt (the prompt end when
  there is none). A later request whose prompt extends that prefix restores it instead of
  prefilling it and is charged only its uncached tokens;
- **extra captures**: earlier message endpoints in reverse order, then a distinct prompt end,
  each costing an additional prefill split and a snapshot copy, admitted only while they fit the
  request-local allowance ``checkpoint_extra_work_fraction`` x estimated uncached prefill work
  (unknown costs allow no extras but keep the anchor);
- **terminal captures**: the whole conversation at a response's end, funded by the same
  fraction of the request's measured productive decode time;

plus the **private window rows** of multi-window image requests (never published, never shared).

Allocation is global and alias-aware: a prefix already stored is never captured twice. When no
row is free an eligible victim is evicted: not pinned (an armed destination or an in-flight
restore keeps its row through completion and cancellation), not a private window row; victims
rank by role (extras first, then anchors, then terminal captures), then least recent demand, then
shorter endpoint. A guard reserves a free row for a request's later anchor until a capture fills
it: optional captures of other requests never take it (they evict a victim instead), and
mandatory execution (a window snapshot) may revoke it while it is unused.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence


class Role(enum.IntEnum):
    """Eviction rank: lower roles are evicted first."""

    EXTRA = 0
    ANCHOR = 1
    TERMINAL = 2
    WINDOW = 3  # private multi-window state: never a victim, never published


@dataclasses.dataclass
class Checkpoint:
    row: int
    tokens: tuple[int, ...]  # the exact prefix whose state the row holds (or will hold)
    role: Role
    owner: int  # the request that captured it
    last_demand_ns: int
    ready: bool = False  # the snapshot completed
    pins: int = 0  # armed destination or in-flight restores

    @property
    def length(self) -> int:
        return len(self.tokens)


class CheckpointStore:
    """Snapshot rows and the prefix index over them."""

    def __init__(self, rows: int):
        if rows < 0:
            raise ValueError("snapshot rows must be nonnegative")
        self.size = rows
        self._free = list(range(rows - 1, -1, -1))
        self.entries: dict[int, Checkpoint] = {}
        self.guards: dict[int, int] = {}  # row -> request whose later anchor it protects

    # -- queries ---------------------------------------------------------------------------
    @property
    def free_rows(self) -> int:
        return len(self._free)

    def lookup(self, prompt: Sequence[int]) -> Checkpoint | None:
        """The longest ready, published checkpoint whose tokens are a proper prefix of `prompt`."""
        best = None
        prompt = tuple(prompt)
        for cp in self.entries.values():
            if (
                cp.ready
                and cp.role is not Role.WINDOW
                and cp.length < len(prompt)
                and prompt[: cp.length] == cp.tokens
                and (best is None or cp.length > best.length)
            ):
                best = cp
        return best

    def holds(self, tokens: Sequence[int]) -> bool:
        """Alias check: the prefix is already stored (or being captured)."""
        tokens = tuple(tokens)
        return any(cp.tokens == tokens and cp.role is not Role.WINDOW for cp in self.entries.values())

    def obtainable(self, owner: int, *, mandatory: bool = False, role: Role | None = None) -> bool:
        return self._pick(owner, mandatory, role) is not None

    def victims(self, owner: int, *, role: Role | None = None) -> list[int]:
        """Eligible victim rows in eviction order. A terminal capture never evicts its own
        request's anchors: a chat's next turn extends the anchor, not the terminal state
        (RESOLUTIONS.md, 34). No victim is guarded: a guard reserves a free row and ends when a
        capture fills it (:meth:`guard`, :meth:`arm`), so it never covers a held checkpoint."""
        out = []
        for cp in self.entries.values():
            if cp.pins or cp.role is Role.WINDOW or not cp.ready:
                continue
            if role is Role.TERMINAL and cp.role is Role.ANCHOR and cp.owner == owner:
                continue
            out.append(cp)
        out.sort(key=lambda cp: (cp.role, cp.last_demand_ns, cp.length))
        return [cp.row for cp in out]

    def _pick(self, owner: int, mandatory: bool, role: Role | None = None) -> int | None:
        """A destination row: the owner's guarded row (never for its own earlier optional
        captures, which the guard protects the later anchor from), a free unguarded row, an
        unused guard when mandatory, or the first eligible victim."""
        guarded_for_me = [r for r, o in self.guards.items() if o == owner and r not in self.entries]
        if guarded_for_me and role is not Role.EXTRA:
            return guarded_for_me[0]
        unguarded_free = [r for r in self._free if r not in self.guards]
        if unguarded_free:
            return unguarded_free[-1]
        if mandatory:
            revocable = [r for r in self._free if r in self.guards]  # an unused guard
            if revocable:
                return revocable[-1]
        victims = self.victims(owner, role=role)
        return victims[0] if victims else None

    # -- updates ---------------------------------------------------------------------------
    def guard(self, owner: int) -> int | None:
        """Reserve a free row for `owner`'s later anchor (None when no free unguarded row)."""
        free = [r for r in self._free if r not in self.guards]
        if not free:
            return None
        row = free[-1]
        self.guards[row] = owner
        return row

    def release_guards(self, owner: int) -> None:
        for row in [r for r, o in self.guards.items() if o == owner]:
            del self.guards[row]

    def arm(
        self, owner: int, tokens: Sequence[int], role: Role, now_ns: int, *, mandatory: bool = False
    ) -> int:
        """Obtain a destination row for a capture (evicting a victim if needed) and pin it."""
        row = self._pick(owner, mandatory, role)
        if row is None:
            raise LookupError("no snapshot row is obtainable")
        if row in self.entries:  # evict the victim (never guarded: see victims)
            del self.entries[row]
        else:  # a free row, guarded (the owner's, or revoked by mandatory execution) or not
            self._free.remove(row)
            self.guards.pop(row, None)
        self.entries[row] = Checkpoint(row, tuple(tokens), role, owner, now_ns, ready=False, pins=1)
        return row

    def captured(self, row: int, now_ns: int) -> None:
        """The snapshot into `row` completed: the checkpoint is ready (published unless private)."""
        cp = self.entries[row]
        cp.ready = True
        cp.pins -= 1
        cp.last_demand_ns = now_ns

    def abandon(self, row: int) -> None:
        """A capture that will not happen (skipped copy, or cancelled before dispatch)."""
        cp = self.entries.pop(row)
        del cp
        self._free.append(row)

    def pin(self, row: int, now_ns: int) -> None:
        """An in-flight restore reads `row`."""
        cp = self.entries[row]
        cp.pins += 1
        cp.last_demand_ns = now_ns

    def unpin(self, row: int) -> None:
        cp = self.entries.get(row)
        if cp is not None:
            cp.pins -= 1

    def drop(self, row: int) -> None:
        """Free a private row (a multi-window request's window state after its last use)."""
        cp = self.entries.get(row)
        if cp is not None and cp.pins <= 0:
            del self.entries[row]
            self._free.append(row)

    def release_private(self, row: int) -> None:
        """Return a multi-window request's private row once the request has drained."""
        cp = self.entries.pop(row, None)
        if cp is not None:
            self._free.append(row)

    def owned_rows(self) -> dict[int, int]:
        return {row: cp.owner for row, cp in self.entries.items()}


def capture_endpoints(endpoints: Sequence[int], prompt_len: int, cached: int) -> tuple[int | None, list[int]]:
    """(anchor, extras in priority order) among a prompt's exact message endpoints.

    The last eligible completed message is the anchor; the prompt end substitutes when there is
    no eligible message. Extras: earlier messages in reverse order, then a distinct prompt end.
    Eligible endpoints lie strictly beyond the cached prefix.
    """
    messages = sorted({e for e in endpoints if cached < e <= prompt_len})
    if not messages:
        return (prompt_len if prompt_len > cached else None), []
    anchor = messages[-1]
    extras = list(reversed(messages[:-1])) + ([prompt_len] if anchor != prompt_len else [])
    return anchor, extras
