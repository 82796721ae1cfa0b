"""Proposal sources (scheduler/sources.py): an offered copy prefix bounds the request's rows,
makes its rounds wait for feedback, and the per-source estimates choose the source of a request
that may use both; each round is observed under the source that drafted it."""

from types import SimpleNamespace

import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.plan import PlanRejected
from helios_jax.scheduler.sources import choose_source
from helios_jax.scheduler.speculation import (
    SOURCE_COPY,
    SOURCE_LEARNED,
    AcceptanceHistory,
    PopulationPrior,
    PrefixEstimate,
)

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


# choose_source read directly: copy when 1 + sum(u_copy[:k]) >= 1 + sum(u_learned[:D]) on the
# optimistic estimates (module docstring). A weight of 1e6 makes the optimism bonus negligible
# (about 0.001), so each case below is decided by the means it names.
D = 7


def _known(mean, depth=D):
    return PrefixEstimate(np.full(depth, mean), np.full(depth, 1e6), 0)


def _choose(copy, learned, length, *, depth=D, alpha=1.0, pools=None):
    history = AcceptanceHistory({}, 0)
    history.estimates = {SOURCE_COPY: copy, SOURCE_LEARNED: learned}
    req = SimpleNamespace(output=[], acceptance=history)
    pool = pools or {SOURCE_COPY: _known(0.5), SOURCE_LEARNED: _known(0.5)}
    return choose_source(req, SimpleNamespace(acceptance_pools=pool), length, depth, alpha)


def test_no_offered_prefix_means_learned_proposals_whatever_the_estimates():
    """Offered nothing (length 0), the round is learned, even where learned proposals promise no
    more than the pending token (D = 0, or survivals that vanish under alpha)."""
    assert _choose(_known(0.99), _known(0.05), 0) == SOURCE_LEARNED
    assert _choose(_known(0.99, 0), _known(0.05, 0), 0, depth=0) == SOURCE_LEARNED
    assert _choose(_known(0.99), _known(0.05), 0, alpha=1000.0) == SOURCE_LEARNED


def test_a_one_token_copy_prefix_counts_exactly_one_copied_token():
    """k = 1: copy promises 1 + u_copy[0] = 2.0; learned at 0.05 promises 1.35, at 0.2 2.4."""
    assert _choose(_known(0.999), _known(0.05), 1) == SOURCE_COPY
    assert _choose(_known(0.999), _known(0.2), 1) == SOURCE_LEARNED


def test_learned_proposals_count_all_d_and_no_more():
    """k = D = 7: learned at 0.65 promises 5.55 against copy's 5.2 at 0.6 (its last proposals
    decide); an estimate deeper than D still counts only u_learned[:D] (0.7: 5.9 < 6.04)."""
    assert _choose(_known(0.6), _known(0.65), D) == SOURCE_LEARNED
    assert _choose(_known(0.72), _known(0.7, depth=D + 2), D) == SOURCE_COPY


def test_alpha_applies_to_both_sources():
    """E = 1 + sum(u ** alpha) on both sides: at alpha = 2, 0.8 beats 0.7 whichever source has it
    (read without alpha on one side, 0.7 would beat 0.8 ** 2 = 0.64)."""
    assert _choose(_known(0.7), _known(0.8), D, alpha=2.0) == SOURCE_LEARNED
    assert _choose(_known(0.8), _known(0.7), D, alpha=2.0) == SOURCE_COPY


def test_equal_promises_go_to_copy():
    assert _choose(_known(0.6), _known(0.6), D) == SOURCE_COPY


def test_an_untried_source_is_read_through_the_population_pool_of_that_source():
    """Both estimates at the prior: the starting share is read from each source's own pool
    (pooled like selection reads them), so a pool that has seen copies rejected, or learned
    proposals accepted, decides, where the plain priors would tie (and go to copy)."""
    priors = {s: PopulationPrior(D) for s in (SOURCE_COPY, SOURCE_LEARNED)}

    def untried():
        h = AcceptanceHistory(priors)
        return h.get(SOURCE_COPY), h.get(SOURCE_LEARNED)

    neutral = PrefixEstimate.from_prior(PopulationPrior(D).mean)
    copies_rejected = {SOURCE_COPY: _known(0.05), SOURCE_LEARNED: neutral}
    assert _choose(*untried(), D, pools=copies_rejected) == SOURCE_LEARNED
    learned_accepted = {SOURCE_COPY: neutral, SOURCE_LEARNED: _known(0.95)}
    assert _choose(*untried(), D, pools=learned_accepted) == SOURCE_LEARNED
