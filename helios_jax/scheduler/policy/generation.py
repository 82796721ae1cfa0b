"""Generation lanes: decode and speculative programs (spec, "Useful service and selection").

- Unconstrained programs (decode, width one, rectangular speculative) take the highest additive
  lane values: a prefix of the lane table's order.
- Fixed-mode ragged host programs solve the B/P capacity problem exactly
  (``utility.fixed_ragged``).
- Adaptive ragged programs search cohort prefixes under three orderings, each priced by the
  causal allocation it gets (``utility.adaptive_ragged``); device-allocated ones receive
  host prices only through their lane ceilings (:func:`price_ceilings`).
"""

from __future__ import annotations

import numpy as np

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.multistep import KStepRanking, multistep_candidate
from helios_jax.scheduler.policy.prepared import Route
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import LaneTable
from helios_jax.scheduler.rounds import allocate_cohort_rows, prefix_allocation_order

# Adaptive ragged programs left to their bound: (index among the returned rows, program).
Deferred = list[tuple[int, GraphDescriptor]]
DUAL_MULTIPLIERS = 12  # row prices (besides 0) ragged_dual_value tries


def generation_candidates(sel: Selection, defer: Deferred | None = None) -> list[ScoredCandidate]:
    """Each generation program's best cohort of runnable decoders.

    `defer`: adaptive ragged programs that :func:`boundable` admits are left out and listed
    there instead, as (the index their candidate would have in the returned list, program), for
    a caller that first compares :func:`ragged_upper_value` with the other rows
    (``selector.bounded_rows``) and builds only those that could matter
    (:func:`adaptive_ragged_candidate`)."""
    if sel.decoders.count == 0:
        return []
    found: list[ScoredCandidate] = []
    table = sel.decoders.table
    ranked = KStepRanking(sel.decoders)  # K-step lanes by K, shared by the programs of one K
    live = sel.prepared.generation_rows.live_routes(sel.decoders.count, ranked.extent)  # others: dominated
    for g, route, width, depth in live:
        if route is Route.MULTISTEP:
            found.extend(c for c in [multistep_candidate(sel, g, ranked(g.steps))] if c is not None)
            continue
        if route is not Route.RAGGED:
            found.append(_unconstrained_candidate(sel, g, table(width, depth), route is Route.DEVICE_WIDE))
            continue
        if sel.mode is DecodeMode.FIXED:
            candidate = _fixed_ragged_candidate(sel, g, table(width, depth))
        elif defer is not None and boundable(sel, g):
            defer.append((len(found), g))
            continue
        else:
            device = g.allocation is Allocation.PREFIX_LIMIT
            candidate = _adaptive_ragged_candidate(sel, g, table(width, depth).widths, device)
        if candidate is not None:
            found.append(candidate)
    return found


def _unconstrained_candidate(
    sel: Selection, g: GraphDescriptor, table: LaneTable, device: bool
) -> ScoredCandidate:
    decoders = sel.decoders
    m = min(g.batch_capacity, decoders.count)
    signature = (g.kind, device, g.proposal_depth, table.work_key, m)
    return sel.score(
        g,
        float(table.prefix_values[m]),
        m * decoders.age_value_per_ms,
        signature,
        sel.decoder_lanes(table.order[:m], table.widths, g, device),
    )


def _fixed_ragged_candidate(sel: Selection, g: GraphDescriptor, table: LaneTable) -> ScoredCandidate | None:
    decoders = sel.decoders
    widths, values = table.widths, table.values
    t = sel.duration(g) or 0.0
    _, idx = utility.fixed_ragged(
        values + decoders.age_value_per_ms * t, widths, g.batch_capacity, g.target_capacity
    )
    if not idx:
        return None
    signature = (g.kind, False, g.proposal_depth, tuple((int(decoders.rids[i]), int(widths[i])) for i in idx))
    return sel.score(
        g,
        float(values[idx].sum()),
        len(idx) * decoders.age_value_per_ms,
        signature,
        lambda: decoders.lanes(idx, widths, t),
    )


