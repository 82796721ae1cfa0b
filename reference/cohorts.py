"""Exhaustive cohort enumeration: a deliberately naive oracle for the production selector.

For one population and one program it enumerates *every* legal cohort (every subset of
runnable requests within the batch capacity, at most one prompt row for mixed programs) and,
where the host allocates target rows, every legal width vector within the program's width and
aggregate capacity; device-allocated programs get their rows from the naive frontier allocator
in :mod:`helios_jax.reference.prefix_allocation` fed with the requests' confidence forecasts.
Each choice is scored with the spec's objective written out again from first principles:

    (sum of lane values + sum over served decoders of c*sigma*(A + T)) / T - T/2 * sum c

It shares no code with ``helios_jax.scheduler`` beyond the plain data types, so agreement is
evidence. It is exponential on purpose: keep populations small.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference.prefix_allocation import prefix_allocation_naive
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import Phase, RequestView


def prompt_work_naive(v: RequestView, capacity: int) -> int:
    """Largest legal chunk: the biggest n <= capacity that is not inside an atomic span."""
    top = min(capacity, v.prompt_remaining)
    if v.prompt_limit is not None:
        top = min(top, v.prompt_limit)
    for n in range(top, 0, -1):
        if all(not (s < n < e) for s, e in v.atomic_spans):
            return n
    return 0


def _survival(v: RequestView, depth: int) -> list[float]:
    s = [min(1.0, max(0.0, float(x))) for x in list(v.survival)[:depth]]
    s += [0.0] * (depth - len(s))
    for i in range(1, depth):
        s[i] = min(s[i], s[i - 1])
    return s


def _forecast(v: RequestView, depth: int) -> list[float]:
    f = [min(1.0, max(0.0, float(x))) for x in list(v.forecast)[:depth]]
    f += [0.0] * (depth - len(f))
    for i in range(1, depth):
        f[i] = min(f[i], f[i - 1])
    return f


@dataclasses.dataclass
class Objective:
    """The decision-wide quantities, computed naively."""

    views: Sequence[RequestView]
    graphs: Sequence[GraphDescriptor]
    costs: CostModel
    policy: PolicyConfig

    def __post_init__(self):
        logs = [0.0]
        for v in self.views:
            for x in (v.log_prefill_price, v.log_output_price, v.log_delivery_price):
                if math.isfinite(x):
                    logs.append(x)
        if self.policy.terminal_value > 0 and any(v.phase is Phase.TERMINAL for v in self.views):
            logs.append(math.log(self.policy.terminal_value))
        self.log_scale = max(logs)
        self.scale = math.exp(-self.log_scale)
        k = len(
            [
                v
                for v in self.views
                if v.phase is Phase.DECODE or (v.phase is Phase.BLOCKED and v.enables is Phase.DECODE)
            ]
        )
        kt = len([v for v in self.views if v.phase is Phase.TERMINAL])
        self.sigma = self._sigma(
            k,
            [g for g in self.graphs if g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED)],
        )
        self.sigma_t = self._sigma(kt, [g for g in self.graphs if g.kind is GraphKind.SNAPSHOT])
        self.c = self.policy.decode_age_price * self.scale
        self.ct = self.policy.terminal_age_price * self.scale
        self.waiting = k * self.c + kt * self.ct
        self.depth = max([g.proposal_depth for g in self.graphs] + [0])

    def _sigma(self, k: int, graphs) -> float:
        best = None
        for g in graphs:
            t = self.costs.estimate_ms(g.key)
            if t is not None and k > 0:
                x = k * t / min(g.batch_capacity, k)
                best = x if best is None else min(best, x)
        return best or 0.0

    def price(self, log_value: float) -> float:
        return math.exp(log_value - self.log_scale) if math.isfinite(log_value) else 0.0

    def decoder_value(self, v: RequestView, rows: int, t: float) -> float:
        s = _survival(v, self.depth)
        expected = 1.0 + sum(x**self.policy.adaptive_verification_alpha for x in s[: rows - 1])
        return (
            self.price(v.log_output_price) * expected
            + self.price(v.log_delivery_price)
            + self.c * self.sigma * (v.age_ms + t)
        )

    def steps_value(self, v: RequestView, steps: int, t: float) -> float:
        """A K-step decode lane: `steps` certain tokens, one delivered burst, its age term."""
        return (
            self.price(v.log_output_price) * steps
            + self.price(v.log_delivery_price)
            + self.c * self.sigma * (v.age_ms + t)
        )

    def prompt_value(self, v: RequestView, n: int) -> float:
        value = self.price(v.log_prefill_price) * n
        if n == v.prompt_remaining:
            value += self.price(v.log_output_price)
        return value

    def terminal_value(self, v: RequestView, t: float) -> float:
        return self.policy.terminal_value * self.scale + self.ct * self.sigma_t * (v.terminal_age_ms + t)

    def rate(self, numerator: float, t: float | None) -> float:
        if t is None:
            return numerator
        return numerator / t - 0.5 * t * self.waiting


def _lane_limit(v: RequestView, g: GraphDescriptor) -> int:
    if g.steps > 1:  # K-step decode: K, output and context left, a width limit; no proposals
        limit = min(g.steps, v.output_remaining, v.context_remaining)
        return max(1, limit if v.width_limit is None else min(limit, v.width_limit))
    limit = min(g.token_capacity, g.proposal_depth + 1, v.output_remaining, v.context_remaining)
    if v.copy_limit is not None:
        limit = min(limit, v.copy_limit + 1)
    if v.width_limit is not None:
        limit = min(limit, v.width_limit)
    return max(1, limit)


def _subsets(items, max_size: int):
    for size in range(1, min(max_size, len(items)) + 1):
        yield from itertools.combinations(items, size)


def _caps(g: GraphDescriptor):
    return (
        g.batch_capacity,
        g.token_capacity,
        g.target_capacity,
        g.prefill_capacity,
        g.image_capacity,
        g.steps,
    )


def _host_free(g: GraphDescriptor, mode: DecodeMode) -> bool:
    """Whether the host may choose any width up to a lane's bound on g (adaptive host rows)."""
    device = g.kind is GraphKind.SPECULATIVE and g.allocation is Allocation.PREFIX_LIMIT
    return mode is DecodeMode.ADAPTIVE and g.token_capacity > 1 and not device


