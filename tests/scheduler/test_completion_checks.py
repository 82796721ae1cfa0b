"""What a completion and a commit are checked against, at their edges.

``plan.validate_completion`` refuses a report before anything changes; ``plan.check_commit``
refuses a saved plan whose requests moved on. These tests hold the edges the broader lifecycle
tests (test_core.py, test_multistep.py) leave open: a K-step lane's token counts and the fields it
must leave empty, timing values that are not finite, sidecars of the wrong slot count or with a
missing or not-a-number value, survival rows of the wrong shape or at exactly one, a device lane
offering more proposals than its ceiling allows, the location an error names, a saved plan whose
request has retired, and the bounds ``ScheduledPlan.max_advance`` and
``Request.commit_tokens`` enforce.
"""

import dataclasses
import math

import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler.core import PlanRejected, Scheduler
from helios_jax.scheduler.frames import planning_start_ns
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming, PlanLane
from helios_jax.scheduler.view import LaneRole

from .helpers import ORDINARY, RAGGED, SPEC, TIMING, burst_records, first_generation_plan
from .test_core import (
    MS,
    _device_only,
    _sidecar,
    _survival,
    decode_frame_in_flight,
    records,
    run_once,
    scheduler,
    snapshot,
    timing,
)

spec = pytest.mark.spec


def _k_step_plan(k: int, **kw):
    """(scheduler, the first K-step decode plan committed as its fence, that fence): one request
    (output limit 6, one token out after its prompt) on the ordinary catalog with K-step programs
    measured at 0.3 of K single steps."""
    s, plan, fence = first_generation_plan(with_decode_steps(ORDINARY, (k,), 0.3), GraphKind.DECODE, **kw)
    assert plan.graph.steps == k
    s.commit(plan, fence)
    return s, plan, fence


@spec("service-accounting/validate-first", "useful-service/output-progress")
def test_a_two_step_lane_commits_two_tokens():
    """Two steps are a K-step program (K > 1): its lane commits both tokens in one completion,
    and its bound on the request's progress is its two steps."""
    s, plan, fence = _k_step_plan(2)
    (lane,) = plan.lanes
    assert lane.ceiling == 2 and plan.max_advance(lane) == 2
    (gen,) = s.complete(fence, burst_records(plan, (1, 2)), TIMING)
    assert gen.tokens == (1, 2)


@spec("service-accounting/validate-first", "useful-service/output-progress")
def test_a_k_step_lane_that_stops_at_its_first_step_commits_one_token():
    """A K-step lane stops after the step that emits a stop token, so one token is a whole
    report; no token at all, proposals offered or accepted, or prompt tokens are refused before
    anything changes, and each refusal names the fence and the lane."""
    s, plan, fence = _k_step_plan(8, stop_token_ids=(7,))
    (lane,) = plan.lanes
    before = snapshot(s)
    bad = [
        CompletionRecord(lane.handle, lane.epoch, tokens=()),
        CompletionRecord(lane.handle, lane.epoch, tokens=(7,), offered=1),
        CompletionRecord(lane.handle, lane.epoch, tokens=(7,), accepted=1),
        CompletionRecord(lane.handle, lane.epoch, tokens=(7,), prompt_tokens=1),
    ]
    for record in bad:
        with pytest.raises(ValueError, match=rf"^fence {fence} lane 0 \("):
            s.complete(fence, [record], TIMING)
        assert snapshot(s) == before
    (gen,) = s.complete(fence, burst_records(plan, (7,)), TIMING)
    assert gen.tokens == (7,) and gen.finish_reason == "stop"


@spec("service-accounting/validate-first")
@pytest.mark.parametrize("device_ms", [math.inf, -1.0], ids=["infinite", "negative"])
def test_timing_that_is_not_finite_and_nonnegative_is_refused(device_ms):
    """A device interval of infinity or below zero is no measurement: the report is refused
    before anything changes, and the same report with a real interval lands."""
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    plan = s.plan()
    s.commit(plan, 1)
    before = snapshot(s)
    with pytest.raises(ValueError, match="finite and nonnegative"):
        s.complete(1, records(plan), ExecutionTiming((device_ms * MS,), 5.0 * MS))
    assert snapshot(s) == before
    assert len(s.complete(1, records(plan), timing(5.0))) == 1


