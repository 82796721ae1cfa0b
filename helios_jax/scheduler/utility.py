"""Value arithmetic and cohort selection (spec, "Useful service and selection").

For a graph of duration T (ms) the selector maximises

    score = (sum of expected priced token and delivery service
             + sum over served decoders of c_i * sigma_i * (A_i + T)) / T
            - T/2 * sum over active decoders of c_i

where A_i is the age of decoder i's last visible output and sigma_i its reference interval:
with K delivery-bearing streams in a family of k, choose the measured graph minimising
T_g / min(B_g, k); then sigma = K * T_g / min(B_g, k). Terminal rows enter the same way with
terminal_value, terminal_age_price and the snapshot family's reference interval, and their age
coefficient joins the common waiting cost. Every value of one decision is multiplied by
exp(-log_scale) so that large prices stay representable; the shared factor changes no ordering.

Because duration and excluded-stream waiting cost do not depend on cohort membership, a lane's
contribution is additive for a fixed program. The cohort solvers here use that:

- unconstrained programs take their highest lane values (sorted prefix sums, in the policy's
  lane tables, ``policy.tables.DecoderTable.table``);
- :func:`fixed_ragged`: a host-allocated ragged program with complete prefixes chooses the
  highest-value cohort fitting both B and P (an exact capacity problem over weight classes);
- :func:`adaptive_ragged`: adaptive ragged programs evaluate cohort prefixes under three bounded
  orderings (total lane value, pending-token delivery value, value per target row), each priced
  by its resulting causal prefix allocation; this does not enumerate every cohort;
- :func:`best_pair`: a prerequisite followed by inference, solved exactly with sorted prefix
  sums over k, the number of newly ready rows in the following graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler import service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import Phase, RequestView, assemble

REL_TIE = 1e-9


def nearly_equal(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TIE * max(1.0, abs(a), abs(b))


def reference_interval(k: int, graphs: list[GraphDescriptor], costs: CostModel) -> float:
    """sigma = K * T / min(B, k) over the measured graph minimising T / min(B, k); 0 if none.

    With one decode mode loaded there is one family, so k = K (RESOLUTIONS.md, 5). Stale
    estimates stay usable; unknown ones are never invented.
    """
    return service.batch_feasible_interval(
        k, [(g.batch_capacity, t) for g in graphs if (t := costs.estimate_ms(g.key)) is not None]
    )


@dataclasses.dataclass(frozen=True)
class Decision:
    """Decision-wide quantities shared by every candidate of one selection."""

    log_scale: float  # L: scaled = unscaled * exp(-L)
    decode_age: float  # scaled c for decoders
    terminal_age: float  # scaled c for terminal rows
    terminal_value: float  # scaled terminal_value
    sigma_decode: float  # ms
    sigma_terminal: float  # ms
    waiting: float  # scaled sum of c over active decoders and terminal rows
    alpha: float

    @classmethod
    def build(
        cls,
        views: list[RequestView],
        policy: PolicyConfig,
        *,
        sigma_decode: float,
        sigma_terminal: float,
        counts: tuple[int, int] | None = None,
        log_scale: float = 0.0,
    ) -> Decision:
        """`counts`: :func:`population` of `views`, when the caller has it; `log_scale`: the
        largest finite log price of views priced elsewhere (decoders' columns), and 0."""
        n_dec, n_term = population(views) if counts is None else counts
        # log_scale: the largest finite log price, and 0
        finite = math.isfinite
        for v in views:
            for x in (v.log_prefill_price, v.log_output_price, v.log_delivery_price):
                if x > log_scale and finite(x):
                    log_scale = x
        if policy.terminal_value > 0 and n_term:
            log_scale = max(log_scale, math.log(policy.terminal_value))
        scale = math.exp(-log_scale)
        c_dec = policy.decode_age_price * scale
        c_term = policy.terminal_age_price * scale
        return assemble(
            cls,
            log_scale=log_scale,
            decode_age=c_dec,
            terminal_age=c_term,
            terminal_value=policy.terminal_value * scale,
            sigma_decode=sigma_decode,
            sigma_terminal=sigma_terminal,
            waiting=n_dec * c_dec + n_term * c_term,
            alpha=policy.adaptive_verification_alpha,
        )

    def scaled(self, log_value: float | np.ndarray) -> np.ndarray:
        return np.exp(np.asarray(log_value) - self.log_scale)

    def rate(self, numerator: float, duration_ms: float) -> float:
        """(value) / T - T/2 * (common waiting coefficient)."""
        return numerator / duration_ms - 0.5 * duration_ms * self.waiting

    def sequence_rate(self, numerator: float, total_ms: float) -> float:
        return numerator / total_ms - 0.5 * total_ms * self.waiting

    def terminal_lane(self, age_ms: float | np.ndarray, until_ms: float) -> np.ndarray:
        """terminal_value + c * sigma * (A + T) for terminal rows."""
        return self.terminal_value + self.terminal_age * self.sigma_terminal * (np.asarray(age_ms) + until_ms)


def population(views: Sequence[RequestView]) -> tuple[int, int]:
    """(delivery-bearing views, terminal views): the decision's K and its terminal rows."""
    n_dec = n_term = 0
    for v in views:
        phase = v.phase
        if phase is Phase.DECODE or (phase is Phase.BLOCKED and v.enables is Phase.DECODE):
            n_dec += 1
        elif phase is Phase.TERMINAL:
            n_term += 1
    return n_dec, n_term


class WeightClass(NamedTuple):
    """The lanes of one weight (target rows) in a ragged table, best first."""

    weight: int
    lanes: np.ndarray  # i64[m] lane indices by value, descending (stable)
    prefix: np.ndarray  # f64[m + 1] sums of their values


def ragged_table(values: np.ndarray, weights: np.ndarray, batch: int, rows: int) -> RaggedTable:
    """Best totals of cohorts of exactly j lanes using exactly r target rows, for every j and r.

    Exact: lanes are grouped by weight (target rows), each group contributes its best j lanes,
    and a dynamic programme over (lanes used, rows used) combines the groups. Weights are
    bounded by the program width, so the table is at most (B + 1) x (P + 1) per weight class.
    Cohorts of equal total that mix the classes differently (a tie the spec leaves open,
    RESOLUTIONS 39) go by weight: the fewest lanes of the heaviest class, then of the next
    heaviest (a class's lanes replace lighter ones' only where strictly better).
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    groups = []
    for w in np.unique(weights):
        idx = np.flatnonzero(weights == w)
        idx = idx[np.argsort(-values[idx], kind="stable")]
        groups.append(WeightClass(int(w), idx, np.concatenate([[0.0], np.cumsum(values[idx])])))
    neg = -np.inf
    dp = np.full((batch + 1, rows + 1), neg)
    dp[0, 0] = 0.0
    choices = []
    for w, idx, prefix in groups:
        best = dp.copy()
        pick = np.zeros(dp.shape, dtype=np.int64)
        for j in range(1, min(len(idx), batch) + 1):
            if j * w > rows:
                break
            cand = np.full(dp.shape, neg)
            cand[j:, j * w :] = dp[: batch + 1 - j, : rows + 1 - j * w] + prefix[j]
            better = cand > best
            best[better] = cand[better]
            pick[better] = j
        choices.append(pick)
        dp = best
    return RaggedTable(dp, groups, choices)


@dataclasses.dataclass(frozen=True)
class RaggedTable:
    """``ragged_table``'s result: ``best[j, r]`` (-inf where no cohort) and how to rebuild it."""

    best: np.ndarray  # f64[B + 1, P + 1]
    groups: list[WeightClass]
    choices: list[np.ndarray]  # per class: i64[B + 1, P + 1] lanes it contributes to best[j, r]

    def cohort(self, count: int, used: int) -> list[int]:
        """The lane indices behind ``best[count, used]``."""
        chosen = []
        for (w, idx, _), pick in zip(reversed(self.groups), reversed(self.choices)):
            j = int(pick[count, used])
            chosen.extend(idx[:j].tolist())
            count, used = count - j, used - j * w
        return sorted(chosen)


def fixed_ragged(values: np.ndarray, weights: np.ndarray, batch: int, rows: int) -> tuple[float, list[int]]:
    """Best cohort of at most `batch` lanes whose weights sum to at most `rows` (exact).

    Returns (total value, chosen lane indices) with an empty cohort when nothing fits.
    """
    table = ragged_table(values, weights, batch, rows)
    flat = int(np.argmax(table.best))
    count, used = divmod(flat, rows + 1)
    return float(table.best.flat[flat]), table.cohort(count, used)


class RaggedPairCohort(NamedTuple):
    """``best_ragged_pair``'s choice."""

    total: float
    new: list[int]  # newly ready lanes the following program serves
    ready: list[int]  # already ready lanes it serves
    terminal_count: int  # terminal rows filling the prerequisite (the best ones)


def best_ragged_pair(
    new_vals: np.ndarray,
    new_weights: np.ndarray,
    ready_vals: np.ndarray,
    ready_weights: np.ndarray,
    terminal: np.ndarray,
    prereq_batch: int,
    follow_batch: int,
    rows: int,
    *,
    min_new: int = 1,
) -> RaggedPairCohort | None:
    """Exact cohorts for a prerequisite followed by a host-allocated ragged program.

    As :func:`best_pair`, with the following program's aggregate row capacity `rows` binding
    too: for each k newly ready rows (at least `min_new`, at most the prerequisite's batch), the
    best k newly ready lanes using r1 rows, plus the best already ready lanes within the batch
    left and P - r1 rows, plus the best terminal rows filling the prerequisite.

    Returns a :class:`RaggedPairCohort`, or None when no k is feasible.
    """
    k_max = min(len(new_vals), prereq_batch, follow_batch)
    if k_max < min_new:
        return None
    new_t = ragged_table(new_vals, new_weights, k_max, rows)
    ready_t = ragged_table(ready_vals, ready_weights, follow_batch, rows)
    term_s = np.sort(np.asarray(terminal, dtype=np.float64))[::-1]
    pt = np.concatenate([[0.0], np.cumsum(term_s)])
    best: RaggedPairCohort | None = None
    for k in range(min_new, k_max + 1):
        jr_max = follow_batch - k
        ready = ready_t.best[: jr_max + 1]  # [j, r]
        j_at = np.argmax(ready, axis=0)
        by_rows = ready[j_at, np.arange(rows + 1)]
        # the best ready total using at most r rows, and where it is attained
        r_at = np.zeros(rows + 1, dtype=np.int64)
        run = np.full(rows + 1, -np.inf)
        for r in range(rows + 1):
            if r and run[r - 1] >= by_rows[r]:
                run[r], r_at[r] = run[r - 1], r_at[r - 1]
            else:
                run[r], r_at[r] = by_rows[r], r
        totals = new_t.best[k] + run[::-1]
        r1 = int(np.argmax(totals))
        total = float(totals[r1]) + float(pt[min(prereq_batch - k, len(term_s))])
        if not np.isfinite(total):
            continue
        if best is None or total > best.total + REL_TIE * max(1.0, abs(best.total)):
            r2 = int(r_at[rows - r1])
            best = RaggedPairCohort(
                total,
                new_t.cohort(k, r1),
                ready_t.cohort(int(j_at[r2]), r2),
                int(min(prereq_batch - k, len(term_s))),
            )
    return best


class AdaptiveCohort(NamedTuple):
    """``adaptive_ragged``'s choice."""

    total: float
    cohort: list[int]  # lane indices, ascending; empty when no prefix is allowed
    rows: np.ndarray  # i64[n] allocated target rows per lane (0 outside the cohort)


def adaptive_ragged(
    base: np.ndarray,
    extension: np.ndarray,
    ceilings: np.ndarray,
    alloc_lanes: np.ndarray,
    alloc_depths: np.ndarray,
    batch: int,
    rows: int,
    *,
    new: np.ndarray | None = None,
    new_bonus: np.ndarray | None = None,
) -> AdaptiveCohort:
    """Adaptive ragged cohort selection under the three bounded orderings.

    Args:
      base: f[n] value of each lane's pending row (its value at width one).
      extension: f[n, D] value of each additional row d+1 (prefix d+1 surviving).
      ceilings: i[n] lane ceilings (rows including the pending token).
      alloc_lanes, alloc_depths: the extension rows in allocation order (the device's causal
        frontier, or the host's marginal value), see ``rounds.prefix_allocation_order``.
      batch, rows: the program's B and P.
      new, new_bonus: for a program following a prerequisite: which lanes the prerequisite
        makes ready (bool[n]), and the value added when a cohort holds k of them
        (``new_bonus[k]``: the prerequisite's own rows; -inf where k is not allowed, e.g. k = 0).

    Returns an :class:`AdaptiveCohort`: total value, cohort lane indices, per-lane allocated
    rows; the cohort is empty when no prefix is allowed.
    """
    n = base.shape[0]
    if n == 0:
        return AdaptiveCohort(0.0, [], np.zeros(0, dtype=np.int64))
    depth_mask = np.arange(extension.shape[1])[None, :] < (ceilings[:, None] - 1)
    full = base + np.where(depth_mask, extension, 0.0).sum(axis=1)
    orderings = (
        np.argsort(-full, kind="stable"),
        np.argsort(-base, kind="stable"),
        np.argsort(-(full / ceilings), kind="stable"),
    )
    ext_vals = extension[alloc_lanes, alloc_depths - 1] if alloc_lanes.size else np.zeros(0)
    ms = np.arange(1, min(batch, n, rows) + 1)
    best: AdaptiveCohort | None = None  # ties keep the earlier ordering
    for j, order in enumerate(orderings):
        if _repeats(order, orderings[:j]):
            continue  # the same prefixes as an earlier ordering: a tie, which keeps that one
        taken, totals = _ordering_prefixes(order, base, alloc_lanes, ext_vals, ms, rows, new, new_bonus)
        i = int(np.argmax(totals))
        if not np.isfinite(totals[i]):
            continue
        if best is None or totals[i] > best.total + REL_TIE * max(1.0, abs(best.total)):
            alloc = np.zeros(n, dtype=np.int64)
            alloc[order[: ms[i]]] = 1
            np.add.at(alloc, alloc_lanes[taken[i]], 1)
            best = AdaptiveCohort(float(totals[i]), sorted(order[: ms[i]].tolist()), alloc)
    if best is None:
        return AdaptiveCohort(0.0, [], np.zeros(n, dtype=np.int64))
    return best


def _repeats(order: np.ndarray, earlier: tuple[np.ndarray, ...]) -> bool:
    """`order` equals an earlier ordering (element for element), so its cohorts and totals are
    that ordering's, which can only tie: a later ordering replaces the best only when greater by
    more than ``REL_TIE``, far above any rounding of the same sums."""
    return any(np.array_equal(order, e) for e in earlier)


def _ordering_prefixes(
    order: np.ndarray,
    base: np.ndarray,
    alloc_lanes: np.ndarray,
    ext_vals: np.ndarray,
    ms: np.ndarray,
    rows: int,
    new: np.ndarray | None,
    new_bonus: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The cohorts made of the first m lanes of one ordering, for every m in `ms`.

    A cohort of m lanes holds their pending rows and, of the remaining rows - m, the first
    extension rows in allocation order that belong to its lanes; after a prerequisite it also
    earns ``new_bonus[k]`` for the k newly ready lanes it holds (-inf where k is not allowed).
    Returns (taken, totals): bool[m, items] which allocation items each cohort takes, and f[m]
    its total value.
    """
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    base_prefix = np.concatenate([[0.0], np.cumsum(base[order])])
    member = rank[alloc_lanes][None, :] < ms[:, None]  # [m, items]
    taken = member & (np.cumsum(member, axis=1) <= (rows - ms)[:, None])
    totals = base_prefix[ms] + taken @ ext_vals
    if new is not None and new_bonus is not None:
        k = np.cumsum(new[order])[ms - 1]
        totals = totals + np.where(k < len(new_bonus), new_bonus[np.minimum(k, len(new_bonus) - 1)], -np.inf)
    return taken, totals


class PairCohort(NamedTuple):
    """``best_pair``'s choice: how many rows of each group, each group's best first."""

    total: float
    new_count: int  # newly ready rows the following graph serves
    ready_count: int  # already ready rows filling its remaining capacity
    terminal_count: int  # terminal rows filling the prerequisite's remaining capacity


def best_pair(
    new: np.ndarray,
    ready: np.ndarray,
    terminal: np.ndarray,
    prereq_batch: int,
    follow_batch: int,
    *,
    min_new: int = 1,
) -> PairCohort | None:
    """Exact cohort choice for a fixed prerequisite shape followed by a fixed inference shape.

    Enumerate k, the number of newly ready rows the following graph serves (at least
    `min_new`): take the k largest newly ready contributions, fill the following graph's
    remaining capacity with the largest already ready ones, and the prerequisite's remaining
    capacity with the largest terminal-completion ones. Sorted prefix sums give every k at once.

    Returns a :class:`PairCohort` (total, k, j_ready, j_terminal), or None when no k is feasible.
    """
    return best_pair_of_prefixes(
        descending_prefix(new),
        descending_prefix(ready),
        descending_prefix(terminal),
        prereq_batch,
        follow_batch,
        min_new=min_new,
    )


def descending_prefix(values: np.ndarray) -> np.ndarray:
    """f64[n + 1]: 0 and the running sums of `values` taken largest first."""
    if not len(values):
        return _EMPTY_PREFIX
    return np.concatenate([[0.0], np.cumsum(np.sort(values)[::-1])])


_EMPTY_PREFIX = np.zeros(1)  # descending_prefix of no values (read-only: shared)
_EMPTY_PREFIX.setflags(write=False)


SMALL_PAIR = 8  # best_pair_of_prefixes: fewer k than this are summed one at a time


def _best_pair_few(
    pn: np.ndarray, pr: np.ndarray, pt: np.ndarray, prereq_batch: int, follow_batch: int, k0: int, k1: int
) -> PairCohort:
    """:func:`best_pair_of_prefixes` for k = k0..k1, each total summed as the array form sums it
    ((new + ready) + terminal, IEEE doubles alike) and the first best kept, as ``argmax`` does."""
    last_r, last_t = len(pr) - 1, len(pt) - 1
    best = None
    for k in range(k0, k1 + 1):
        jr, jt = min(follow_batch - k, last_r), min(prereq_batch - k, last_t)
        total = float(pn[k]) + float(pr[jr]) + float(pt[jt])
        if best is None or total > best[0]:
            best = (total, k, jr, jt)
    assert best is not None
    return PairCohort(*best)


def best_pair_of_prefixes(
    pn: np.ndarray,
    pr: np.ndarray,
    pt: np.ndarray,
    prereq_batch: int,
    follow_batch: int,
    *,
    min_new: int,
) -> PairCohort | None:
    """:func:`best_pair` on the groups' :func:`descending_prefix` sums (newly ready, already
    ready, terminal), which a caller may keep for several pairs."""
    k_max = min(len(pn) - 1, prereq_batch, follow_batch)
    if k_max < min_new:
        return None
    if k_max - min_new < SMALL_PAIR:  # a few k: the same sums, one at a time (no array set-up)
        return _best_pair_few(pn, pr, pt, prereq_batch, follow_batch, min_new, k_max)
    ks = np.arange(min_new, k_max + 1)
    jr = np.minimum(follow_batch - ks, len(pr) - 1)
    jt = np.minimum(prereq_batch - ks, len(pt) - 1)
    totals = pn[ks] + pr[jr] + pt[jt]
    i = int(np.argmax(totals))
    return PairCohort(float(totals[i]), int(ks[i]), int(jr[i]), int(jt[i]))
