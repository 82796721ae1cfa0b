"""The scheduler's counters (``stats.Counters``) and their snapshot: what each committed plan,
execution and verified draft adds, counted exactly over several rounds, and the trace record
each committed plan leaves.

The metrics exposition tests (test_core.py) check that the series exist; these check the sums:
a counter that is overwritten instead of added to, or bumped twice, reads right after one round
and wrong after three.
"""

import pytest

from helios_jax.catalog import GraphKind
from helios_jax.scheduler.speculation import SOURCE_COPY, SOURCE_LEARNED

from .helpers import SPEC
from .test_core import run_once, scheduler

spec = pytest.mark.spec


def _decode_rounds(source: str, accepted: list[int]):
    """One request from `source` past its prefill, then one speculative round per entry of
    `accepted` (each accepting that many of its proposals): (scheduler, the rounds' plans)."""
    s = scheduler(SPEC)
    s.admit([1] * 8, max_output=200, proposal_source=source)
    _, _, t = run_once(s, 1, 0.0)
    plans = []
    for fence, a in enumerate(accepted, start=2):
        plan, _, t = run_once(s, fence, t, accepted=a)
        plans.append(plan)
    return s, plans


def _offered(plans) -> list[int]:
    return [plan.lanes[0].query_length - 1 for plan in plans]


@spec("confidence-acceptance/spec-counters", "speculative-coverage/copy-no-draws")
@pytest.mark.parametrize("source", [SOURCE_LEARNED, SOURCE_COPY])
def test_draft_counters_add_every_rounds_offered_and_accepted_drafts(source):
    """Each verified round adds its offered and accepted drafts to the totals, to its source's own
    pair (learned or copy), and one count per offered depth (and per accepted depth) to the
    position counters; the snapshot reports the same sums."""
    accepted = [2, 0, 1]
    s, plans = _decode_rounds(source, accepted)
    offered = _offered(plans)
    assert all(o >= 2 for o in offered)  # every round offered proposals at depths 1 and 2
    spec_counts = s.speculative
    assert spec_counts["drafts_offered"] == sum(offered)
    assert spec_counts["drafts_accepted"] == sum(accepted)
    mine, other = ("learned", "copy") if source == SOURCE_LEARNED else ("copy", "learned")
    assert spec_counts[f"{mine}_drafts"] == sum(offered)
    assert spec_counts[f"{mine}_accepted"] == sum(accepted)
    assert spec_counts[f"{other}_drafts"] == spec_counts[f"{other}_accepted"] == 0
    depths = range(1, max(offered) + 1)
    assert {d: s.offered_by_position[d] for d in depths} == {d: sum(o >= d for o in offered) for d in depths}
    assert {d: s.accepted_by_position[d] for d in depths} == {
        d: sum(a >= d for a in accepted) for d in depths
    }
    snap = s.stats()
    assert snap.drafts_offered == sum(offered) and snap.drafts_accepted == sum(accepted)
    assert snap.learned_draws == (sum(offered) if source == SOURCE_LEARNED else 0)
    assert snap.offered_by_position == tuple((d, s.offered_by_position[d]) for d in depths)
    assert snap.accepted_by_position == tuple((d, s.accepted_by_position[d]) for d in depths)


@spec("acceptance-learning/execution-metrics")
def test_each_committed_plan_counts_once_by_kind_and_leaves_its_trace_record():
    """Every committed plan adds one to its program kind's selections and appends a trace record
    with its fence, shape and served lanes; each completed execution adds one to its class and
    one speculative program per speculative frame."""
    s, plans = _decode_rounds(SOURCE_LEARNED, [1, 1, 1])
    kinds = [GraphKind.PREFILL] + [p.kind for p in plans]
    assert dict(s.selections) == {k.value: kinds.count(k) for k in set(kinds)}
    assert s.speculative["programs"] == sum(p.kind is GraphKind.SPECULATIVE for p in plans) == 3
    assert s.executions["ordinary"] + s.executions["discovery"] == 4
    records = list(s.trace)
    assert [r.fence for r in records] == [1, 2, 3, 4]
    for record, plan in zip(records[1:], plans):
        assert (record.kind, record.batch_capacity, record.proposal_depth) == (
            plan.graph.kind,
            plan.graph.batch_capacity,
            plan.graph.proposal_depth,
        )
        assert (record.token_capacity, record.target_capacity) == (
            plan.graph.token_capacity,
            plan.graph.target_capacity,
        )
        assert record.served == len(plan.lanes) == 1
        assert record.reason is plan.reason and record.selected_cost_ms == plan.expected_duration_ms
    assert s.stats().selections == tuple(sorted(dict(s.selections).items()))
