"""The decoding residents of one decision as per-slot columns, and the views that hold them.

A decision reads the same few quantities of every decoder (its identity, prices, output age and
row limits, acceptance estimates); the selector's tables (``policy.tables.DecoderTable``, the
K-step limits) want them as arrays. ``pricing.views`` therefore prices the decoders straight
into :class:`DecoderColumns`, a numpy vector per quantity with an entry per decoder (the rows
of two matrices, one of integers and flags and one of floats, each made in one call), and hands
the selector a :class:`ResidentViews`: the other residents' :class:`RequestView` objects beside
those columns. A caller that iterates it (a test, the reference selector, a tie between
candidates) gets every resident's view, in the residents' order, built from the columns once and
kept; the selector's own path never builds the decoders' view objects.

Entry i of every column is one decoder; ``DecoderColumns.of`` builds the same columns from view
objects (the selector's input when a caller passes a list, and the rows a prerequisite enables),
so both inputs reach one table constructor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from helios_jax.scheduler.view import DEFAULT_FIELDS, Phase, RequestView

NO_LIMIT = np.iinfo(np.int64).max  # a width or copy limit that is None
_DECODER_DEFAULTS = {**DEFAULT_FIELDS, "phase": Phase.DECODE}  # the fields a decoder's view leaves


class DecoderColumns:
    """Decoding requests' views as columns: row i of each is one decoder.

    Two matrices hold them, built in one call each from a tuple per decoder (:data:`INTS`,
    :data:`FLOATS`): ``width_cap`` and ``copy_cap`` are :data:`NO_LIMIT` where the view's limit
    is None, ``row_limit`` is ``RequestView.row_limit``, ``output_remaining`` is at least 0, and
    the flags are 0 or 1."""

    rid: np.ndarray  # i64[n]
    slot: np.ndarray  # i64[n]
    last_selected_ns: np.ndarray  # i64[n]
    output_remaining: np.ndarray  # i64[n]
    context_remaining: np.ndarray  # i64[n]
    width_cap: np.ndarray  # i64[n]
    copy_cap: np.ndarray  # i64[n]
    row_limit: np.ndarray  # i64[n]
    age_ms: np.ndarray  # f64[n]
    prices: np.ndarray  # f64[3, n]: log prefill, output and delivery prices
    survival: list[np.ndarray]
    optimistic: list[np.ndarray]
    forecast: list[np.ndarray]

    def __init__(
        self,
        ints: np.ndarray,
        floats: np.ndarray,
        estimates: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]],
    ):
        """`ints`: i64[len(INTS), n]; `floats`: f64[len(FLOATS), n]; `estimates`: (survival,
        optimistic, forecast), a list each."""
        self.ints, self.floats = ints, floats
        (
            self.rid,
            self.slot,
            self.last_selected_ns,
            self.output_remaining,
            self.context_remaining,
            self.width_cap,
            self.copy_cap,
            self.row_limit,
            self._runnable,
            self._host_mask,
        ) = ints
        self.age_ms, self.prices = floats[0], floats[1:]
        self.survival, self.optimistic, self.forecast = estimates
        self.count = ints.shape[1]

    @classmethod
    def build(
        cls,
        ints: Sequence[tuple[float, ...]],
        floats: Sequence[tuple[float, ...]],
        estimates: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]],
    ) -> DecoderColumns:
        """The columns of one tuple of :data:`INTS` (integers and flags) and one of
        :data:`FLOATS` per decoder."""
        if not ints:
            return cls(_NO_INTS, _NO_FLOATS, estimates)
        return cls(np.array(ints, dtype=np.int64).T, np.array(floats, dtype=np.float64).T, estimates)

    @classmethod
    def of(cls, views: Sequence[RequestView]) -> DecoderColumns:
        """The columns of decoder-like views (a decoder's, or a blocked request's it enables)."""
        ints = [
            (
                v.rid,
                v.slot,
                v.last_selected_ns,
                v.output_remaining,
                v.context_remaining,
                NO_LIMIT if v.width_limit is None else v.width_limit,
                NO_LIMIT if v.copy_limit is None else v.copy_limit,
                v.row_limit,
                v.runnable,
                v.host_mask,
            )
            for v in views
        ]
        floats = [(v.age_ms, v.log_prefill_price, v.log_output_price, v.log_delivery_price) for v in views]
        estimates = [v.survival for v in views], [v.optimistic for v in views], [v.forecast for v in views]
        return cls.build(ints, floats, estimates)

    @property
    def runnable(self) -> np.ndarray:
        """bool[n]: output left (a decoder's view is runnable while any is)."""
        return self._runnable != 0

    @property
    def host_mask(self) -> np.ndarray:
        """bool[n]: its samples take a host token mask (never a lane of a K-step program)."""
        return self._host_mask != 0

    def take(self, idx: np.ndarray) -> DecoderColumns:
        """The rows `idx`, in that order."""
        rows = idx.tolist()  # Python ints: indexing a list by numpy ones is slower
        estimates = (
            [self.survival[i] for i in rows],
            [self.optimistic[i] for i in rows],
            [self.forecast[i] for i in rows],
        )
        return DecoderColumns(self.ints[:, idx], self.floats[:, idx], estimates)

    def tie_ordered_runnable(self) -> DecoderColumns:
        """The runnable rows, least recently selected first, then by rid (the order every cohort
        solver's stable sorts keep for equal values: ``policy.selection``'s tie order)."""
        if self.count < 2 and (not self.count or self._runnable[0]):
            return self  # none, or one runnable decoder: its own order
        idx = np.flatnonzero(self._runnable)
        return self.take(idx[np.lexsort((self.rid[idx], self.last_selected_ns[idx]))])

    def with_survival(self, survival: list[np.ndarray]) -> DecoderColumns:
        """These rows with other survival estimates (an acceptance probe's optimistic ones)."""
        return DecoderColumns(self.ints, self.floats, (survival, self.optimistic, self.forecast))

    def max_finite_price(self) -> float:
        """The largest finite log price of any row, and 0 (``utility.Decision``'s scale)."""
        if not self.count:
            return 0.0
        top = float(np.maximum.reduce(self.prices, axis=None))  # ndarray.max without its wrapper
        if not math.isfinite(top):  # an infinite price (or NaN): the finite ones only
            finite = self.prices[np.isfinite(self.prices)]
            top = float(finite.max()) if finite.size else 0.0
        return max(0.0, top)

    def views(self) -> list[RequestView]:
        """Every row as the :class:`RequestView` a decoder's state gives (plain Python values)."""
        rid, slot, last, remaining, context, width, copy, _, runnable, host_mask = self.ints.tolist()
        age, prefill, output, delivery = self.floats.tolist()
        return [
            RequestView.complete(
                {
                    **_DECODER_DEFAULTS,
                    "rid": rid[i],
                    "slot": slot[i],
                    "runnable": bool(runnable[i]),
                    "last_selected_ns": last[i],
                    "log_prefill_price": prefill[i],
                    "log_output_price": output[i],
                    "log_delivery_price": delivery[i],
                    "host_mask": bool(host_mask[i]),
                    "age_ms": age[i],
                    "output_remaining": remaining[i],
                    "context_remaining": context[i],
                    "width_limit": None if width[i] == NO_LIMIT else width[i],
                    "copy_limit": None if copy[i] == NO_LIMIT else copy[i],
                    "survival": self.survival[i],
                    "optimistic": self.optimistic[i],
                    "forecast": self.forecast[i],
                }
            )
            for i in range(self.count)
        ]


# The rows of DecoderColumns.ints and .floats, in order.
INTS = (
    "rid",
    "slot",
    "last_selected_ns",
    "output_remaining",
    "context_remaining",
    "width_cap",
    "copy_cap",
    "row_limit",
    "runnable",
    "host_mask",
)
FLOATS = ("age_ms", "log_prefill_price", "log_output_price", "log_delivery_price")
_NO_INTS, _NO_FLOATS = np.zeros((len(INTS), 0), dtype=np.int64), np.zeros((len(FLOATS), 0))  # no decoder
_NO_INTS.setflags(write=False)
_NO_FLOATS.setflags(write=False)


class ResidentViews(Sequence[RequestView]):
    """One decision's views: the decoders as :class:`DecoderColumns`, every other resident as a
    :class:`RequestView`. Read as a sequence it is every resident's view in the residents'
    order (the decoders' built from their columns on the first read, then kept)."""

    def __init__(self, others: list[RequestView], decoders: DecoderColumns, order: list[int]):
        """`order`: the residents' order, each an index into `others` (>= 0) or ~i for decoder
        row i."""
        self.others = others
        self.decoders = decoders
        self._order = order
        self._all: list[RequestView] | None = None

    @classmethod
    def of(cls, views: Sequence[RequestView]) -> ResidentViews:
        """`views` as resident views: themselves if they are, else a list of views split into
        the decoders' columns (``DecoderColumns.of``) and the others, in the same order."""
        if isinstance(views, ResidentViews):
            return views
        others: list[RequestView] = []
        decoders: list[RequestView] = []
        order = []
        for v in views:
            if v.phase is Phase.DECODE:
                order.append(~len(decoders))
                decoders.append(v)
            else:
                order.append(len(others))
                others.append(v)
        return cls(others, DecoderColumns.of(decoders), order)

    def _listed(self) -> list[RequestView]:
        if self._all is None:
            decoders, others = self.decoders.views(), self.others
            self._all = [others[k] if k >= 0 else decoders[~k] for k in self._order]
        return self._all

    def __len__(self) -> int:
        return len(self.others) + self.decoders.count

    @overload
    def __getitem__(self, index: int) -> RequestView: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestView]: ...

    def __getitem__(self, index):
        return self._listed()[index]

    def __iter__(self) -> Iterator[RequestView]:
        return iter(self._listed())

    def __repr__(self) -> str:
        return f"ResidentViews({self._listed()!r})"

    def any_runnable(self) -> bool:
        """Whether any resident is runnable (``Scheduler.plan`` returns None otherwise)."""
        return any(self.decoders._runnable.tolist()) or any(v.runnable for v in self.others)

    def recency(self) -> dict[int, int]:
        """rid -> last selection of every resident (``ranking.recency``)."""
        out = dict(zip(self.decoders.rid.tolist(), self.decoders.last_selected_ns.tolist()))
        out.update((v.rid, v.last_selected_ns) for v in self.others)
        return out

    def output_remaining(self) -> dict[int, int]:
        """rid -> output left of every resident."""
        out = dict(zip(self.decoders.rid.tolist(), self.decoders.output_remaining.tolist()))
        out.update((v.rid, v.output_remaining) for v in self.others)
        return out

    def with_decoder_survival(self, survival: list[np.ndarray]) -> ResidentViews:
        """These views with the decoders' survival estimates replaced (row order)."""
        return ResidentViews(self.others, self.decoders.with_survival(survival), self._order)