def boundable(sel: Selection, g: GraphDescriptor) -> bool:
    """Whether an adaptive ragged program's candidate may be left to its bound: a known duration
    (its score is a rate), and no program it dominates (leaving it out then changes no other
    row's dominance)."""
    return sel.duration(g) is not None and id(g) not in sel.prepared.dominating_ids


def adaptive_ragged_candidate(sel: Selection, g: GraphDescriptor) -> ScoredCandidate | None:
    """The adaptive ragged candidate of `g` that :func:`generation_candidates` builds."""
    table = sel.decoders.table(g.token_capacity, g.proposal_depth)
    return _adaptive_ragged_candidate(sel, g, table.widths, g.allocation is Allocation.PREFIX_LIMIT)


def ragged_upper_value(sel: Selection, g: GraphDescriptor) -> float:
    """An upper bound on the useful value (age terms at g's duration included) of any adaptive
    ragged candidate of `g`, whatever its cohort and allocation: the largest, over cohort sizes
    m up to min(B, decoders, P), of the m best pending rows plus the best of at most P - m
    extension rows within the lanes' widths.

    A candidate of m lanes earns each lane's pending row and the extension rows its allocation
    gives (prefixes within the lane's width; each lane holds its pending row, so at most P - m of
    them, the host's and the device's allocation alike); the bound drops the prefix and same-lane
    constraints. Its sums are in another order than the candidate's, so a caller compares with a
    margin (``selector.bounded_rows``)."""
    decoders = sel.decoders
    t = sel.duration(g) or 0.0
    widths = decoders.table(g.token_capacity, g.proposal_depth).widths
    pending = decoders.output_price + decoders.delivery_value + decoders.age_value_per_ms * t
    pending.sort()  # a new array: ascending
    ext = decoders.extension_value
    rows = ext[np.arange(ext.shape[1]) < (widths[:, None] - 1)]
    rows.sort()
    m_max = min(g.batch_capacity, decoders.count, g.target_capacity)
    totals = np.cumsum(pending[: -m_max - 1 : -1])  # the m best pending rows, m = 1..m_max
    if rows.size:
        # The j best extension rows, j = 1..: each row is a price times a survival power, never
        # negative, so taking k rows is never worse than taking fewer.
        best_rows = np.cumsum(rows[::-1])
        k = np.minimum(g.target_capacity - np.arange(1, m_max + 1), rows.size)
        totals = totals + np.where(k > 0, best_rows[k - 1], 0.0)
    return float(totals.max())


def ragged_dual_value(sel: Selection, g: GraphDescriptor, multipliers: int = DUAL_MULTIPLIERS) -> float:
    """A tighter upper bound than :func:`ragged_upper_value` on the same useful value, which
    keeps the extension rows within the cohort's own lanes: for any price lam >= 0 on a row of
    the P - m left, a cohort of m lanes earns at most the m largest lane values
    pending + sum(max(extension - lam, 0)) over the lane's width, plus lam * (P - m) (a row
    taken is worth its excess over lam, plus lam). The least of these over a few prices (0 and
    quantiles of the extension rows) for each m, then the largest over m.

    In the 64-resident loop of ``plan_path.py`` the first bound sits a few percent above the
    best row where this one sits within one percent of the candidate's own score."""
    decoders = sel.decoders
    t = sel.duration(g) or 0.0
    widths = decoders.table(g.token_capacity, g.proposal_depth).widths
    pending = decoders.output_price + decoders.delivery_value + decoders.age_value_per_ms * t
    ext = decoders.extension_value
    valid = np.arange(ext.shape[1]) < (widths[:, None] - 1)
    rows = np.sort(ext[valid])
    picks = np.linspace(0, max(rows.size - 1, 0), multipliers).astype(np.intp)
    lam = np.maximum(np.concatenate([[0.0], rows[picks] if rows.size else []]), 0.0)
    excess = np.maximum(np.where(valid, ext, 0.0)[None, :, :] - lam[:, None, None], 0.0).sum(axis=2)
    lanes = pending[None, :] + excess  # [prices, lanes]
    lanes.sort(axis=1)
    m_max = min(g.batch_capacity, decoders.count, g.target_capacity)
    tops = np.cumsum(lanes[:, : -m_max - 1 : -1], axis=1)  # [prices, m]: the m best lanes
    totals = tops + lam[:, None] * (g.target_capacity - np.arange(1, m_max + 1))[None, :]
    return float(totals.min(axis=0).max())


