"""A decoder's view behind its own queued round: output left, runnable, age and tie order."""

import math

import numpy as np
import pytest

from helios_jax.scheduler import service
from helios_jax.scheduler.core import NS_PER_MS
from helios_jax.scheduler.speculation import SOURCE_COPY
from helios_jax.scheduler.view import Phase

from .helpers import ORDINARY, SPEC
from .test_checkpoints import decoding_with_output
from .test_checkpoints import sched as checkpointing
from .test_core import records, run_once, scheduler, timing

spec = pytest.mark.spec
MS = NS_PER_MS


def _first_token_unpublished(max_output):
    """A request admitted at 2 ms whose prefill completed (its first token buffered, unpublished),
    then one decode frame of it committed and still queued."""
    s = scheduler(ORDINARY)
    s.advance_to(2 * MS)
    h = s.admit([1] * 8, max_output=max_output)
    _, gen, t = run_once(s, 1, 2.0, publish=False)
    assert gen[0].tokens and s.requests[h.rid].phase is Phase.DECODE
    s.advance_to(int(t * MS))
    queued = s.plan()
    assert queued is not None and [lane.handle for lane in queued.lanes] == [h]
    s.commit(queued, 2)
    return s, h, queued


@spec("planning-queue/limits-use-bound", "planning-queue/queued-lane-bound")
def test_a_decoder_whose_queued_round_can_end_its_output_is_not_selected_again():
    """max_output 2: the prefill's token leaves one, which the queued one-token round may take.
    The view has nothing left and is not runnable, and no plan gives the request another lane."""
    s, h, queued = _first_token_unpublished(max_output=2)
    assert queued.max_advance(queued.lanes[0]) == 1
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.output_remaining == 0 and view.runnable is False
    after = s.plan()
    assert after is None or h not in [lane.handle for lane in after.lanes]


@spec("planning-queue/limits-use-bound")
def test_a_decoder_with_output_left_after_its_queued_round_stays_runnable():
    s, h, queued = _first_token_unpublished(max_output=3)
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.output_remaining == 1 and view.runnable is True


