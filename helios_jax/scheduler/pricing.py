"""Pricing views: resident requests as the selector sees them, projected to the planning start.

Pure functions of plain data (the resident requests, the frames in flight, the policy, the
measured normalizers and the pooled acceptance estimates, and a time), so that ``plan()`` stays
pure and the projection can be read and tested without a scheduler. They live beside
``view.py`` (which holds the :class:`RequestView` record they return) rather than in it, because
they read the scheduler's request and frame records; ``service.py`` holds the price arithmetic.

Projection: each queued frame's frozen expected service advances a copy of its participants'
service histories (the requests' own histories are never changed here), and a queued delivery
resets the output age at the frame's expected end.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from helios_jax.scheduler import service
from helios_jax.scheduler.captures import next_capture, window_stop
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.plan import Frame, Handle
from helios_jax.scheduler.requests import Request
from helios_jax.scheduler.service import NS_PER_MS, ServiceHistory, missing_rate, resident_rates
from helios_jax.scheduler.speculation import SOURCE_COPY, PrefixEstimate, batch_estimates
from helios_jax.scheduler.view import NO_ESTIMATE, Phase, RequestView

Histories = dict[int, ServiceHistory]
BATCH_MIN = 3  # decoders of one proposal source from which their estimates are batched


@dataclasses.dataclass(frozen=True)
class PricingInputs:
    """What the views read: resident requests, frames in flight and the learned estimates."""

    requests: Mapping[int, Request]
    frames: Sequence[Frame]
    policy: PolicyConfig
    normalizers: service.Normalizers  # of the loaded catalog's measured generation programs
    acceptance_pools: Mapping[str, PrefixEstimate]  # pooled observations per proposal source
    max_model_len: int
    # Decoders' optimistic estimates (``RequestView.optimistic``, read only by an acceptance
    # probe); false: left empty, for a decision that cannot probe.
    optimistic: bool = True
    # Decoders' survival estimates (``RequestView.survival``, read only by proposal rows); false:
    # left empty, for a catalog with no proposal depth (its decisions read none).
    survival: bool = True


class _PromptFields(TypedDict):
    prompt_remaining: int
    prompt_limit: int | None
    atomic_spans: tuple[tuple[int, int], ...]
    endpoint: int | None
    needs_scores: bool


def runnable(req: Request) -> bool:
    """Selectable now: active, and no prompt, prerequisite or snapshot of it in flight."""
    if not req.active:
        return False
    if req.phase in (Phase.PREFILL, Phase.BLOCKED, Phase.TERMINAL) and req.inflight:
        return False
    return True


def queued_advance(req: Request, frames: Sequence[Frame]) -> int:
    """Committed tokens the request's queued lanes can still add: each at most
    min(lane ceiling, P) (``ScheduledPlan.max_advance``)."""
    return sum(f.plan.max_advance(lane) for f in frames for lane in f.plan.lanes if lane.handle == req.handle)


def projected_histories(inp: PricingInputs) -> tuple[Histories, dict[int, int | None]]:
    """Copies of service histories after the queued frames' frozen expected service, and the
    expected delivery time of each request with a queued delivery."""
    # Shared with the requests (read-only) except where a queued frame projects them.
    histories = {rid: r.history for rid, r in inp.requests.items()}
    projected = set()
    delivered_at = {}
    for f in inp.frames:
        if f.plan.expected_duration_ms is None:
            continue
        dt = f.plan.expected_duration_ms
        for h in f.participants:
            if h.rid not in histories:
                continue
            if h.rid not in projected:
                histories[h.rid] = histories[h.rid].copy()
                projected.add(h.rid)
            hist = histories[h.rid]
            tokens, deliveries = f.expected_service.get(h.rid, (0.0, 0.0))
            prior = 0.0  # read by update_token_history only when it starts a missing history
            if hist.log_x is None and tokens > 0:
                known = resident_rates(inp.requests, histories)
                prior = missing_rate(inp.requests[h.rid], f.committed_ns, f.normalizers, known, inp.policy)
            service.update_token_history(hist, tokens, dt, inp.policy, prior)
            hist.log_z = service.delivery_update(hist.log_z, deliveries, dt, inp.policy)
            if deliveries:
                delivered_at[h.rid] = f.expected_end_ns
    return histories, delivered_at


def best_served(requests: Mapping[int, Request], free_pages: int, pages_needed: int) -> Handle | None:
    """The active decoding request whose pages would let `pages_needed` fit, with the highest
    token rate (the lowest fairness price), then the latest admitted; None when there is none."""
    candidates = []
    for r in requests.values():
        if r.active and r.phase is Phase.DECODE and free_pages + len(r.pages) >= pages_needed:
            rate = r.history.log_x if r.history.log_x is not None else -math.inf
            candidates.append((rate, -r.admitted_ns, r.handle))
    return max(candidates)[2] if candidates else None


def views(inp: PricingInputs, start_ns: int) -> list[RequestView]:
    """Request views with prices and ages projected to `start_ns` (the planning start)."""
    histories, delivered_at = projected_histories(inp)
    norm = inp.normalizers
    residents = [r for r in inp.requests.values() if r.active]
    prior_z = norm.share_log_rate(sum(1 for r in residents if r.delivery_bearing))
    known = [histories[r.handle.rid].log_x for r in residents]  # resident_rates(), in this order
    base = service.missing_base(norm, len(known), known)  # missing_rate's, shared by all
    tau = inp.policy.adaptation_ms
    terms = service.price_terms(inp.policy)
    acceptance = _acceptance(inp, [r for r in residents if r.phase is Phase.DECODE])
    advances = queued_advances(inp.frames)
    out = []
    for r, log_x in zip(residents, known):
        rid = r.handle.rid
        if log_x is None:  # service.missing_rate at start_ns
            log_x = base - max(0.0, (start_ns - r.admitted_ns) / NS_PER_MS) / tau
        phase = r.phase
        log_z = None
        if phase is Phase.DECODE or (phase is Phase.BLOCKED and r.enables is Phase.DECODE):
            log_z = histories[rid].log_z  # delivery-bearing: a delivery coordinate
            if log_z is None:
                log_z = prior_z
        prefill, output, delivery = service.price_logs(terms, log_x, log_z)
        # `r` is active, so runnable(r) is this.
        fields = {
            "rid": rid,
            "slot": r.slot,
            "phase": phase,
            "runnable": not (phase in _INFLIGHT_BLOCKS and r.inflight),
            "last_selected_ns": r.last_selected_ns,
            "log_prefill_price": prefill,
            "log_output_price": output,
            "log_delivery_price": delivery,
            "host_mask": r.host_mask,
        }
        if phase is Phase.DECODE:
            last = delivered_at.get(rid, r.last_publication_ns)
            fields.update(_decode_fields(inp, r, start_ns, last, acceptance[rid], advances.get(r.handle, 0)))
        elif phase is Phase.PREFILL:
            fields.update(_prompt_fields(r))
        elif phase is Phase.TERMINAL:
            since = r.terminal_since_ns if r.terminal_since_ns is not None else start_ns
            fields["terminal_age_ms"] = max(0.0, (start_ns - since) / NS_PER_MS)
        else:
            _blocked_fields(inp, r, fields, start_ns)
        out.append(RequestView.unchecked(fields))
    return out


_INFLIGHT_BLOCKS = (Phase.PREFILL, Phase.BLOCKED, Phase.TERMINAL)  # runnable(): not while in flight


def queued_advances(frames: Sequence[Frame]) -> dict[Handle, int]:
    """:func:`queued_advance` of every request with a queued lane, keyed by handle, in one pass
    over the frames (views() reads it for every decoder)."""
    out: dict[Handle, int] = {}
    for f in frames:
        plan = f.plan
        for lane in plan.lanes:
            out[lane.handle] = out.get(lane.handle, 0) + plan.max_advance(lane)
    return out


def _acceptance(inp: PricingInputs, decoders: list[Request]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each decoder's (survival, optimistic) estimates: ``means(pool)`` and
    ``optimistic(len(output), pool)`` of its proposal source, computed per source and depth at once
    (``speculation.batch_estimates``); the optimistic ones empty unless ``inp.optimistic``, and
    both empty when neither is wanted (``inp.survival`` and ``inp.optimistic`` false)."""
    if not inp.survival and not inp.optimistic:
        return dict.fromkeys((r.rid for r in decoders), (NO_ESTIMATE, NO_ESTIMATE))
    groups: dict[tuple[str, int], list[tuple[Request, PrefixEstimate]]] = {}
    for r in decoders:
        est = r.acceptance.get(r.proposal_source)
        groups.setdefault((r.proposal_source, est.depth), []).append((r, est))
    out = {}
    for (source, _), members in groups.items():
        pool = inp.acceptance_pools[source]
        if len(members) < BATCH_MIN:  # a batch's fixed cost exceeds a few estimates' own
            out.update({r.rid: (e.means(pool), _optimistic(inp, r, e, pool)) for r, e in members})
            continue
        ests, tokens = [e for _, e in members], [len(r.output) for r, _ in members]
        means, optimistic = batch_estimates(ests, tokens, pool, inp.optimistic)
        uppers = [NO_ESTIMATE] * len(means) if optimistic is None else optimistic
        out.update({r.rid: (m, o) for (r, _), m, o in zip(members, means, uppers)})
    return out


