"""Builders for selector tests: measured catalogs and request views with derived prices."""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np

from helios_jax.catalog import Catalog, DecodeMode, GraphKind, shipped_catalog
from helios_jax.scheduler import policy, service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import NS_PER_MS, Scheduler
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming
from helios_jax.scheduler.view import LaneRole, Phase, RequestView

SPEC = shipped_catalog("synthetic-h200")
ORDINARY = shipped_catalog("synthetic-h200-ordinary")
RAGGED = Catalog.load(pathlib.Path(__file__).parents[1] / "data" / "ragged-small.json")
POLICY = PolicyConfig()
TIMING = ExecutionTiming((1e6,), 1e6)  # one millisecond of device time


def k_step_only(catalog: Catalog) -> Catalog:
    """`catalog` whose decode programs all run K steps (`--decode_steps=K`: no single step) and
    that has no mixed programs (the engine's default, `--mixed_prefill` off)."""
    graphs = tuple(
        g
        for g in catalog.graphs
        if not (g.kind is GraphKind.DECODE and g.steps == 1) and g.kind is not GraphKind.MIXED
    )
    return dataclasses.replace(catalog, graphs=graphs)


def measured(catalog: Catalog, now_ns: int = 0, **overrides_ms) -> CostModel:
    """A measured catalog: one synthetic observation per entry through the observation path."""
    costs = CostModel(POLICY.estimate_ttl_ns)
    costs.seed_from_catalog(catalog, now_ns)
    return costs


def decoder(
    rid: int,
    *,
    x: float = 2.0,
    z: float = 0.25,
    age_ms: float = 10.0,
    survival=(0.5,),
    output_remaining: int = 1000,
    policy_config: PolicyConfig = POLICY,
    **kw,
) -> RequestView:
    """A decoding request with token rate x (tokens/ms) and delivery rate z (deliveries/ms)."""
    prices = service.log_prices(policy_config, math.log(x), math.log(z))
    survival = np.asarray(survival, dtype=float)
    kw.setdefault("forecast", survival)
    return RequestView(
        rid=rid,
        slot=kw.pop("slot", rid),
        phase=Phase.DECODE,
        log_prefill_price=prices.prefill_token,
        log_output_price=prices.output_token,
        log_delivery_price=prices.delivery,
        age_ms=age_ms,
        output_remaining=output_remaining,
        survival=survival,
        **kw,
    )


def prompt(
    rid: int,
    tokens: int,
    *,
    x: float = 2.0,
    log_x: float | None = None,
    policy_config: PolicyConfig = POLICY,
    **kw,
) -> RequestView:
    """A request with `tokens` uncached prompt tokens and token rate x (or its log)."""
    prices = service.log_prices(policy_config, math.log(x) if log_x is None else log_x, None)
    return RequestView(
        rid=rid,
        slot=kw.pop("slot", rid),
        phase=Phase.PREFILL,
        log_prefill_price=prices.prefill_token,
        log_output_price=prices.output_token,
        prompt_remaining=tokens,
        **kw,
    )


def plain_monotone(values) -> list[float]:
    """Joint prefix survival in plain Python, the independent side of checks of
    ``speculation.monotone``: each depth clipped to [0, 1] and no larger than any shallower one."""
    out, low = [], 1.0
    for v in values:
        low = min(low, max(0.0, min(1.0, float(v))))
        out.append(low)
    return out


def geometric(p: float, depth: int = 7) -> np.ndarray:
    return p ** np.arange(1, depth + 1)


def inputs(
    views,
    catalog: Catalog = SPEC,
    mode: DecodeMode = DecodeMode.ADAPTIVE,
    costs=None,
    now_ns: int = 0,
    policy_config: PolicyConfig = POLICY,
    fixed_width=None,
) -> policy.SelectionInput:
    costs = measured(catalog) if costs is None else costs
    return policy.SelectionInput(
        list(views), catalog.eligible(mode, fixed_width=fixed_width), costs, now_ns, policy_config, mode
    )


def choose(views, **kw):
    return policy.select(inputs(views, **kw))


def best_of_kind(views, kind: GraphKind, **kw):
    cands = [c for c in policy.candidates(inputs(views, **kw)) if c.kind is kind]
    return max(cands, key=lambda c: c.score) if cands else None


def burst_records(plan, decode_tokens=()) -> list[CompletionRecord]:
    """Completion records of `plan`: a prompt lane consumes its chunk (token 9 when it ends the
    prompt), a decode lane emits `decode_tokens`, any other lane nothing."""
    out = []
    for lane in plan.lanes:
        if lane.role is LaneRole.PROMPT:
            emitted = (9,) if lane.finishes_prompt else ()
            out.append(
                CompletionRecord(lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens, tokens=emitted)
            )
        elif lane.role is LaneRole.DECODE:
            out.append(CompletionRecord(lane.handle, lane.epoch, tokens=tuple(decode_tokens)))
        else:
            out.append(CompletionRecord(lane.handle, lane.epoch))
    return out


def first_generation_plan(catalog: Catalog, kind: GraphKind, *, mode=None, stop_token_ids=()):
    """(scheduler, plan, fence): one request (output limit 6, first token 9 from its prompt) run
    through its prerequisites until the next plan is of `kind`, not yet committed."""
    s = Scheduler(catalog, mode=mode)
    s.seed_costs(0)
    s.admit([1, 2, 3], max_output=6, stop_token_ids=stop_token_ids)
    for fence in range(10):
        s.advance_to(fence * 10 * NS_PER_MS)
        plan = s.plan()
        if plan.kind is kind:
            return s, plan, fence
        s.commit(plan, fence)
        s.complete(fence, burst_records(plan), TIMING)
    raise AssertionError(f"no {kind.value} plan")
