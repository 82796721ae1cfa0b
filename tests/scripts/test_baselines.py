"""The comparison baselines (scripts/scheduling_sim/baselines.py): legal plans, completion, budgets.

Each baseline keeps the real Scheduler lifecycle and replaces selection; these checks run them
in the simulator on both shipped catalogs and on hand-built states.
"""

import dataclasses
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from helios_jax import simulation as sim
from helios_jax.catalog import DecodeMode, GraphKind, shipped_catalog
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming
from helios_jax.scheduler.view import LaneRole

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "scheduling_sim_baselines", ROOT / "scripts" / "scheduling_sim" / "baselines.py"
)
B = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = B  # dataclasses resolve their module by name
_spec.loader.exec_module(B)

SPECULATIVE = shipped_catalog("synthetic-h200")
ORDINARY = shipped_catalog("synthetic-h200-ordinary")
ACCEPTANCE = (0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)


def workload(catalog, rate=40.0, n=14, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.choice([64, 100, 700, 3000, 6000], n).tolist()
    outputs = rng.choice([1, 9, 40], n).tolist()
    return sim.SimConfig(
        catalog,
        scenario="poisson",
        requests=n,
        prompt_tokens=prompts,
        output_tokens=outputs,
        accepted_drafts=None,
        acceptance_probs=ACCEPTANCE,
        arrival_rate_per_s=rate,
        horizon_ms=1e6,
        seed=seed,
        rounds=10**9,
    )


CASES = [
    ("fcfs", SPECULATIVE, None),
    ("fcfs", ORDINARY, None),
    ("sarathi", SPECULATIVE, None),
    ("sarathi", ORDINARY, None),
    ("fcfs_fixed", SPECULATIVE, 4),
    ("fcfs_fixed", SPECULATIVE, 8),
]


@pytest.mark.parametrize("budget", [256, 2048])
@pytest.mark.parametrize("kind,catalog,width", CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_baselines_complete_every_request_with_legal_plans_within_budget(kind, catalog, width, budget):
    spec = B.SchedulerSpec(f"{kind}@{budget}", kind, token_budget=budget, fixed_width=width)
    config = workload(catalog)
    result, sched = B.simulate(config, B.factory(spec))
    assert sched.violations == []  # every committed plan checked: eligible, within capacities and budget
    for r, limit in zip(result.requests, config.output_tokens):
        assert r.finished_ms is not None and r.output_tokens == limit
        assert r.first_output_ms is not None and r.first_output_ms > 0
    assert not sched.requests  # every slot and page returned
    assert sched.slots.available == catalog.request_slots
    assert sum(sched.kind_counts.values()) == sum(result.selections.values())
    kinds = set(sched.kind_counts)
    if kind == "sarathi":
        assert GraphKind.MIXED.value in kinds
    else:
        assert GraphKind.MIXED.value not in kinds
    if kind == "fcfs_fixed":
        assert all(f"W={width}," in name for name in sched.choices if name.startswith("speculative"))
    elif catalog is SPECULATIVE:
        assert all(",W=1," in name for name in sched.choices if not name.startswith("prefill"))


def test_utility_scheduler_through_the_same_path_and_the_simulator_is_restored():
    original = sim.Scheduler
    result, sched = B.simulate(workload(SPECULATIVE, n=6), B.factory(B.SchedulerSpec("balanced", "utility")))
    assert isinstance(sched, B.RecordingScheduler) and sched.mode is DecodeMode.ADAPTIVE
    assert all(r.finished_ms is not None for r in result.requests)
    assert sched.violations == []  # the checker accepts the utility scheduler's plans too
    assert sim.Scheduler is original


# -- hand-built states ---------------------------------------------------------------------------


def drive(sched, steps):
    """Run `steps` plans to completion (every decode lane accepts everything it verifies)."""
    fence = 1000
    plans = []
    for _ in range(steps):
        plan = sched.plan()
        if plan is None:
            break
        fence += 1
        sched.commit(plan, fence)
        records = []
        for lane in plan.lanes:
            if lane.role is LaneRole.PROMPT:
                records.append(
                    CompletionRecord(
                        lane.handle,
                        lane.epoch,
                        prompt_tokens=lane.prompt_tokens,
                        tokens=(7,) if lane.finishes_prompt else (),
                    )
                )
            else:
                rows = lane.query_length
                records.append(
                    CompletionRecord(
                        lane.handle, lane.epoch, tokens=(7,) * rows, offered=rows - 1, accepted=rows - 1
                    )
                )
        dur = plan.expected_duration_ms
        sched.advance_to(sched.now_ns + int(dur * 1e6))
        for g in sched.complete(fence, records, ExecutionTiming((dur * 1e6,), dur * 1e6)):
            sched.published_output(g.handle, fence)
        plans.append(plan)
    return plans


def make(cls, catalog=SPECULATIVE, **kwargs):
    mode, width = B.baseline_mode(catalog)
    kwargs.setdefault("mode", mode)
    kwargs.setdefault("fixed_width", width)
    sched = cls(catalog, max_model_len=1 << 16, **kwargs)
    sched.seed_costs(0)
    return sched


def test_fcfs_runs_the_oldest_prompt_first_in_budgeted_chunks_on_the_smallest_capacity():
    sched = make(B.FcfsPrefillFirst, token_budget=1024)
    old = sched.admit([7] * 3000, max_output=4)
    young = sched.admit([7] * 100, max_output=4)
    plans = drive(sched, 3)
    assert [(p.graph.token_capacity, p.lanes[0].handle, p.lanes[0].prompt_tokens) for p in plans] == [
        (1024, old, 1024),
        (1024, old, 1024),
        (1024, old, 952),
    ]
    plan = sched.plan()  # the young prompt (100 tokens) on the 128-token program, before decoding
    assert plan.graph.kind is GraphKind.PREFILL and plan.graph.token_capacity == 128
    assert plan.lanes[0].handle == young and plan.lanes[0].prompt_tokens == 100
    assert plan == sched.plan()  # pure
    drive(sched, 1)
    plan = sched.plan()  # nothing waiting: one width-one step for both decoders
    assert plan.graph.kind is GraphKind.SPECULATIVE and plan.graph.token_capacity == 1
    assert plan.graph.batch_capacity == 2 and {lane.query_length for lane in plan.lanes} == {1}


def test_stall_free_serves_every_decoder_and_fills_the_budget_with_one_chunk():
    sched = make(B.StallFreeChunked, token_budget=512)
    decoders = [sched.admit([7] * 64, max_output=50) for _ in range(3)]
    drive(sched, 3)  # three 64-token prompts, alone: nobody decodes yet
    late = sched.admit([7] * 6000, max_output=5)
    plan = sched.plan()
    assert plan.graph.kind is GraphKind.MIXED and plan.graph.batch_capacity == 4
    assert plan.graph.prefill_capacity == 512  # 512 - 3 decode rows = 509 tokens
    prompt = [lane for lane in plan.lanes if lane.role is LaneRole.PROMPT]
    assert [(lane.handle, lane.prompt_tokens) for lane in prompt] == [(late, 509)]
    assert {lane.handle for lane in plan.lanes if lane.role is LaneRole.DECODE} == set(decoders)
    assert B.plan_violations(sched, plan, 512) == []


def test_stall_free_alternates_separate_programs_without_mixed_ones():
    catalog = dataclasses.replace(
        ORDINARY, graphs=tuple(g for g in ORDINARY.graphs if g.kind is not GraphKind.MIXED)
    )
    sched = make(B.StallFreeChunked, catalog=catalog, token_budget=256)
    sched.admit([7] * 64, max_output=50)
    drive(sched, 1)
    sched.admit([7] * 1000, max_output=5)
    kinds = [p.graph.kind for p in drive(sched, 6)]
    assert kinds == [GraphKind.DECODE, GraphKind.PREFILL] * 3


def test_fixed_width_decodes_at_its_width_bounded_by_the_output_left():
    sched = make(B.FcfsFixedWidth, token_budget=512, fixed_width=4)
    a = sched.admit([7] * 64, max_output=30)
    b = sched.admit([7] * 64, max_output=3)
    drive(sched, 2)
    plan = sched.plan()
    assert plan.graph.kind is GraphKind.SPECULATIVE and plan.graph.token_capacity == 4
    assert {lane.handle: lane.query_length for lane in plan.lanes} == {a: 4, b: 2}  # b has two tokens left


def test_baselines_refuse_prerequisites():
    with pytest.raises(ValueError):
        make(B.FcfsPrefillFirst, token_budget=512, initialize_requests=True)
    with pytest.raises(ValueError):
        make(B.StallFreeChunked, token_budget=0)


def test_plan_violations_catch_an_over_budget_or_ineligible_plan():
    sched = make(B.FcfsPrefillFirst, token_budget=4096)
    sched.admit([7] * 3000, max_output=4)
    plan = sched.plan()
    assert B.plan_violations(sched, plan, 4096) == []
    assert any("budget" in v for v in B.plan_violations(sched, plan, 256))
    wide = next(g for g in SPECULATIVE.graphs if g.kind is GraphKind.SPECULATIVE and g.token_capacity == 8)
    assert any("eligible" in v for v in B.plan_violations(sched, dataclasses.replace(plan, graph=wide)))