def _prompt_cohorts(g: GraphDescriptor, prompts):
    """Every cohort of up to B prompt rows [(view, tokens)] of prefill program g's family."""
    scored = g.kind is GraphKind.SCORED_PREFILL
    rows = [(v, prompt_work_naive(v, g.token_capacity)) for v in prompts if v.needs_scores == scored]
    return _subsets([(v, n) for v, n in rows if n > 0], g.batch_capacity)


def _carries_rows(h: GraphDescriptor, g: GraphDescriptor, rows) -> bool:
    """Whether prefill program h runs the same prompt rows [(view, tokens)] with the same work."""
    return (
        h.kind is g.kind
        and len(rows) <= h.batch_capacity
        and all(prompt_work_naive(v, h.token_capacity) == n for v, n in rows)
    )


def _carries(h: GraphDescriptor, g: GraphDescriptor, mode: DecodeMode, prompt, decoders) -> bool:
    """Whether program h can run exactly the same cohort with the same per-request work.

    prompt: (view, tokens) or None; decoders: [(view, rows)] where rows are host query lengths,
    or device ceilings for prefix_limit programs, or a K-step program's steps (one target row
    per step, so no aggregate row capacity binds them).
    """
    if h.kind is not g.kind:
        return False
    if len(decoders) + (1 if prompt else 0) > h.batch_capacity:
        return False
    if prompt is not None:
        cap = h.prefill_capacity if h.kind is GraphKind.MIXED else h.token_capacity
        if prompt_work_naive(prompt[0], cap) != prompt[1]:
            return False
    if decoders:
        if h.proposal_depth != g.proposal_depth:
            return False
        if (h.allocation is Allocation.PREFIX_LIMIT) != (g.allocation is Allocation.PREFIX_LIMIT):
            return False
        for v, rows in decoders:
            bound = _lane_limit(v, h)
            if rows > bound or (not _host_free(h, mode) and rows != bound):
                return False
        if (
            h.kind is GraphKind.SPECULATIVE
            and h.steps == 1
            and h.allocation is not Allocation.PREFIX_LIMIT
            and sum(r for _, r in decoders) > h.target_capacity
        ):
            return False
    return True


def best_for_graph(obj: Objective, g: GraphDescriptor, mode: DecodeMode) -> float | None:
    """The best score of any legal, non-dominated cohort and width vector on program `g`.

    A choice is dominated (the spec's filter) when another program of the same kind whose
    capacities are all at most g's, one strictly smaller, runs the same cohort with the same
    per-request work. None: no legal choice.
    """
    t = obj.costs.estimate_ms(g.key)
    tz = 0.0 if t is None else t
    runnable = [v for v in obj.views if v.runnable]
    decoders = [v for v in runnable if v.phase is Phase.DECODE]
    prompts = [v for v in runnable if v.phase is Phase.PREFILL]
    smaller = [
        h
        for h in obj.graphs
        if h is not g and _caps(h) != _caps(g) and all(x <= y for x, y in zip(_caps(h), _caps(g)))
    ]
    best = None

    def consider(numerator: float, prompt=None, lanes=(), terminals=0, rows=()):
        nonlocal best
        lanes = list(lanes)  # once: every smaller program is asked about the same cohort
        for h in smaller:
            if g.kind is GraphKind.SNAPSHOT:
                if h.kind is g.kind and terminals <= h.batch_capacity:
                    return
            elif g.kind.is_prefill:
                if _carries_rows(h, g, rows):
                    return
            elif _carries(h, g, mode, prompt, lanes):
                return
        score = obj.rate(numerator, t)
        if best is None or score > best:
            best = score

    if g.kind.is_prefill:  # every cohort of up to B prompt rows (B > 1: multi-prompt prefill)
        for cohort in _prompt_cohorts(g, prompts):
            consider(sum(obj.prompt_value(v, n) for v, n in cohort), rows=cohort)
    elif g.kind is GraphKind.SNAPSHOT:
        terminals = [v for v in runnable if v.phase is Phase.TERMINAL]
        for cohort in _subsets(terminals, g.batch_capacity):
            consider(sum(obj.terminal_value(v, tz) for v in cohort), terminals=len(cohort))
    elif g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE):
        for cohort in _subsets(decoders, g.batch_capacity):
            for numerator, work in _decoder_numerators(obj, g, cohort, mode, tz, g.target_capacity):
                consider(numerator, lanes=zip(cohort, work))
    elif g.kind is GraphKind.MIXED:
        for cohort in _subsets(decoders, g.batch_capacity):
            for numerator, work in _decoder_numerators(obj, g, cohort, mode, tz, None):
                consider(numerator, lanes=zip(cohort, work))
        for p in prompts:
            n = prompt_work_naive(p, g.prefill_capacity)
            if n <= 0 or p.needs_scores:
                continue
            pv = obj.prompt_value(p, n)
            consider(pv, prompt=(p, n))
            for cohort in _subsets(decoders, g.batch_capacity - 1):
                for numerator, work in _decoder_numerators(obj, g, cohort, mode, tz, None):
                    consider(pv + numerator, prompt=(p, n), lanes=zip(cohort, work))
    return best


