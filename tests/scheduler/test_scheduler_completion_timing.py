"""Completion timing rule by rule: fence order, measured intervals, service history and credit.

A completion is measured when some rank reports a positive device interval. Its service interval
is the device interval when the frame ran queued, else max(device, wall); that interval updates
the participants' service history (x <- a*x + (1 - a)*s/dt, a = exp(-dt/tau)) whenever it is a
positive number of milliseconds, and it is the time the execution counters and the exploration
ledgers are credited. A completion without a device interval records no service interval and is
credited its wall time.
"""

import math
import re

import pytest

from helios_jax.scheduler.core import NS_PER_MS
from helios_jax.scheduler.plan import ExecutionClass, ExecutionTiming

from .test_core import decode_frame_in_flight, records, two_decoders

MS = NS_PER_MS


def one_decoder():
    """A scheduler with one request past its prefill (first burst published) and its next
    ordinary decode plan committed as fence 2: (scheduler, request, plan)."""
    s, t, plan = decode_frame_in_flight()
    assert plan.reason is ExecutionClass.ORDINARY and len(plan.lanes) == 1
    s.advance_to(int((t + 5) * MS))
    return s, s.requests[plan.lanes[0].handle.rid], plan


def updated_rate(log_rate: float, served: float, dt_ms: float) -> float:
    """a*r + (1 - a)*s/dt with a = exp(-dt/tau) (PolicyConfig's default tau = 100 ms)."""
    a = math.exp(-dt_ms / 100.0)
    return a * math.exp(log_rate) + (1 - a) * served / dt_ms


def test_an_out_of_order_completion_names_the_oldest_fence_in_flight():
    """Two frames in flight (fences 7 and 8): completing 8 first is refused with a ValueError that
    names fence 7, the only fence that may complete next, and changes nothing; in order both
    complete, after which nothing is in flight (None)."""
    s, t = two_decoders()
    s.advance_to(int(t * MS))
    first = s.plan()
    s.commit(first, 7)
    second = s.plan()
    s.commit(second, 8)
    assert [f.fence for f in s.frames] == [7, 8]
    message = "completion for fence 8, but the oldest frame in flight is 7"
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        s.complete(8, records(second), ExecutionTiming((2.0 * MS,), 2.0 * MS))
    assert [f.fence for f in s.frames] == [7, 8]  # refused before anything changed
    s.advance_to(int((t + 10) * MS))
    s.complete(7, records(first), ExecutionTiming((2.0 * MS,), 2.0 * MS))
    with pytest.raises(ValueError, match="oldest frame in flight is 8$"):
        s.complete(9, records(second), ExecutionTiming((2.0 * MS,), 2.0 * MS))
    s.complete(8, records(second), ExecutionTiming((2.0 * MS,), 2.0 * MS, queued=True))
    with pytest.raises(ValueError, match="oldest frame in flight is None$"):
        s.complete(8, records(second), ExecutionTiming((2.0 * MS,), 2.0 * MS))


def test_a_one_nanosecond_device_interval_is_a_measured_interval():
    """Any positive device interval makes the completion measured: an isolated frame with a 1 ns
    device interval and 3 ms of wall time serves its one token over max(1 ns, 3 ms) = 3 ms, and
    its publication replaces that interval's zero-delivery update with one delivery."""
    s, req, plan = one_decoder()
    x0, z0 = req.history.log_x, req.history.log_z
    assert x0 is not None and z0 is not None
    gen = s.complete(2, records(plan), ExecutionTiming((1.0,), 3.0 * MS))
    assert [len(g.tokens) for g in gen] == [1]
    assert math.exp(req.history.log_x) == pytest.approx(updated_rate(x0, 1.0, 3.0))
    assert math.exp(req.history.log_z) == pytest.approx(updated_rate(z0, 0.0, 3.0))
    s.published_output(req.handle, 2)
    assert math.exp(req.history.log_z) == pytest.approx(updated_rate(z0, 1.0, 3.0))


def test_a_queued_sub_millisecond_interval_is_recorded_and_credited():
    """A queued frame whose device interval is 0.5 ms (5 ms of wall time behind its predecessor):
    its service interval is the 0.5 ms device interval, shorter than a millisecond but still one
    measured interval of service history, and the ordinary execution is credited those 0.5 ms
    (execution counters and both exploration ledgers), not the wall time."""
    s, req, plan = one_decoder()
    x0 = req.history.log_x
    ns0 = s.execution_ns["ordinary"]
    earned0 = (s.timing_ledger.earned_from_ms, s.acceptance_ledger.earned_from_ms)
    s.complete(2, records(plan), ExecutionTiming((0.5 * MS,), 5.0 * MS, queued=True))
    assert math.exp(req.history.log_x) == pytest.approx(updated_rate(x0, 1.0, 0.5))
    assert s.execution_ns["ordinary"] - ns0 == int(0.5 * MS)
    earned = (s.timing_ledger.earned_from_ms, s.acceptance_ledger.earned_from_ms)
    assert earned == pytest.approx((earned0[0] + 0.5, earned0[1] + 0.5))


def test_a_completion_without_device_interval_is_credited_its_wall_time():
    """A queued frame with no device interval (0 on every rank) and 5 ms of wall time: it commits
    its token, records no service interval (token and delivery history unchanged, also after its
    publication), earns no exploration credit, and its execution counter is credited the wall
    time, 5 ms, rather than the (zero) queued device interval."""
    s, req, plan = one_decoder()
    before = (req.history.log_x, req.history.log_z)
    ns0 = s.execution_ns["ordinary"]
    earned0 = (s.timing_ledger.earned_from_ms, s.acceptance_ledger.earned_from_ms)
    gen = s.complete(2, records(plan), ExecutionTiming((0.0,), 5.0 * MS, queued=True))
    assert [len(g.tokens) for g in gen] == [1]
    assert (req.history.log_x, req.history.log_z) == before
    s.published_output(req.handle, 2)
    assert (req.history.log_x, req.history.log_z) == before
    assert s.execution_ns["ordinary"] - ns0 == 5 * MS
    assert (s.timing_ledger.earned_from_ms, s.acceptance_ledger.earned_from_ms) == earned0


def test_a_device_interval_below_millisecond_resolution_records_no_service_interval():
    """A positive device interval too small to be represented in milliseconds (the smallest
    double, queued, so the service interval is 0.0 ms) is measured but adds no service interval:
    service updates need a positive interval, so the completion commits its token and leaves the
    token and delivery histories unchanged, also after its publication, as a frame without a
    device interval does."""
    s, req, plan = one_decoder()
    x0 = req.history.log_x
    tiny = 5e-324
    assert tiny > 0 and tiny / NS_PER_MS == 0.0
    gen = s.complete(2, records(plan), ExecutionTiming((tiny,), 5.0 * MS, queued=True))
    assert [len(g.tokens) for g in gen] == [1]
    assert req.history.log_x == x0
    assert not s.frames
    z0 = req.history.log_z
    s.published_output(req.handle, 2)  # raised "service interval must be positive" before
    assert (req.history.log_x, req.history.log_z) == (x0, z0)
