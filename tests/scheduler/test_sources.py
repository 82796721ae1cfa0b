"""Proposal sources (scheduler/sources.py): an offered copy prefix bounds the request's rows,
makes its rounds wait for feedback, and the per-source estimates choose the source of a request
that may use both; each round is observed under the source that drafted it."""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.plan import PlanRejected
from helios_jax.scheduler.speculation import SOURCE_COPY, SOURCE_LEARNED, PrefixEstimate

from .helpers import SPEC
from .test_core import records, run_once, scheduler, timing

spec = pytest.mark.spec
SURE = PrefixEstimate(np.full(7, 0.99), np.full(7, 128.0), 0)  # a well-observed 0.99 acceptance
POOR = PrefixEstimate(np.full(7, 0.05), np.full(7, 128.0), 0)


def decoding(s, **admit):
    """A request admitted into the speculative catalog and run through its prefill."""
    h = s.admit([1] * 8, max_output=200, **admit)
    t = fence = 0.0
    while not s.requests[h.rid].output:
        fence += 1
        _, _, t = run_once(s, int(fence), t)
    return h, int(fence), t


def lane_rows(plan):
    return [lane.query_length or lane.ceiling for lane in plan.lanes if lane.handle is not None]


def test_an_offered_copy_prefix_bounds_the_rows_of_the_next_round():
    """A request sure of its copies (0.99) would take the widest round; offered a prefix of 2 it
    gets at most 3 target rows (D bounds the supplied prefix), and none beyond 1 without one."""
    s = scheduler(SPEC)
    h, fence, t = decoding(s, proposal_source=SOURCE_COPY, acceptance_history={SOURCE_COPY: SURE})
    plan, _, t = run_once(s, fence + 1, t, accepted=7)
    assert plan.graph.kind is GraphKind.SPECULATIVE and max(lane_rows(plan)) > 3  # unbounded: wide
    for offered, bound in ((2, 3), (0, 1), (5, 6)):
        assert s.offer_copy(h, offered) == SOURCE_COPY
        fence += 2
        plan, _, t = run_once(s, fence, t, accepted=7)
        assert plan.graph.kind is GraphKind.SPECULATIVE and max(lane_rows(plan)) == bound


def test_a_request_with_copies_waits_for_the_feedback_of_its_round():
    s = scheduler(SPEC)
    h, fence, t = decoding(s, proposal_source=SOURCE_COPY, acceptance_history={SOURCE_COPY: SURE})
    s.offer_copy(h, 3)
    plan = s.plan()
    s.commit(plan, fence + 1)
    assert s.requests[h.rid].needs_feedback
    with pytest.raises(ValueError, match="in flight"):
        s.offer_copy(h, 3)  # the prefix is drafted from what the round in flight commits
    second = s.plan()
    assert second is not None and any(lane.handle == h for lane in second.lanes)
    assert second.needs_empty_window  # the engine waits for the completion before dispatching it
    with pytest.raises(PlanRejected, match="feedback|empty window"):
        s.commit(second, fence + 2)
    s.complete(fence + 1, records(plan, accepted=3), timing(plan.expected_duration_ms or 1.0))
    assert not s.requests[h.rid].needs_feedback
    s.offer_copy(h, 3)  # after the completion: allowed


@spec("confidence-acceptance/per-source")
def test_the_source_with_more_expected_output_drafts_and_learns():
    """Both allowed: a request whose copies were accepted and whose learned drafts were not copies;
    offered no prefix, it falls back to learned proposals. Each round's observation lands in the
    estimate of the source that drafted it, never in the other."""
    s = scheduler(SPEC)
    history = {SOURCE_COPY: SURE, SOURCE_LEARNED: POOR}
    h, fence, t = decoding(s, acceptance_history=history)
    req = s.requests[h.rid]
    assert s.offer_copy(h, 4, learned=True) == SOURCE_COPY
    copy_before, learned_before = (req.acceptance.get(x).mean.copy() for x in (SOURCE_COPY, SOURCE_LEARNED))
    plan, _, t = run_once(s, fence + 1, t, accepted=0)  # every copy rejected
    assert max(lane_rows(plan)) > 1
    assert req.acceptance.get(SOURCE_COPY).mean[0] < copy_before[0]
    np.testing.assert_array_equal(req.acceptance.get(SOURCE_LEARNED).mean, learned_before)
    assert s.speculative["copy_drafts"] > 0 and s.speculative["learned_drafts"] == 0
    assert s.offer_copy(h, 0, learned=True) == SOURCE_LEARNED  # nothing to copy


def test_learned_proposals_win_when_copies_promise_less():
    s = scheduler(SPEC)
    h, _, _ = decoding(s, acceptance_history={SOURCE_COPY: POOR, SOURCE_LEARNED: SURE})
    assert s.offer_copy(h, 7, learned=True) == SOURCE_LEARNED
    assert s.requests[h.rid].proposal_source == SOURCE_LEARNED
    assert s.offer_copy(h, 7) == SOURCE_COPY  # copy only: no choice


def test_an_untried_source_is_tried_before_a_well_known_one():
    """D = 7. Learned drafts accepted at 0.7 over many rounds promise 1 + 7 x 0.7 = 5.9 tokens by
    their means (6.7 optimistically); untried copies promise 1 + 0.5 + 0.25 + ... = 2.0 by the
    prior means, but 7.6 read optimistically at weight 2, and get their round."""
    s = scheduler(SPEC)
    known = PrefixEstimate(np.full(7, 0.7), np.full(7, 128.0), 0)
    h, _, _ = decoding(s, acceptance_history={SOURCE_LEARNED: known})
    assert s.offer_copy(h, 7, learned=True) == SOURCE_COPY


def test_bad_offers_are_refused():
    s = scheduler(SPEC)
    h, _, _ = decoding(s)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            s.offer_copy(h, bad)
