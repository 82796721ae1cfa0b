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
from helios_jax.scheduler.view_columns import NO_LIMIT, DecoderColumns, ResidentViews

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
    token rate (the lowest fairness price), then the earliest admitted, then the larger handle;
    None when there is none."""
    candidates = []
    for r in requests.values():
        if r.active and r.phase is Phase.DECODE and free_pages + len(r.pages) >= pages_needed:
            rate = r.history.log_x if r.history.log_x is not None else -math.inf
            candidates.append((rate, -r.admitted_ns, r.handle))
    return max(candidates)[2] if candidates else None


def views(inp: PricingInputs, start_ns: int) -> ResidentViews:
    """Request views with prices and ages projected to `start_ns` (the planning start).

    The residents' rates and prices are computed as columns (one list or array per quantity, a
    row per resident: :func:`rate_columns`, ``service.price_columns``); the decoders' views are
    columns too (:func:`decoder_columns`), and only the other residents' views are built as
    objects, one per resident."""
    histories, delivered_at = projected_histories(inp)
    residents = [r for r in inp.requests.values() if r.active]
    log_x, log_z = rate_columns(inp, residents, histories, start_ns)
    prefill, output, delivery = service.price_columns(service.price_terms(inp.policy), log_x, log_z)
    others: list[RequestView] = []
    order: list[int] = []  # the residents' order: an index into `others`, or ~i for decoder i
    decoding: list[int] = []  # each decoder's index in `residents`
    for i, r in enumerate(residents):
        phase = r.phase
        if phase is Phase.DECODE:
            order.append(~len(decoding))
            decoding.append(i)
            continue
        order.append(len(others))
        # `r` is active, so runnable(r) is this.
        fields: dict[str, object] = {
            "rid": r.handle.rid,
            "slot": r.slot,
            "phase": phase,
            "runnable": not (phase in _INFLIGHT_BLOCKS and r.inflight),
            "last_selected_ns": r.last_selected_ns,
            "log_prefill_price": prefill[i],
            "log_output_price": output[i],
            "log_delivery_price": delivery[i],
            "host_mask": r.host_mask,
        }
        if phase is Phase.PREFILL:
            fields.update(_prompt_fields(r))
        elif phase is Phase.TERMINAL:
            since = r.terminal_since_ns if r.terminal_since_ns is not None else start_ns
            fields["terminal_age_ms"] = max(0.0, (start_ns - since) / NS_PER_MS)
        else:
            _blocked_fields(inp, r, fields, start_ns)
        others.append(RequestView.unchecked(fields))
    columns = decoder_columns(inp, residents, decoding, (prefill, output, delivery), delivered_at, start_ns)
    return ResidentViews(others, columns, order)


def decoder_columns(
    inp: PricingInputs,
    residents: list[Request],
    decoding: list[int],
    prices: tuple[list[float], list[float], list[float]],
    delivered_at: Mapping[int, int | None],
    start_ns: int,
) -> DecoderColumns:
    """The decoding requests' views as columns: output left after their queued rounds (the
    rounds' committed tokens at most), output age and acceptance (a decoder is runnable while
    output is left). The age counts from the expected end of its last queued delivery, else its
    last publication, else its admission. `decoding`: the decoders' indices in `residents` and
    in the residents' log prefill, output and delivery `prices` (a list each)."""
    advances = queued_advances(inp.frames)
    decoders = [residents[i] for i in decoding]
    acceptance = _acceptance(inp, decoders)
    prefill, output, delivery = prices
    ints, floats, survival, optimistic, forecast = [], [], [], [], []
    for i, r in zip(decoding, decoders):
        rid = r.handle.rid
        queued = advances.get(r.handle, 0)
        left = r.max_output - len(r.output) - queued
        remaining = max(left, 0)
        context = inp.max_model_len - (r.cursor + queued)
        width = NO_LIMIT if r.width_limit is None else r.width_limit
        if r.proposal_source == SOURCE_COPY and r.copy_limit is not None:
            copy = r.copy_limit
            limit = min(remaining, context, width, copy + 1)  # RequestView.row_limit
        else:
            copy, limit = NO_LIMIT, min(remaining, context, width)
        ints.append(
            (rid, r.slot, r.last_selected_ns, remaining, context, width, copy, limit, left > 0, r.host_mask)
        )
        last = delivered_at.get(rid, r.last_publication_ns)
        since = r.admitted_ns if last is None else last  # nothing published or queued: since admission
        floats.append((max(0.0, (start_ns - since) / NS_PER_MS), prefill[i], output[i], delivery[i]))
        estimates = acceptance[rid]
        survival.append(estimates[0])
        optimistic.append(estimates[1])
        forecast.append(r.forecast.means())
    return DecoderColumns.build(ints, floats, (survival, optimistic, forecast))


def rate_columns(
    inp: PricingInputs, residents: list[Request], histories: Histories, start_ns: int
) -> tuple[list[float], list[float | None]]:
    """Every resident's priced log token rate, and its log delivery rate (None without a
    delivery coordinate), in the order of `residents`.

    A missing token history is priced at ``service.missing_rate`` at `start_ns` (its base, the
    same for every resident of the decision, computed once); a delivery-bearing resident without
    a delivery history at the decoders' share of the fastest batch-feasible rate."""
    hist = [histories[r.handle.rid] for r in residents]
    known = [h.log_x for h in hist]  # resident_rates(), in this order
    base = service.missing_base(inp.normalizers, len(known), known)  # missing_rate's, shared by all
    tau = inp.policy.adaptation_ms
    log_x = [
        x if x is not None else base - max(0.0, (start_ns - r.admitted_ns) / NS_PER_MS) / tau
        for x, r in zip(known, residents)
    ]
    bearing = [r.delivery_bearing for r in residents]
    prior_z = inp.normalizers.share_log_rate(sum(bearing))
    log_z = [(prior_z if h.log_z is None else h.log_z) if b else None for h, b in zip(hist, bearing)]
    return log_x, log_z


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


def optimistic_estimates(inp: PricingInputs, decoders: Sequence[int]) -> dict[int, np.ndarray]:
    """The optimistic estimates of the decoding requests `decoders` (rids) by rid, as
    :func:`views` sets them with ``inp.optimistic`` (the same computation: ``Scheduler.plan``
    prices its views without them and asks for them only when an acceptance probe, their one
    reader, could widen a lane)."""
    requests = [inp.requests[rid] for rid in decoders]
    return {rid: optimistic for rid, (_, optimistic) in _acceptance(inp, requests).items()}


def _optimistic(inp: PricingInputs, r: Request, est: PrefixEstimate, pool: PrefixEstimate) -> np.ndarray:
    return est.optimistic(len(r.output), pool) if inp.optimistic else NO_ESTIMATE


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