def _adaptive_ragged_candidate(
    sel: Selection, g: GraphDescriptor, widths: np.ndarray, device: bool
) -> ScoredCandidate | None:
    """Adaptive ragged selection: cohort prefixes under the three orderings, each priced by
    the allocation it gets.

    The host ranks its own rows by marginal value. The device ranks its causal frontier by
    joint prefix probability (the forecast), never by host prices, within the lane
    ceilings, and the ceilings are the only way prices reach its allocation
    (:func:`price_ceilings`).
    """
    decoders = sel.decoders
    t = sel.duration(g) or 0.0
    pending_value = decoders.output_price + decoders.delivery_value + decoders.age_value_per_ms * t
    depth = decoders.extension_value.shape[1]
    by_slot = np.argsort(decoders.slots, kind="stable")
    rank_key = decoders.forecast if device else decoders.extension_value
    alloc_lanes, alloc_depths = prefix_allocation_order(
        rank_key[by_slot], np.minimum(widths[by_slot], depth + 1)
    )
    _, cohort, alloc = utility.adaptive_ragged(
        pending_value,
        decoders.extension_value,
        widths,
        by_slot[alloc_lanes],
        alloc_depths,
        g.batch_capacity,
        g.target_capacity,
    )
    if not cohort:
        return None
    ceilings = price_ceilings(sel, cohort, widths, alloc, g.target_capacity) if device else None
    members = np.array(cohort, dtype=np.intp)
    lane_values = (
        decoders.output_price[members] * decoders.expected_output[members, alloc[members]]
        + decoders.delivery_value[members]
    )
    value = float(np.cumsum(lane_values)[-1])  # summed in cohort order, one lane after another
    served_rows = alloc if ceilings is None else ceilings  # device lanes: their work is the ceiling
    work = tuple((int(decoders.rids[i]), int(served_rows[i])) for i in cohort)
    signature = (g.kind, device, g.proposal_depth, work)
    return sel.score(
        g,
        value,
        len(cohort) * decoders.age_value_per_ms,
        signature,
        lambda: decoders.lanes(cohort, alloc, t, ceilings=ceilings),
    )


def price_ceilings(
    sel: Selection, cohort: list[int], widths: np.ndarray, alloc: np.ndarray, rows: int
) -> np.ndarray:
    """Lane ceilings for a device-allocated cohort; updates `alloc` to the rows they give.

    Maximal ceilings are min(D + 1, W, request limit). A price-aware frontier would rank each
    lane's forecast times its output price; a lane to which it gives fewer rows than the
    device's own frontier has its ceiling lowered to that many, so the rows it would take
    go to the lanes prices favour, while those keep maximal ceilings and the device's
    confidence still allocates among them. Equal prices rank like the device: every ceiling
    stays maximal. (With equal confidences the device would otherwise give every tie to the
    lowest slot, every round.)
    """
    decoders = sel.decoders
    members = np.array(cohort, dtype=np.intp)
    idx = members[np.argsort(decoders.slots[members], kind="stable")]
    priced_forecast = decoders.output_price[idx, None] * decoders.forecast[idx]
    priced = allocate_cohort_rows(priced_forecast, widths[idx], rows)
    ceilings = widths.copy()
    ceilings[idx] = np.where(priced < alloc[idx], priced, widths[idx])
    if np.array_equal(ceilings[idx], widths[idx]):
        return ceilings
    alloc[idx] = allocate_cohort_rows(decoders.forecast[idx], ceilings[idx], rows)
    return ceilings