def _packed_round(width_limits=(None, None, None, None), catalog=None):
    """Four decoders (their width limits) on device-allocated speculative programs (`catalog`,
    by default ragged-small's), their first packed round committed as fence 5: (scheduler, plan)."""
    s = scheduler(catalog or _device_only())
    for w in width_limits:
        s.admit([1] * 8, max_output=100, width_limit=w)
    t = 0.0
    for fence in range(1, 5):
        _, _, t = run_once(s, fence, t)
    s.advance_to(int(t * MS))
    plan = s.plan()
    assert plan.graph.allocation.value == "prefix_limit"
    s.commit(plan, 5)
    s.advance_to(int((t + 4.7) * MS))
    return s, plan


def _round_records(plan, offered=1, accepted=1):
    return [
        CompletionRecord(
            lane.handle, lane.epoch, tokens=(5,) * (accepted + 1), offered=offered, accepted=accepted
        )
        for lane in plan.lanes
    ]


def _with_none(sidecar, slot):
    """One rank's sidecar as nested lists with one missing (None) value on `slot`'s joint row
    (a list of sidecars is one per rank)."""
    rows = sidecar.tolist()
    rows[1][slot][0] = None
    return [rows]


def _with_nan(sidecar, slot):
    out = sidecar.copy()
    out[1, slot, 0] = np.nan
    return out


def _complete_round(s, plan, sidecar, survival=None):
    """Complete `plan` as fence 5 with `sidecar`, and with `survival` rows when given."""
    if survival is None:
        return s.complete_packed_round(5, _round_records(plan), timing(4.7), sidecar)
    return s.complete_packed_round_with_survival(5, _round_records(plan), timing(4.7), sidecar, survival)


@spec("service-accounting/validate-first", "planning-queue/packed-round", "planning-queue/survival-variants")
@pytest.mark.parametrize(
    "make_sidecar, survival, message",
    [
        (lambda plan: _sidecar((2, RAGGED.request_slots + 1, 3)), None, "sidecar shape"),
        (lambda plan: _with_nan(_sidecar(), plan.lanes[0].slot), None, "valid probabilities"),
        (lambda plan: _with_none(_sidecar(), plan.lanes[0].slot), None, "valid probabilities"),
        (lambda plan: _sidecar(), np.full((RAGGED.request_slots - 1, 3), 0.5), "survival rows shape"),
    ],
    ids=["one-slot-too-many", "not-a-number", "missing-value", "survival-one-row-short"],
)
def test_a_sidecar_or_survival_row_for_other_slots_or_with_a_hole_is_refused(make_sidecar, survival, message):
    """The sidecar must have one row per request slot (a draft dimension deep enough is not
    enough) and a probability, not a missing value or NaN, on every lane's row; survival rows
    are one per request slot. Anything else is refused before anything changes."""
    s, plan = _packed_round()
    before = snapshot(s)
    with pytest.raises(ValueError, match=message):
        _complete_round(s, plan, make_sidecar(plan), survival)
    assert snapshot(s) == before


def _complex(sidecar, slot):
    out = sidecar.astype(np.complex128)
    out[1, slot, 0] = 0.5 + 0.25j
    return out


@pytest.mark.parametrize(
    "make_sidecar, survival, message",
    [
        (lambda plan: _complex(_sidecar(), plan.lanes[0].slot), None, "confidence .* got complex values"),
        (lambda plan: [_sidecar(), _sidecar().astype(np.complex64)], None, "rank 1 confidence .* complex"),
        (lambda plan: [[["x"]]], None, "confidence .* got values that are not numbers"),
        (lambda plan: _sidecar(), np.full((RAGGED.request_slots, 3), 0.5 + 0.5j), "survival .* complex"),
        (lambda plan: _sidecar(), [[0.5, "x", 0.5]] * RAGGED.request_slots, "survival .* not numbers"),
    ],
    ids=["complex-sidecar", "complex-second-rank", "text", "complex-survival", "text-survival"],
)
def test_complex_or_non_numeric_sidecars_and_survival_rows_are_refused(make_sidecar, survival, message):
    """A cast to float64 would keep a complex value's real part (numpy only warns): complex and
    non-numeric sidecars and survival rows are refused, naming the fence, before anything
    changes; the real values of the same round land."""
    s, plan = _packed_round()
    before = snapshot(s)
    with pytest.raises(ValueError, match=rf"^fence 5: .*{message}"):
        _complete_round(s, plan, make_sidecar(plan), survival)
    assert snapshot(s) == before
    landed = _complete_round(s, plan, _sidecar(), _survival(0.5))
    assert len(landed) == len(plan.lanes)


