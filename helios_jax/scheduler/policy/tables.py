"""Lane tables: one selection's runnable decoders and prompts as arrays.

Every family scores the same requests against many programs. :class:`DecoderTable` holds the
parts of each decoder's lane value that do not depend on the program's duration T, and builds
(cached per program width and depth) the :class:`LaneTable` that the cohort solvers rank;
:class:`PromptTable` holds each prompt's work and value per prompt capacity. Prices are scaled
by the decision's shared factor (``utility.Decision.scaled``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from helios_jax.scheduler import utility
from helios_jax.scheduler.speculation import monotone, monotone_expected_output_table
from helios_jax.scheduler.view import Lane, LaneRole, RequestView, assemble
from helios_jax.scheduler.view_columns import DecoderColumns


def padded_prefixes(prefixes: Sequence[np.ndarray], depth: int) -> np.ndarray:
    """Per-request prefix estimates as one monotone f64[len(prefixes), depth] array, zero-padded."""
    if prefixes and depth:  # the common case: rows of one length, stacked at once
        try:
            stacked = np.array(prefixes, dtype=np.float64)
        except ValueError:  # rows of different lengths
            stacked = None
        if stacked is not None and stacked.shape == (len(prefixes), depth):
            return monotone(stacked)
    out = np.zeros((len(prefixes), depth))
    for i, r in enumerate(prefixes):
        r = np.asarray(r, dtype=np.float64).reshape(-1)[:depth]
        out[i, : r.size] = r
    return monotone(out) if depth else out


_ONE_LANE = np.zeros(1, dtype=np.intp)
_ONE_LANE.setflags(write=False)


class computed_once:
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first
    read, which is every read here: a table or population lives for one decision and each of its
    cached values is read once or twice, or never; 3.12 dropped the lock)."""

    def __init__(self, func: Callable):
        self.func = func
        self.__doc__ = func.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)  # later reads find it before this
        return value


class LaneTable(NamedTuple):
    """The decoders' lanes on programs of one width and depth, ranked for the cohort solvers."""

    widths: np.ndarray  # i64[n] target rows per lane (pending token included)
    values: np.ndarray  # f64[n] lane values at T = 0
    order: np.ndarray  # i64[n] lanes best first; ties: less recently used, then lower slot
    prefix_values: np.ndarray  # f64[n + 1] sums of `values` along `order`
    work_key: bytes  # `widths` as bytes: the lanes' work in dominance signatures