def _decoder_numerators(
    obj: Objective, g: GraphDescriptor, cohort, mode: DecodeMode, t: float, rows: int | None
):
    """(numerator, per-lane work) of every legal row assignment of `cohort` on `g`.

    Work is the host query length per lane, or the device ceiling for prefix_limit programs
    (rows: the aggregate limit P, None for mixed rows).
    """
    limits = [_lane_limit(v, g) for v in cohort]
    if g.steps > 1:  # every lane takes all its steps
        yield sum(obj.steps_value(v, k, t) for v, k in zip(cohort, limits)), limits
        return
    if (
        g.kind is GraphKind.SPECULATIVE
        and g.allocation is Allocation.PREFIX_LIMIT
        and mode is DecodeMode.ADAPTIVE
    ):
        # Lane ceilings may be anything in 1..limit: with ceilings c summing to at most P the
        # device allocates exactly c, and every allocation it can make sums to at most P, so
        # the reachable allocations are exactly the width vectors fitting P.
        if len(cohort) > g.target_capacity:
            return
        for widths in itertools.product(*[range(1, w + 1) for w in limits]):
            if sum(widths) <= g.target_capacity:
                yield sum(obj.decoder_value(v, w, t) for v, w in zip(cohort, widths)), list(widths)
        return
    if g.kind is GraphKind.SPECULATIVE and g.allocation is Allocation.PREFIX_LIMIT:
        if len(cohort) > g.target_capacity:
            return
        probs = [_forecast(v, g.proposal_depth) for v in cohort]
        slots = sorted(range(len(cohort)), key=lambda i: cohort[i].slot)
        alloc_sorted = prefix_allocation_naive(
            [probs[i] for i in slots], [limits[i] for i in slots], [True] * len(cohort), g.target_capacity
        )
        alloc = [0] * len(cohort)
        for pos, i in enumerate(slots):
            alloc[i] = int(alloc_sorted[pos])
        yield sum(obj.decoder_value(v, w, t) for v, w in zip(cohort, alloc)), limits
        return
    if _host_free(g, mode):
        choices = [range(1, w + 1) for w in limits]
    else:
        choices = [(w,) for w in limits]  # complete prefixes, shortened only by request limits
    for widths in itertools.product(*choices):
        if rows is not None and sum(widths) > rows:
            continue
        yield sum(obj.decoder_value(v, w, t) for v, w in zip(cohort, widths)), list(widths)


def exhaustive_best(views, graphs, costs, policy, mode) -> dict:
    """{graph key: best score} over every program with at least one legal cohort."""
    obj = Objective(views, graphs, costs, policy)
    out = {}
    for g in graphs:
        score = best_for_graph(obj, g, DecodeMode(mode))
        if score is not None:
            out[g.key] = score
    return out


def best_pair_naive(
    new: Sequence[float],
    ready: Sequence[float],
    terminal: Sequence[float],
    prereq_batch: int,
    follow_batch: int,
    *,
    min_new: int = 1,
) -> float | None:
    """Every subset choice for a fixed prerequisite/following pair (the oracle of best_pair)."""
    best = None
    n_idx = range(len(new))
    for kn in range(min_new, min(len(new), prereq_batch, follow_batch) + 1):
        for nset in itertools.combinations(n_idx, kn):
            for kr in range(0, min(len(ready), follow_batch - kn) + 1):
                for rset in itertools.combinations(range(len(ready)), kr):
                    for kt in range(0, min(len(terminal), prereq_batch - kn) + 1):
                        for tset in itertools.combinations(range(len(terminal)), kt):
                            total = (
                                sum(new[i] for i in nset)
                                + sum(ready[i] for i in rset)
                                + sum(terminal[i] for i in tset)
                            )
                            if best is None or total > best:
                                best = total
    return best