@spec("planning-queue/survival-variants")
def test_a_survival_value_of_one_is_a_valid_observation():
    """Survival values are probabilities, one included: a proposal that certainly survived is
    observed, and the acceptance estimate at that depth moves up by the aged prior's share."""
    s, plan = _packed_round()
    req = s.requests[plan.lanes[0].handle.rid]
    prior = req.acceptance.get(req.proposal_source).mean[0]
    gen = s.complete_packed_round_with_survival(
        5, _round_records(plan), timing(4.7), _sidecar(), _survival(1.0)
    )
    assert len(gen) == len(plan.lanes)
    assert req.acceptance.get(req.proposal_source).mean[0] > prior


@spec("service-accounting/validate-first", "speculative-coverage/ceiling-bound")
def test_a_device_lane_offers_no_more_proposals_than_its_ceiling_allows():
    """A device-allocated lane whose width limit caps its ceiling at two target rows can verify
    at most one proposal, though the program could produce three: a report offering two is
    refused, naming the fence and the lane, and one offering one lands."""
    s, plan = _packed_round(width_limits=(2, None, None, None))
    capped = next(i for i, lane in enumerate(plan.lanes) if lane.ceiling == 2)
    assert plan.graph.proposal_depth == 3
    recs = _round_records(plan)
    over = list(recs)
    over[capped] = dataclasses.replace(recs[capped], offered=2, accepted=2, tokens=(5, 5, 5))
    before = snapshot(s)
    with pytest.raises(ValueError, match=rf"^fence 5 lane {capped} \(.*offered 2 proposals, at most 1"):
        s.complete_packed_round(5, over, timing(4.7), _sidecar())
    assert snapshot(s) == before
    assert len(s.complete_packed_round(5, recs, timing(4.7), _sidecar())) == len(plan.lanes)


@spec("planning-queue/commit-checks")
def test_a_saved_plan_is_refused_once_its_request_has_retired():
    """A plan saved for a request that has since retired (cancelled with nothing in flight) is
    refused at commit as no longer resident, also after another request was admitted, and
    nothing is dispatched."""
    s = scheduler()
    first = s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    saved = s.plan()
    s.cancel(first)  # nothing in flight: it retires at once
    assert first.rid not in s.requests
    with pytest.raises(PlanRejected, match="no longer resident"):
        s.commit(saved, 1)
    s.admit([2] * 8, max_output=10)
    with pytest.raises(PlanRejected, match="no longer resident"):
        s.commit(saved, 1)
    assert s.in_flight == ()


def test_max_advance_bounds_each_lane_role():
    """A queued lane's bound on the tokens it commits: a prompt lane its first output token only
    when it finishes the prompt, a state operation none, a decode lane its rows or steps."""
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    plan = s.plan()
    (lane,) = plan.lanes
    assert lane.role is LaneRole.PROMPT and lane.finishes_prompt and plan.max_advance(lane) == 1
    unfinished = dataclasses.replace(lane, finishes_prompt=False)
    assert plan.max_advance(unfinished) == 0
    for role in (LaneRole.PREREQUISITE, LaneRole.TERMINAL):
        assert plan.max_advance(PlanLane(lane.handle, lane.slot, lane.epoch, role)) == 0


def test_commit_tokens_stops_at_the_output_limit_within_one_burst():
    """A burst longer than the output left keeps what fits and finishes the request by length,
    however many tokens arrive."""
    s = scheduler()
    h = s.admit([1] * 8, max_output=3)
    req = s.requests[h.rid]
    assert req.commit_tokens([4, 5, 6, 7, 8]) == [4, 5, 6]
    assert req.output == [4, 5, 6] and req.finish_reason == "length"
    assert req.commit_tokens([9]) == [] and req.output == [4, 5, 6]


@spec("service-accounting/validate-first")
def test_token_id_zero_is_a_token():
    """Token ids are nonnegative integers, zero included: a round emitting token 0 lands."""
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    _, _, t = run_once(s, 1, 0.0)
    s.advance_to(int(t * MS))
    plan = s.plan()
    s.commit(plan, 2)
    (gen,) = s.complete(2, records(plan, token=0), timing(1.0))
    assert gen.tokens == (0,)


