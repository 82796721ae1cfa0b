"""Exploration budgets: timing-refresh and acceptance-learning credit (spec, "Funded timing
refresh", "Funded acceptance learning"; RESOLUTIONS.md, 1 and 3).

Each ordinary valid completion earns a share of its credited execution time into two separate
ledgers, each capped at 5 ms of balance:

    timing refresh        0.002 / 0.998  of credited time   (full after 2,495 ms)
    acceptance learning   0.01  / 0.99   of credited time   (full after   495 ms)

Credited time is the maximum positive device interval for a queued execution and the larger of
that and the wall interval for an isolated one (raw physical time: readiness stalls included).
Discovery, refresh and probe executions earn nothing. An episode may start only at full credit;
it pays its actual interval once, even into debt, and the next episode waits for full credit
again. Idle discards positive credit and preserves debt. Together these bound the aggregate
expense: refresh time <= 0.002/0.998 * ordinary time + one episode's duration (and likewise for
probes), however long a single nonpreemptible episode runs.
"""

from __future__ import annotations

import dataclasses

from helios_jax.scheduler.plan import ExecutionClass

CREDIT_CAP_MS = 5.0
TIMING_RATE = 0.002 / 0.998
ACCEPTANCE_RATE = 0.01 / 0.99


@dataclasses.dataclass
class Ledger:
    rate: float
    cap_ms: float = CREDIT_CAP_MS
    balance_ms: float = 0.0
    episode_active: bool = False
    earned_from_ms: float = 0.0  # total credited ordinary time (for bounds and reporting)
    spent_ms: float = 0.0  # total episode expense

    @property
    def full(self) -> bool:
        return self.balance_ms >= self.cap_ms - 1e-12

    def can_start(self) -> bool:
        return self.full and not self.episode_active

    def earn(self, credited_ms: float) -> None:
        """An ordinary valid completion of `credited_ms` of raw physical time."""
        if credited_ms <= 0:
            return
        self.earned_from_ms += credited_ms
        if self.balance_ms < self.cap_ms:
            self.balance_ms = min(self.cap_ms, self.balance_ms + self.rate * credited_ms)

    def start(self) -> float:
        """Open an episode (at commit); returns the credit that funded it."""
        if not self.can_start():
            raise ValueError("an exploration episode needs full credit and no open episode")
        self.episode_active = True
        return self.balance_ms

    def close(self, paid_ms: float) -> None:
        """The episode's execution completed (or was abandoned): pay its interval once."""
        if not self.episode_active:
            raise ValueError("no exploration episode is open")
        self.episode_active = False
        self.balance_ms -= max(0.0, paid_ms)
        self.spent_ms += max(0.0, paid_ms)

    def idle(self) -> None:
        """Idle discards positive credit and preserves debt."""
        if self.balance_ms > 0:
            self.balance_ms = 0.0

    def copy(self) -> Ledger:
        return dataclasses.replace(self)


def timing_ledger() -> Ledger:
    return Ledger(TIMING_RATE)


def acceptance_ledger() -> Ledger:
    return Ledger(ACCEPTANCE_RATE)


def funding_ledger(reason: ExecutionClass, timing: Ledger, acceptance: Ledger) -> Ledger | None:
    """The ledger that funds an execution of class `reason`: the timing ledger a refresh, the
    acceptance ledger a probe; None for ordinary work and discovery."""
    return {
        ExecutionClass.TIMING_REFRESH: timing,
        ExecutionClass.ACCEPTANCE_LEARNING: acceptance,
    }.get(reason)


def settle(
    reason: ExecutionClass,
    timing: Ledger,
    acceptance: Ledger,
    *,
    raw_ms: float,
    credited_ms: float,
    valid_timing: bool,
) -> None:
    """One completed execution on the ledgers (raw physical time; never both for one execution):
    a valid ordinary execution earns `raw_ms` into both, a refresh or probe pays `credited_ms`
    once into the ledger that funded it."""
    if reason is ExecutionClass.ORDINARY and valid_timing:
        timing.earn(raw_ms)
        acceptance.earn(raw_ms)
        return
    ledger = funding_ledger(reason, timing, acceptance)
    if ledger is not None:
        ledger.close(credited_ms)
