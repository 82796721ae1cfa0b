"""The pricing module's small reads: which residents are runnable, and which decoder a waiting
request would preempt (``pricing.runnable``, ``pricing.best_served``)."""

from types import SimpleNamespace

from helios_jax.scheduler import pricing
from helios_jax.scheduler.core import NS_PER_MS
from helios_jax.scheduler.service import ServiceHistory
from helios_jax.scheduler.view import Phase

from .helpers import ORDINARY
from .test_core import records, scheduler, timing


def test_runnable_is_active_with_no_prompt_prerequisite_or_snapshot_in_flight():
    """A prompt is runnable until its chunk is in flight; a decoder stays runnable with its own
    round queued (a second frame may follow it); a cancelled request is not runnable."""
    s = scheduler(ORDINARY)
    h = s.admit([1] * 8, max_output=50)
    req = s.requests[h.rid]
    assert req.phase is Phase.PREFILL and pricing.runnable(req)
    prefill = s.plan()
    s.commit(prefill, 1)
    assert req.inflight and not pricing.runnable(req)
    s.advance_to(int(prefill.expected_duration_ms * NS_PER_MS))
    s.complete(1, records(prefill), timing(prefill.expected_duration_ms))
    decode = s.plan()
    s.commit(decode, 2)
    assert req.phase is Phase.DECODE and req.inflight and pricing.runnable(req)
    s.cancel(h)
    assert not req.active and not pricing.runnable(req)


def _resident(rid, *, phase=Phase.DECODE, pages=2, log_x=0.0, admitted_ns=0, active=True):
    return SimpleNamespace(
        active=active,
        phase=phase,
        pages=[0] * pages,
        history=ServiceHistory(log_x=log_x),
        admitted_ns=admitted_ns,
        handle=rid,
    )


def _served(*residents, free=0, needed=3):
    return pricing.best_served({r.handle: r for r in residents}, free, needed)


def test_the_best_served_decoder_is_one_whose_pages_would_make_room():
    """Only an active decoder counts, and only when its pages and the free ones reach the need
    (an exact fit does); with none, there is no candidate."""
    assert _served(_resident(1, pages=2), free=0, needed=3) is None  # too small
    assert _served(_resident(1, pages=2), free=1, needed=3) == 1  # exactly enough
    assert _served(_resident(1, pages=9, phase=Phase.PREFILL), _resident(2, pages=1)) is None
    assert _served(_resident(1, pages=9, active=False)) is None


def test_the_best_served_decoder_has_the_highest_token_rate_then_the_earliest_admission():
    """A decoder never served (no token history) is the worst served, so never preferred to a
    served one; equal rates go to the earliest admitted, then to the larger handle."""
    assert _served(_resident(1, pages=3, log_x=None), _resident(2, pages=3, log_x=-5.0)) == 2
    assert _served(_resident(1, pages=3, log_x=-1.0), _resident(2, pages=3, log_x=-2.0)) == 1
    tied = (_resident(1, pages=3, admitted_ns=5), _resident(2, pages=3, admitted_ns=9))
    assert _served(*tied) == 1
    assert _served(*reversed(tied)) == 1
    assert _served(_resident(1, pages=3), _resident(2, pages=3)) == 2