def _optimistic(inp: PricingInputs, r: Request, est: PrefixEstimate, pool: PrefixEstimate) -> np.ndarray:
    return est.optimistic(len(r.output), pool) if inp.optimistic else NO_ESTIMATE


def _decode_fields(
    inp: PricingInputs,
    r: Request,
    start_ns: int,
    last: int | None,
    acceptance: tuple[np.ndarray, np.ndarray],
    queued: int,
) -> dict:
    """A decoding request: output left after its queued rounds (`queued`: their committed tokens
    at most), output age and acceptance (a decoder is runnable while output is left)."""
    remaining = r.max_output - len(r.output) - queued
    age = 0.0 if last is None else max(0.0, (start_ns - last) / NS_PER_MS)
    if r.last_publication_ns is None and last is None:
        age = max(0.0, (start_ns - r.admitted_ns) / NS_PER_MS)
    return {
        "runnable": remaining > 0,
        "age_ms": age,
        "output_remaining": max(remaining, 0),
        "context_remaining": inp.max_model_len - (r.cursor + queued),
        "width_limit": r.width_limit,
        "copy_limit": r.copy_limit if r.proposal_source == SOURCE_COPY else None,
        "survival": acceptance[0],
        "optimistic": acceptance[1],
        "forecast": r.forecast.means(),
    }