@spec("service-accounting/validate-first")
def test_a_prompt_row_offering_proposals_and_a_round_of_the_wrong_length_are_refused_by_location():
    """A prompt row verifies no proposals (one offered and none accepted is already too many),
    and a single-step round commits its accepted proposals plus one token; each refusal names
    the fence and the lane, before anything changes."""
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    plan = s.plan()
    s.commit(plan, 1)
    (good,) = records(plan)
    before = snapshot(s)
    with pytest.raises(ValueError, match=r"^fence 1 lane 0 \(.*verifies no proposals"):
        s.complete(1, [dataclasses.replace(good, offered=1)], timing(5.0))
    assert snapshot(s) == before
    s.advance_to(int(5 * MS))
    s.complete(1, [good], timing(5.0))
    plan = s.plan()
    s.commit(plan, 2)
    (good,) = records(plan)
    with pytest.raises(ValueError, match=r"^fence 2 lane 0 \(.*accepted proposals plus one token"):
        s.complete(2, [dataclasses.replace(good, tokens=(5, 5))], timing(1.0))


def _state_operation_in_flight():
    """(scheduler, plan, fence): a plan with a prerequisite or terminal lane committed, on the
    speculative catalog with checkpoints (a finished request's terminal snapshot)."""
    s = Scheduler(SPEC, checkpoints=True)
    s.seed_costs(0)
    s.admit([1] * 8, max_output=2)
    t = 0.0
    for fence in range(1, 20):
        s.advance_to(int(t * MS))
        plan = s.plan()
        s.commit(plan, fence)
        if any(lane.role in (LaneRole.PREREQUISITE, LaneRole.TERMINAL) for lane in plan.lanes):
            return s, plan, fence
        t += plan.expected_duration_ms or 1.0
        s.advance_to(int(t * MS))
        for g in s.complete(fence, records(plan), timing(plan.expected_duration_ms or 1.0)):
            if g.tokens:
                s.published_output(g.handle, fence)
    raise AssertionError("no state operation")


@spec("service-accounting/validate-first")
@pytest.mark.parametrize(
    "field, value",
    [("tokens", (5,)), ("prompt_tokens", 1), ("offered", 1), ("accepted", 1)],
)
def test_a_state_operation_row_produces_nothing(field, value):
    """A prerequisite or terminal row reports its identity alone: a token, a prompt token, an
    offered or an accepted proposal, each on its own, is refused before anything changes."""
    s, plan, fence = _state_operation_in_flight()
    recs = records(plan)
    i = next(
        i for i, lane in enumerate(plan.lanes) if lane.role in (LaneRole.PREREQUISITE, LaneRole.TERMINAL)
    )
    bad = list(recs)
    bad[i] = dataclasses.replace(recs[i], **{field: value})
    before = snapshot(s)
    with pytest.raises(ValueError, match="rows produce no tokens"):
        s.complete(fence, bad, timing(1.0))
    assert snapshot(s) == before


@spec("useful-service/conditional-acceptance")
@pytest.mark.parametrize("width_limit", [True, 2.5, 0])
def test_a_width_limit_is_a_positive_integer(width_limit):
    """A width limit is a number of target rows: a bool, a fraction or zero is refused at
    admission and nothing is admitted."""
    s = scheduler()
    with pytest.raises(ValueError, match="width_limit"):
        s.admit([1] * 8, max_output=10, width_limit=width_limit)
    assert s.requests == {}


@spec("planning-queue/page-reservation")
def test_pages_cover_a_request_at_the_context_limit_with_its_draft_storage():
    """A request that fills the context (prompt plus output equal to max_model_len) reserves
    pages for the whole context and the catalog's draft storage beyond it."""
    s = Scheduler(SPEC, max_model_len=64)
    s.seed_costs(0)
    assert s.draft_storage == 7
    h = s.admit([1] * 32, max_output=32)
    assert len(s.page_table(h)) == math.ceil((64 + 7) / s.page_size) == s.pages_needed(32, 32)


@spec("planning-queue/project-queue-end")
def test_views_are_priced_at_the_end_of_the_queued_work():
    """views() without a start prices at the planning start: with a frame in flight, the end of
    the queued work, not now. A request admitted meanwhile has no token history yet, so its
    price falls with its time since admission at that start."""
    s, t, plan = decode_frame_in_flight()
    h = s.admit([2] * 8, max_output=10)
    start = planning_start_ns(s.frames, s.now_ns)
    assert start > s.now_ns

    def price(views):
        return next(v.log_prefill_price for v in views if v.rid == h.rid)

    assert price(s.views()) == price(s.views(start))
    assert price(s.views()) != price(s.views(s.now_ns))