class DecoderTable:
    """Runnable decoding requests as arrays (the T-independent parts of their lane values)."""

    rids: np.ndarray
    slots: np.ndarray
    last_selected_ns: np.ndarray
    output_price: np.ndarray
    delivery_price: np.ndarray
    row_floor: np.ndarray  # i64[n]: each lane's row limit, at least one
    _rows: np.ndarray  # i64[n]: 0..n-1, the lane index of lane_values' gather
    delivery_value: np.ndarray
    age_value_per_ms: float

    def __init__(
        self,
        decoders: DecoderColumns | Sequence[RequestView],
        decision: utility.Decision,
        max_width: int,
        depth: int,
        base: DecoderTable | None = None,
    ):
        """`decoders`: the lanes' requests, as columns or as views. `base`: a table of the same
        decision whose decoders differ from these only in their survival and optimistic
        estimates (an acceptance probe's); every part of it that does not read survival is
        shared (it must list the same requests in the same order)."""
        if not isinstance(decoders, DecoderColumns):
            decoders = DecoderColumns.of(decoders)
        self.columns = decoders
        count = self.count = decoders.count
        self.decision = decision
        self.depth = depth
        if base is not None and base.depth == depth and np.array_equal(base.rids, decoders.rid):
            self.rids, self.slots, self.last_selected_ns = base.rids, base.slots, base.last_selected_ns
            self.output_price, self.delivery_price = base.output_price, base.delivery_price
            self.row_floor, self._rows = base.row_floor, base._rows
            self.delivery_value, self.age_value_per_ms = base.delivery_value, base.age_value_per_ms
            if "forecast" in base.__dict__:  # the views' forecasts are the base's
                self.forecast = base.forecast
        else:
            self._request_parts(decoders, decision)
        self.survival = padded_prefixes(decoders.survival, depth)  # f64[n, D], monotone
        # f64[n, max_width + 1]: expected committed tokens at each width
        self.expected_output = (
            monotone_expected_output_table(self.survival, max_width, decision.alpha)
            if count
            else np.zeros((0, max_width + 1))
        )
        self._tables: dict[tuple[int, int], LaneTable] = {}

    @computed_once
    def forecast(self) -> np.ndarray:
        """f64[n, D]: the joint prefix probabilities the device allocation ranks rows by (read
        by device-allocated ragged programs only, so built on the first read)."""
        return padded_prefixes(self.columns.forecast, self.depth)

    @computed_once
    def extension_value(self) -> np.ndarray:
        """f64[n, D]: value of target row d + 1 (prefix d + 1 surviving); ragged programs' only."""
        return self.output_price[:, None] * self.survival**self.decision.alpha

    def _request_parts(self, decoders: DecoderColumns, decision: utility.Decision) -> None:
        """Everything but the survival-dependent arrays: identities, prices, limits."""
        self.rids, self.slots, self.last_selected_ns = decoders.rid, decoders.slot, decoders.last_selected_ns
        self.output_price, self.delivery_price = decision.scaled(decoders.prices[1:])
        age = decoders.age_ms
        # lane_widths' floor, applied once: a row limit is an integer (output, context, copy
        # prefix and width limits)
        self.row_floor = np.maximum(decoders.row_limit, 1)  # a copy of the column
        self._rows = np.arange(decoders.count)
        # c*sigma: value per ms of T per served lane
        self.age_value_per_ms = decision.decode_age * decision.sigma_decode
        # f64[n]: delivery and c*sigma*A, the value a served lane earns besides its tokens at T = 0
        # (a served decoder's age term is c*sigma*(A + T); its c*sigma*T part is the row's slope)
        self.delivery_value = self.delivery_price + self.age_value_per_ms * age

    def lane_widths(self, width: int, depth: int) -> np.ndarray:
        """Per-lane target rows: program width, proposals, output limit and context, at least one
        (a generation program's `width` is at least one, so max(min(limit, cap), 1) is
        min(max(limit, 1), cap) with the floor taken once per table)."""
        return np.minimum(self.row_floor, min(width, depth + 1))

    def lane_values(self, widths: np.ndarray) -> np.ndarray:
        return self.output_price * self.expected_output[self._rows, widths] + self.delivery_value

    def table(self, width: int, depth: int) -> LaneTable:
        """The lanes on programs of this width and depth, cached.

        Equal values rank the less recently used request first, then the lower slot.
        """
        hit = self._tables.get((width, depth))
        if hit is None:
            widths = self.lane_widths(width, depth)
            values = self.lane_values(widths)
            if self.count == 1:  # one lane: its own order and sum (no sort, no running sum)
                order, prefix = _ONE_LANE, np.array([0.0, values[0]])
            else:
                order = np.lexsort((self.slots, self.last_selected_ns, -values))
                prefix = np.concatenate([[0.0], np.cumsum(values[order])])
            hit = self._tables[(width, depth)] = LaneTable(widths, values, order, prefix, widths.tobytes())
        return hit

    def lanes(
        self, idx: Iterable[int], rows: np.ndarray, until_ms: float, *, ceilings: np.ndarray | None = None
    ) -> list[Lane]:
        """DECODE lanes: host query lengths `rows`, or device `ceilings` with predicted `rows`."""
        out = []
        for i in idx:
            i = int(i)
            expected = float(self.expected_output[i, int(rows[i])])
            value = float(
                self.output_price[i] * expected + self.delivery_value[i] + self.age_value_per_ms * until_ms
            )
            # Every field, without the frozen constructor's dispatch (test_plan_cost_bounds).
            lane = assemble(
                Lane,
                rid=int(self.rids[i]),
                slot=int(self.slots[i]),
                role=LaneRole.DECODE,
                prompt_tokens=0,
                query_length=0 if ceilings is not None else int(rows[i]),
                ceiling=int(ceilings[i]) if ceilings is not None else 0,
                expected_tokens=expected,
                value=value,
            )
            out.append(lane)
        return out