@spec("planning-queue/projected-age")
def test_a_queued_delivery_ages_an_unpublished_stream_from_its_expected_end():
    """Nothing published yet, but a delivery queued: the projected age counts from the frame's
    expected end (the planning start here, so zero), not from admission."""
    s, h, queued = _first_token_unpublished(max_output=50)
    start = s.frames[-1].expected_end_ns
    assert start is not None and start > s.requests[h.rid].admitted_ns
    view = next(v for v in s.views(start) if v.rid == h.rid)
    assert view.age_ms == 0.0
    later = next(v for v in s.views(start + MS // 4) if v.rid == h.rid)
    assert later.age_ms == pytest.approx(0.25)


@spec("planning-queue/age-reset-published")
def test_a_fresh_decoder_ages_from_admission_below_a_millisecond():
    """A decoder never published and with nothing queued: its age is the time since admission,
    however short (a quarter of a millisecond here)."""
    s = scheduler(ORDINARY)
    s.advance_to(2 * MS)
    h = s.admit([1] * 8, max_output=50)
    run_once(s, 1, 2.0, publish=False)
    admitted = s.requests[h.rid].admitted_ns
    view = next(v for v in s.views(admitted + MS // 4) if v.rid == h.rid)
    assert view.age_ms == pytest.approx(0.25)


@spec("duration-estimates/tie-order")
def test_decoder_views_carry_when_each_was_last_selected():
    """Tied lanes rank the less recently selected request first, so each decoder's view carries
    its own last selection time."""
    s = scheduler(ORDINARY)
    a = s.admit([1] * 8, max_output=50)
    b = s.admit([2] * 8, max_output=50)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t)
    views = {v.rid: v for v in s.views()}
    for h in (a, b):
        assert views[h.rid].last_selected_ns == s.requests[h.rid].last_selected_ns >= 0


@spec("useful-service/output-price", "useful-service/delivery-price", "useful-service/decoders-only-delivery")
def test_a_decoder_view_carries_its_own_prices_mask_and_forecast():
    """After a published burst each decoder is priced from its own token and delivery histories
    (``service.log_prices``), and its view keeps its host mask and its confidence forecast."""
    s = scheduler(SPEC)
    plain = s.admit([1] * 8, max_output=50)
    masked = s.admit([2] * 8, max_output=50, host_mask=True, width_limit=1)
    t = 0.0
    for fence in range(1, 4):
        _, _, t = run_once(s, fence, t)
    views = {v.rid: v for v in s.views()}
    for h, mask in ((plain, False), (masked, True)):
        r, view = s.requests[h.rid], views[h.rid]
        assert view.phase is Phase.DECODE and r.history.log_x is not None and r.history.log_z is not None
        alone = service.log_prices(s.policy, r.history.log_x, r.history.log_z)
        prices = (view.log_prefill_price, view.log_output_price, view.log_delivery_price)
        assert prices == (alone.prefill_token, alone.output_token, alone.delivery)
        assert view.host_mask is mask
        assert view.forecast.size > 0 and np.array_equal(view.forecast, r.forecast.means())


@spec("speculative-coverage/copy-d")
def test_a_copy_prefix_bounds_a_decoders_rows_only_while_copy_is_its_source():
    """offer_copy records the supplied prefix length whichever source it chooses; the view bounds
    the next round by it (copy_limit) only when copy proposals were chosen."""
    s = scheduler(SPEC)
    h = s.admit([1] * 8, max_output=50)
    t = 0.0
    for fence in range(1, 3):
        _, _, t = run_once(s, fence, t)
    chosen = {}
    for length in (0, 3):
        source = s.offer_copy(h, length, learned=True)
        view = next(v for v in s.views() if v.rid == h.rid)
        assert s.requests[h.rid].copy_limit == min(length, s.population.depth)
        assert view.copy_limit == (s.requests[h.rid].copy_limit if source == SOURCE_COPY else None)
        chosen[length] = source
    assert chosen[0] != SOURCE_COPY  # nothing to copy: learned proposals


@spec("useful-service/decoders-only-delivery")
def test_only_delivery_bearing_requests_are_priced_for_delivery():
    """A request still prefilling has no delivery coordinate (its delivery price is -inf) while a
    decoder beside it has one, even before its first publication (the decoders' share)."""
    s = scheduler(ORDINARY)
    first = s.admit([1] * 8, max_output=50)
    run_once(s, 1, 0.0, publish=False)
    second = s.admit([2] * 300, max_output=50)
    views = {v.rid: v for v in s.views()}
    assert views[first.rid].phase is Phase.DECODE and views[second.rid].phase is Phase.PREFILL
    assert s.requests[first.rid].history.log_z is None  # unpublished: priced at the share
    assert math.isfinite(views[first.rid].log_delivery_price)
    assert views[second.rid].log_delivery_price == -math.inf


@spec("planning-queue/prefill-exposes-late", "duration-estimates/tie-order")
def test_a_prompt_with_a_chunk_in_flight_is_not_runnable_and_keeps_its_last_selection():
    """A prompt's chunk in flight makes its view unrunnable until the chunk completes; the view of
    a prompt with tokens left carries its own last selection time (tied lanes' order)."""
    s = scheduler(ORDINARY)
    h = s.admit([1] * 300, max_output=50)
    plan = s.plan()
    s.commit(plan, 1)
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.phase is Phase.PREFILL and view.runnable is False
    end = plan.expected_duration_ms or 1.0
    s.advance_to(int(end * MS))
    s.complete(1, records(plan), timing(end))
    view = next(v for v in s.views() if v.rid == h.rid)
    assert view.phase is Phase.PREFILL and view.prompt_remaining > 0 and view.runnable is True
    assert view.last_selected_ns == s.requests[h.rid].last_selected_ns >= 0


@spec("prerequisites/terminal-age-start")
def test_a_terminal_view_ages_from_its_start_below_a_millisecond():
    s = checkpointing()
    h, _ = decoding_with_output(s)
    s.preempt(h)
    since = s.requests[h.rid].terminal_since_ns
    view = next(v for v in s.views(since + MS // 4) if v.rid == h.rid)
    assert view.phase is Phase.TERMINAL and view.terminal_age_ms == pytest.approx(0.25)
