"""A decode-like follower's rows, priced once per following shape and per sequence length.

A prerequisite's two-stage candidates pair every prerequisite shape g1 with every following
shape g2 (``prerequisites.py``). The newly ready decoders' and the already ready decoders' lane
values on g2 depend on g1 only through U = T + F, the sequence's length, by an age term added
to a part that does not depend on it (newly ready: c·U·(A + U); ready: c·σ·U).
:class:`DecoderRows` keeps the U-free parts of one prerequisite kind and g2's steps, width and
depth (every batch capacity of that shape shares them) and gives a pair's values as one vector
operation; a lane object is built only for a row a cohort takes. Ready
lanes are ``DecoderTable.lanes`` (single step) and ``multistep.k_step_lanes`` (K steps).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler.policy.multistep import k_step_lanes, view_steps
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import padded_prefixes
from helios_jax.scheduler.speculation import expected_output_table
from helios_jax.scheduler.view import Lane, LaneRole, Phase, RequestView

# A row group at one U: its values and the lane of row i.
Rows = tuple[np.ndarray, Callable[[int], Lane]]


class DecoderRows:
    """The newly ready and already ready decoders of one following program g2: the same for
    every following program of g2's steps, width and proposal depth (what it reads of g2)."""

    def __init__(self, sel: Selection, g2: GraphDescriptor, new_views: list[RequestView]):
        self.sel, self.g2 = sel, g2
        decision = sel.decision
        # Newly ready decoders (none on a K-step program when its samples take a host mask).
        self.views = [
            v
            for v in new_views
            if v.enables is Phase.DECODE and not (g2.steps > 1 and v.host_mask)  # no K-step lane
        ]
        self.ages = np.array([v.age_ms for v in self.views], dtype=np.float64)
        if g2.steps > 1:  # K-step: min(K, limits) certain tokens, one delivery
            self.rows = [view_steps(v, g2.steps) for v in self.views]
            self.expected = [float(s) for s in self.rows]
        else:
            depth = sel.prepared.max_depth
            self.rows = [
                int(max(1, min(v.row_limit, g2.token_capacity, g2.proposal_depth + 1))) for v in self.views
            ]
            self.expected = [
                float(expected_output_table(padded_prefixes([v.survival], depth), w, decision.alpha)[0, w])
                for v, w in zip(self.views, self.rows)
            ]
        # output price x expected tokens + delivery price: each lane's value before its age term
        self.base = np.array(
            [
                float(decision.scaled(v.log_output_price)) * x + float(decision.scaled(v.log_delivery_price))
                for v, x in zip(self.views, self.expected)
            ],
            dtype=np.float64,
        )
        decoders = sel.decoders
        self.table = (
            decoders.table(g2.token_capacity, g2.proposal_depth) if decoders.count and g2.steps == 1 else None
        )

    def new(self, u: float) -> Rows:
        """The newly ready decoders' values and lanes for a sequence of length `u`: tokens at
        their output price, one delivery, and the age term with an individual reference (a
        multistage blocked stream's reference interval is its own future-delivery time, the
        length of the sequence that delivers to it)."""
        values = self.base + self.sel.decision.decode_age * u * (self.ages + u)

        def lane(i: int) -> Lane:
            v, value = self.views[i], float(values[i])
            if self.g2.steps > 1:
                steps = self.rows[i]
                return Lane(v.rid, v.slot, LaneRole.DECODE, ceiling=steps, expected_tokens=steps, value=value)
            return Lane(
                v.rid,
                v.slot,
                LaneRole.DECODE,
                query_length=self.rows[i],
                expected_tokens=self.expected[i],
                value=value,
            )

        return values, lane

    def ready(self, u: float) -> Rows:
        """The already ready decoders' values and lanes for a sequence of length `u`."""
        decoders = self.sel.decoders
        if not decoders.count:
            return np.zeros(0), _no_lane
        if self.table is None:  # K-step
            pairs = k_step_lanes(decoders, self.g2.steps, u)
            return np.array([x[0] for x in pairs], dtype=np.float64), lambda i: pairs[i][1]
        table = self.table
        values = table.values + decoders.age_value_per_ms * u
        return values, lambda i: decoders.lanes((i,), table.widths, u)[0]


def _no_lane(i: int) -> Lane:
    raise IndexError(i)