class PromptTable:
    """Runnable requests with uncached prompt tokens, vectorised over prompt capacities."""

    def __init__(self, views: list[RequestView], decision: utility.Decision):
        self.views = views
        self.count = len(views)
        self._work: dict[int, np.ndarray] = {}
        self._values: dict[int, np.ndarray] = {}
        if not views:  # no prompt (a decode-only decision): the arrays below, empty and read-only
            self.__dict__.update(_NO_PROMPTS)
            return
        self.rids = np.array([v.rid for v in views], dtype=np.int64)
        self.last_selected_ns = np.array([v.last_selected_ns for v in views], dtype=np.int64)
        self.prefill_price = decision.scaled(np.array([v.log_prefill_price for v in views], dtype=np.float64))
        self.output_price = decision.scaled(np.array([v.log_output_price for v in views], dtype=np.float64))
        self.prompt_remaining = np.array([v.prompt_remaining for v in views], dtype=np.int64)
        self.prompt_limit = np.array(
            [v.prompt_remaining if v.prompt_limit is None else v.prompt_limit for v in views], dtype=np.int64
        )
        self.needs_scores = np.array([v.needs_scores for v in views], dtype=bool)
        self.span_rows = [i for i, v in enumerate(views) if v.atomic_spans]  # rows with atomic image spans
        endpoint = np.array(
            [v.prompt_remaining if v.endpoint is None else v.endpoint for v in views], dtype=np.int64
        )
        # i64[n]: tokens to the next message or prompt endpoint, within what a chunk may consume
        self.endpoint = np.minimum(np.minimum(endpoint, self.prompt_remaining), self.prompt_limit)

    def work(self, capacity: int) -> np.ndarray:
        """i64[n]: prompt tokens each request's chunk of `capacity` consumes."""
        hit = self._work.get(capacity)
        if hit is None:
            hit = np.minimum(np.minimum(self.prompt_remaining, self.prompt_limit), capacity)
            for i in self.span_rows:
                hit[i] = self.views[i].prompt_work(capacity)
            self._work[capacity] = hit
        return hit

    def values(self, capacity: int) -> np.ndarray:
        """f64[n]: priced prompt tokens, plus the output price when the chunk ends the prompt."""
        hit = self._values.get(capacity)
        if hit is None:
            n = self.work(capacity)
            ends = np.where(n == self.prompt_remaining, self.output_price, 0.0)
            hit = np.where(n > 0, self.prefill_price * n + ends, 0.0)
            self._values[capacity] = hit
        return hit

    def rows_at(self, capacities: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`work` and :meth:`values` at several capacities as [k, n] matrices in one pass
        (the same elementwise arithmetic), kept per capacity for them as well."""
        caps = np.array(capacities, dtype=np.int64)
        work = np.minimum(np.minimum(self.prompt_remaining, self.prompt_limit)[None, :], caps[:, None])
        for i in self.span_rows:
            work[:, i] = [self.views[i].prompt_work(c) for c in capacities]
        ends = np.where(work == self.prompt_remaining, self.output_price, 0.0)
        values = np.where(work > 0, self.prefill_price * work + ends, 0.0)
        for j, c in enumerate(capacities):
            self._work.setdefault(c, work[j])
            self._values.setdefault(c, values[j])
        return work, values

    def pick_rows(self, allowed: np.ndarray, values: np.ndarray, work: np.ndarray) -> list[int | None]:
        """:meth:`pick` for each row of [k, n] `allowed`, `values` and `work` (each row one
        capacity's), the values and thresholds compared elementwise in one pass."""
        vals = np.where(allowed, values, -np.inf)
        top = vals.max(axis=1)
        near = allowed & (vals >= (top - utility.REL_TIE * np.maximum(1.0, np.abs(top)))[:, None])
        counts, first = near.sum(axis=1).tolist(), near.argmax(axis=1).tolist()
        out: list[int | None] = []
        for j, count in enumerate(counts):
            if count <= 1:  # no allowed row (count 0), or one best
                out.append(first[j] if count else None)
                continue
            tied = np.flatnonzero(near[j])
            keys = (self.rids[tied], -work[j][tied], self.last_selected_ns[tied])
            out.append(int(tied[np.lexsort(keys)[0]]))
        return out

    def excluded_from_exploration(self, smaller_capacities: Iterable[int], work: np.ndarray) -> np.ndarray:
        """Rows for which a smaller prepared capacity consumes the same tokens up to the endpoint."""
        mine = np.minimum(work, self.endpoint)
        excluded = np.zeros(self.count, dtype=bool)
        for capacity in smaller_capacities:
            excluded |= np.minimum(self.work(capacity), self.endpoint) == mine
        return excluded

    def pick(self, allowed: np.ndarray, capacity: int) -> int | None:
        """The best allowed prompt row; equal values prefer the less recently used request."""
        if not allowed.any():
            return None
        vals = np.where(allowed, self.values(capacity), -np.inf)
        top = vals.max()
        tied = np.flatnonzero(allowed & (vals >= top - utility.REL_TIE * max(1.0, abs(top))))
        if tied.size == 1:
            return int(tied[0])
        keys = (self.rids[tied], -self.work(capacity)[tied], self.last_selected_ns[tied])
        return int(tied[np.lexsort(keys)[0]])

    def lane(self, i: int, capacity: int) -> Lane:
        n = int(self.work(capacity)[i])
        return Lane(
            int(self.rids[i]),
            self.views[i].slot,
            LaneRole.PROMPT,
            prompt_tokens=n,
            value=float(self.values(capacity)[i]),
            expected_tokens=1.0 if n == self.prompt_remaining[i] else 0.0,
        )


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# PromptTable's arrays without prompts (what its constructor builds from no views).
_NO_PROMPTS = {
    "rids": _read_only(np.zeros(0, dtype=np.int64)),
    "last_selected_ns": _read_only(np.zeros(0, dtype=np.int64)),
    "prefill_price": _read_only(np.zeros(0, dtype=np.float64)),
    "output_price": _read_only(np.zeros(0, dtype=np.float64)),
    "prompt_remaining": _read_only(np.zeros(0, dtype=np.int64)),
    "prompt_limit": _read_only(np.zeros(0, dtype=np.int64)),
    "needs_scores": _read_only(np.zeros(0, dtype=bool)),
    "span_rows": (),
    "endpoint": _read_only(np.zeros(0, dtype=np.int64)),
}
