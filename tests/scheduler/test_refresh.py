"""Exploration ledgers (refresh.py): earning, the 5 ms cap, episodes paid once, idle and debt."""

import pytest

from helios_jax.scheduler.refresh import (
    ACCEPTANCE_RATE,
    CREDIT_CAP_MS,
    TIMING_RATE,
    Ledger,
    acceptance_ledger,
    timing_ledger,
)

spec = pytest.mark.spec


@spec(
    "timing-refresh/earn-rate",
    "timing-refresh/credit-cap",
    "timing-refresh/first-2495ms",
    "acceptance-learning/earn-rate",
    "acceptance-learning/credit-cap",
)
def test_ledgers_earn_their_share_up_to_five_ms():
    timing, acceptance = timing_ledger(), acceptance_ledger()
    assert (timing.rate, acceptance.rate) == (TIMING_RATE, ACCEPTANCE_RATE) == (0.002 / 0.998, 0.01 / 0.99)
    assert timing.cap_ms == acceptance.cap_ms == CREDIT_CAP_MS == 5.0
    timing.earn(998.0)
    assert timing.balance_ms == pytest.approx(2.0) and not timing.full and not timing.can_start()
    timing.earn(1497.0)  # 2,495 ms of ordinary time in all: exactly full
    assert timing.balance_ms == pytest.approx(5.0) and timing.full and timing.can_start()
    timing.earn(1000.0)
    assert timing.balance_ms == 5.0  # capped
    assert timing.earned_from_ms == pytest.approx(3495.0)  # the ordinary time is still counted
    acceptance.earn(494.0)
    assert not acceptance.full
    acceptance.earn(1.0)  # 495 ms
    assert acceptance.full and acceptance.balance_ms == pytest.approx(5.0)


def test_invalid_intervals_earn_nothing():
    ledger = timing_ledger()
    ledger.earn(0.0)
    ledger.earn(-3.0)
    assert ledger.balance_ms == 0.0 and ledger.earned_from_ms == 0.0


@spec(
    "timing-refresh/next-needs-full",
    "acceptance-learning/started-debt",
    "acceptance-learning/next-needs-full",
    "acceptance-learning/one-episode",
    "timing-refresh/speculative-pays-once",
    "acceptance-learning/pays-interval",
)
def test_an_episode_needs_full_credit_and_pays_its_interval_once_into_debt():
    ledger = acceptance_ledger()
    with pytest.raises(ValueError):
        ledger.start()  # not full
    ledger.earn(495.0)
    assert ledger.start() == pytest.approx(5.0)  # the credit that funded it
    assert ledger.episode_active and not ledger.can_start()  # one episode at a time
    with pytest.raises(ValueError):
        ledger.start()
    ledger.earn(1000.0)
    assert ledger.full and not ledger.can_start()
    ledger.close(12.0)  # a nonpreemptible episode overran its credit: debt
    assert not ledger.episode_active
    assert ledger.balance_ms == pytest.approx(-7.0) and ledger.spent_ms == pytest.approx(12.0)
    with pytest.raises(ValueError):
        ledger.close(1.0)  # paid once: no episode is open any more
    ledger.earn(990.0)  # +10 ms of credit, from -7 ms
    assert ledger.balance_ms == pytest.approx(3.0) and not ledger.can_start()
    ledger.earn(1000.0)
    assert ledger.can_start()
    ledger.start()
    ledger.close(-1.0)  # an invalid interval pays nothing
    assert ledger.balance_ms == pytest.approx(5.0) and ledger.spent_ms == pytest.approx(12.0)


@spec("timing-refresh/idle-discards", "acceptance-learning/idle-clears")
def test_idle_discards_positive_credit_and_preserves_debt():
    ledger = timing_ledger()
    ledger.earn(1000.0)
    ledger.idle()
    assert ledger.balance_ms == 0.0
    debt = Ledger(TIMING_RATE, balance_ms=-2.5)
    debt.idle()
    assert debt.balance_ms == -2.5


def test_copies_are_independent():
    ledger = timing_ledger()
    ledger.earn(100.0)
    copy = ledger.copy()
    copy.earn(100.0)
    assert copy.balance_ms == pytest.approx(2 * ledger.balance_ms) and copy.rate == ledger.rate
