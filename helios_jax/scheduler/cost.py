"""Duration estimates (spec, "Duration estimates").

One estimate per physical program, keyed by :class:`helios_jax.catalog.CostKey` (kind, batch
capacity, token capacity, proposal depth, mixed prefill capacity, packed verification capacity);
the active row count never changes an entry's identity.

- Every estimate starts at zero, which means *indeterminate*, whatever a descriptor says.
- The first positive device observation sets the estimate. Further valid samples while the
  entry is fresh set it to the median of the last nine observations (the middle pair averaged
  for an even count).
- An entry becomes *stale* ``estimate_ttl_ns`` (30 s) after its last valid observation. A
  stale entry keeps its measured cost for ranking and normalisation; its first valid
  observation replaces the estimate directly and starts a new nine-sample window. Elapsed time
  alone never makes a measured graph unknown.
- A raw observation is the maximum positive rank-local device interval; the exposed readiness
  delay (embedding delivery) is subtracted after that aggregation. Missing or zero intervals
  neither change an estimate nor make it fresh. Host dispatch, completion delivery, polling and
  queue wait never reach this module: callers pass device intervals only.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from helios_jax.catalog import Catalog, CostKey

MEDIAN_WINDOW = 9
CHANGE_LOG = 64  # changed estimates remembered (CostModel.changed_since)


def median(samples: Sequence[float]) -> float:
    s = sorted(samples)
    n = len(s)
    if n == 0:
        raise ValueError("median of no samples")
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def raw_device_interval(device_intervals_ns: Iterable[float]) -> float:
    """The maximum positive rank-local interval, or 0.0 when no rank reported a positive one."""
    return max((float(x) for x in device_intervals_ns if x and x > 0), default=0.0)


def cost_sample(device_intervals_ns: Iterable[float], readiness_delay_ns: float = 0.0) -> float:
    """A cost sample: the raw device interval less the exposed readiness delay (0.0 if invalid)."""
    raw = raw_device_interval(device_intervals_ns)
    if raw <= 0:
        return 0.0
    if readiness_delay_ns < 0:
        raise ValueError(f"readiness delay must be nonnegative, got {readiness_delay_ns}")
    sample = raw - readiness_delay_ns
    return sample if sample > 0 else 0.0


@dataclasses.dataclass
class CostEntry:
    samples: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=MEDIAN_WINDOW)
    )
    estimate_ns: float = 0.0
    last_valid_ns: int | None = None
    last_attempt_ns: int | None = None


class CostModel:
    """Per-program duration estimates on the caller's clock (nanoseconds)."""

    def __init__(self, ttl_ns: int = 30_000_000_000):
        if ttl_ns <= 0:
            raise ValueError("estimate ttl must be positive")
        self.ttl_ns = int(ttl_ns)
        self._entries: dict[CostKey, CostEntry] = {}
        self.version = 0  # bumped whenever an estimate changes, and only then
        # (version, key) of the latest observed changes, for readers that update what they keep
        # per estimate instead of recomputing every one (changed_since).
        self._changes: collections.deque[tuple[int, CostKey]] = collections.deque(maxlen=CHANGE_LOG)
        self._oldest_epoch = 0  # bumped by an observation that may move any_stale's oldest, see there
        self._oldest: tuple[object, int, int | None] | None = None  # any_stale's, see there

    def _entry(self, key: CostKey) -> CostEntry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = CostEntry()
        return entry

    # -- queries -------------------------------------------------------------------------
    def estimate_ns(self, key: CostKey) -> float:
        """The current estimate; 0.0 means indeterminate."""
        entry = self._entries.get(key)
        return entry.estimate_ns if entry else 0.0

    def estimate_ms(self, key: CostKey) -> float | None:
        est = self.estimate_ns(key)
        return est / 1e6 if est > 0 else None

    def is_known(self, key: CostKey) -> bool:
        return self.estimate_ns(key) > 0

    def is_stale(self, key: CostKey, now_ns: int) -> bool:
        """Measured, but without a valid observation for longer than the freshness interval."""
        entry = self._entries.get(key)
        if entry is None or entry.estimate_ns <= 0 or entry.last_valid_ns is None:
            return False
        return now_ns - entry.last_valid_ns > self.ttl_ns

    def any_stale(self, programs: Sequence[Any], now_ns: int) -> bool:
        """Whether any of `programs` (objects with a ``key``) is stale (:meth:`is_stale`): the
        oldest last valid observation among the measured ones is older than the freshness
        interval. That oldest is kept for the last sequence object asked until an observation
        may move it (:meth:`_moves_oldest`), so a decision usually reads one stamp."""
        kept = self._oldest
        if kept is None or kept[0] is not programs or kept[1] != self._oldest_epoch:
            stamps = [self._valid_ns(g.key) for g in programs]
            oldest = min((t for t in stamps if t is not None), default=None)
            kept = self._oldest = (programs, self._oldest_epoch, oldest)
        return kept[2] is not None and now_ns - kept[2] > self.ttl_ns

    def _moves_oldest(self, entry: CostEntry, now_ns: int) -> bool:
        """Whether a valid observation of `entry` at `now_ns` may change the kept oldest: not
        when the entry was measured after that oldest (it was not the oldest) and the new stamp
        is no earlier than it."""
        kept = self._oldest
        if kept is None or kept[2] is None or entry.estimate_ns <= 0 or entry.last_valid_ns is None:
            return True
        return not (entry.last_valid_ns > kept[2] and now_ns >= kept[2])

    def _valid_ns(self, key: CostKey) -> int | None:
        """The last valid observation of a measured entry (None: unmeasured)."""
        entry = self._entries.get(key)
        if entry is None or entry.estimate_ns <= 0:
            return None
        return entry.last_valid_ns

    def is_fresh(self, key: CostKey, now_ns: int) -> bool:
        return self.is_known(key) and not self.is_stale(key, now_ns)

    def last_valid_ns(self, key: CostKey) -> int | None:
        entry = self._entries.get(key)
        return entry.last_valid_ns if entry else None

    def last_attempt_ns(self, key: CostKey) -> int | None:
        entry = self._entries.get(key)
        return entry.last_attempt_ns if entry else None

    def refresh_order_ns(self, key: CostKey) -> int:
        """The later of the last valid observation and the last attempted dispatch (refresh order)."""
        entry = self._entries.get(key)
        if entry is None:
            return -1
        return max(x for x in (entry.last_valid_ns, entry.last_attempt_ns, -1) if x is not None)

    def observation_age_ns(self, key: CostKey, now_ns: int) -> int | None:
        last = self.last_valid_ns(key)
        return None if last is None else now_ns - last

    def samples(self, key: CostKey) -> tuple[float, ...]:
        entry = self._entries.get(key)
        return tuple(entry.samples) if entry else ()

    def changed_since(self, version: int) -> set[CostKey] | None:
        """The keys whose estimate changed after `version`, or None when that is not known (a
        restore replaced every entry, or more changes came than the log keeps): the caller
        then reads every estimate again."""
        keys: set[CostKey] = set()
        found = 0
        for changed_at, key in reversed(self._changes):
            if changed_at <= version:
                break
            keys.add(key)
            found += 1
        return keys if found == self.version - version else None

    def keys(self) -> tuple[CostKey, ...]:
        return tuple(k for k, e in self._entries.items() if e.estimate_ns > 0)

    # -- updates -------------------------------------------------------------------------
    def observe(
        self,
        key: CostKey,
        device_intervals_ns: Iterable[float],
        now_ns: int,
        *,
        readiness_delay_ns: float = 0.0,
    ) -> bool:
        """Record one execution's device intervals. Returns whether the sample was valid."""
        sample = cost_sample(device_intervals_ns, readiness_delay_ns)
        if sample <= 0:
            return False
        entry = self._entry(key)
        before = entry.estimate_ns
        if self._moves_oldest(entry, now_ns):
            self._oldest_epoch += 1
        if entry.estimate_ns <= 0 or self.is_stale(key, now_ns):
            entry.samples.clear()
            entry.samples.append(sample)
            entry.estimate_ns = sample
        else:
            entry.samples.append(sample)
            entry.estimate_ns = median(entry.samples)
        entry.last_valid_ns = now_ns
        if entry.estimate_ns != before:  # what readers key on: an unchanged median keeps it
            self.version += 1
            self._changes.append((self.version, key))
        return True

    def note_attempt(self, key: CostKey, now_ns: int) -> None:
        """A committed dispatch of this program (advances the refresh order)."""
        self._entry(key).last_attempt_ns = now_ns

    def seed_from_catalog(self, catalog: Catalog, now_ns: int) -> int:
        """Feed each entry's ``duration_ms`` as one synthetic device observation.

        This is how a *measured* catalog is reproduced: through the ordinary observation path,
        never by trusting the descriptor field. Returns the number of entries seeded.
        """
        n = 0
        for g in catalog.graphs:
            if g.duration_ms is not None and self.observe(g.key, [g.duration_ms * 1e6], now_ns):
                n += 1
        return n

    def seed_samples(self, samples: Mapping[CostKey, Sequence[float]], now_ns: int) -> int:
        """Observe each of `samples` (ms per cost key, several per program: a measurement of the
        prepared programs before serving) as one device interval, in order, so that an entry's
        estimate is their median, as the ordinary path forms it. Returns the number of entries
        with at least one valid sample."""
        n = 0
        for key, times in samples.items():
            valid = [self.observe(key, [ms * 1e6], now_ns) for ms in times]
            n += any(valid)
        return n

    def snapshot(self) -> dict:
        """A deep copy of the entries (for rollback and tests)."""
        return {
            k: dataclasses.replace(e, samples=collections.deque(e.samples, maxlen=MEDIAN_WINDOW))
            for k, e in self._entries.items()
        }

    def restore(self, snap: dict) -> None:
        self._entries = snap
        self.version += 1
        self._oldest_epoch += 1