@spec("planning-queue/api")
@pytest.mark.parametrize(
    "prompt_len, max_output, endpoints, spans, message",
    [
        (40, 25, (), (), "exceeds the context"),  # one token over max_model_len = 64
        (8, 10, (0,), (), "message endpoints"),  # an endpoint before the first token
        (8, 10, (), ((3, 3),), "image spans"),  # an empty span
    ],
    ids=["past-the-context", "endpoint-zero", "empty-span"],
)
def test_admission_refuses_what_no_request_can_be(prompt_len, max_output, endpoints, spans, message):
    """A prompt plus output past the context, a message endpoint at zero, an empty image span:
    refused with a ValueError, and nothing is admitted."""
    s = Scheduler(SPEC, max_model_len=64)
    with pytest.raises(ValueError, match=message):
        s.admit([1] * prompt_len, max_output=max_output, message_endpoints=endpoints, image_spans=spans)
    assert s.requests == {}


@spec("planning-queue/api")
def test_admission_takes_an_image_span_that_ends_with_the_prompt():
    """An image span may end exactly at the prompt's end (and an endpoint sit there)."""
    s = Scheduler(SPEC)
    h = s.admit([1] * 8, max_output=4, image_spans=((4, 8),), message_endpoints=(8,))
    assert s.requests[h.rid].image_spans == ((4, 8),)


def test_the_trace_keeps_the_last_4096_decisions():
    """The decision trace is bounded (a long-running server keeps the latest 4,096 records)."""
    s = scheduler()
    s.admit([1] * 8, max_output=10)
    s.advance_to(0)
    plan = s.plan()
    for fence in range(1, 4098):
        s.counters.committed(fence, plan, None)
    assert len(s.trace) == 4096 and s.trace[0].fence == 2 and s.trace[-1].fence == 4097


def _depth_one(catalog):
    """`catalog` with one proposal at most: its three-draft host-allocated speculative programs
    cut to one draft (W = 2), every deeper program dropped."""
    graphs = []
    for g in catalog.graphs:
        if g.proposal_depth == 3 and g.kind is GraphKind.SPECULATIVE and g.allocation.value == "query_length":
            graphs.append(
                dataclasses.replace(
                    g, proposal_depth=1, token_capacity=2, target_capacity=2 * g.batch_capacity
                )
            )
        elif not g.proposal_depth:
            graphs.append(g)
    return dataclasses.replace(catalog, graphs=tuple(graphs))


@spec("confidence-acceptance/survival-output")
def test_a_catalog_of_one_draft_prices_its_decoders_survival():
    """A catalog whose deepest program proposes one draft still prices its decoders by their
    acceptance: each decoder's view carries its survival at depth one, and a round verifies it."""
    s = scheduler(_depth_one(SPEC))
    assert s.graphs.max_depth == 1
    h = s.admit([1] * 8, max_output=50)
    _, _, t = run_once(s, 1, 0.0)
    (view,) = [v for v in s.views() if v.rid == h.rid]
    assert view.survival.tolist() == [0.5]  # the fresh prior
    plan, _, _ = run_once(s, 2, t, accepted=1)
    assert plan.graph.proposal_depth == 1 and plan.lanes[0].query_length == 2


@spec("planning-queue/packed-round", "service-accounting/validate-first")
def test_a_device_allocated_program_of_one_draft_completes_only_with_its_sidecar():
    """Device allocation needs a proposal to rank, and one is enough: a prefix-limit program of
    one draft (W = 2) reports through complete_packed_round with its confidence sidecar, and a
    report without one is refused before anything changes."""
    graphs = tuple(
        dataclasses.replace(g, proposal_depth=1, token_capacity=2)
        if g.allocation is not None and g.allocation.value == "prefix_limit"
        else g
        for g in _device_only().graphs
    )
    s, plan = _packed_round(catalog=dataclasses.replace(RAGGED, graphs=graphs))
    assert plan.graph.proposal_depth == 1
    recs = _round_records(plan)
    before = snapshot(s)
    with pytest.raises(ValueError, match="complete_packed_round"):
        s.complete(5, recs, timing(4.7))
    assert snapshot(s) == before
    assert len(s.complete_packed_round(5, recs, timing(4.7), _sidecar())) == len(plan.lanes)