def _blocked_fields(inp: PricingInputs, r: Request, fields: dict, start_ns: int) -> None:
    """Blocked: priced like the phase it enables, with the same logical limits, so that
    lookahead values only work the following program can really do."""
    last = r.last_publication_ns if r.last_publication_ns is not None else r.admitted_ns
    est, pool = r.acceptance.get(r.proposal_source), inp.acceptance_pools[r.proposal_source]
    fields.update(_prompt_fields(r))
    fields["prerequisites"] = tuple(r.prerequisites)
    fields["enables"] = r.enables
    fields["age_ms"] = max(0.0, (start_ns - last) / NS_PER_MS)
    fields["output_remaining"] = r.max_output - len(r.output)
    fields["context_remaining"] = inp.max_model_len - r.cursor
    fields["width_limit"] = r.width_limit
    fields["copy_limit"] = r.copy_limit if r.proposal_source == SOURCE_COPY else None
    fields["survival"] = est.means(pool)
    fields["forecast"] = r.forecast.means()


def _prompt_fields(r: Request) -> _PromptFields:
    """A request's uncached prompt work and what restricts a chunk of it: the next capture
    or image-window stop, atomic image spans and the next message endpoint."""
    stops = [x for x in (next_capture(r), window_stop(r)) if x is not None]
    return _PromptFields(
        prompt_remaining=r.prompt_remaining,
        prompt_limit=min(stops) - r.consumed if stops else None,
        atomic_spans=r.spans_from_cursor(),
        endpoint=r.next_endpoint(),
        needs_scores=r.needs_scores,
    )
