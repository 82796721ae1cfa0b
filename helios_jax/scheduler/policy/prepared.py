"""The prepared programs of one loaded mode, grouped once for repeated selection.

Selection compares every loaded program many times a second; the groupings it needs (programs
by family, the programs that dominate each one, the smaller prompt capacities that make an
unmeasured one redundant) depend only on the catalog, so :class:`PreparedGraphs` computes them
once when the scheduler loads a mode.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from helios_jax.catalog import Allocation, CostKey, GraphDescriptor, GraphKind
from helios_jax.scheduler.service import batch_feasible_interval

if TYPE_CHECKING:
    from helios_jax.scheduler.cost import CostModel

PREREQUISITE_KINDS = (GraphKind.INITIALIZE, GraphKind.RESTORE, GraphKind.VISION, GraphKind.SNAPSHOT)

# (batch capacity B, token capacity W, proposal depth D): what fixes a mixed program's decoder rows.
MixedShape = tuple[int, int, int]


def capacities(g: GraphDescriptor) -> tuple[int, ...]:
    """(B, W, P, prompt capacity, image capacity, steps): the capacities dominance compares."""
    return (
        g.batch_capacity,
        g.token_capacity,
        g.target_capacity,
        g.prefill_capacity,
        g.image_capacity,
        g.steps,
    )


def dominates(small: GraphDescriptor, big: GraphDescriptor) -> bool:
    """Whether `small` does the same work with capacities all at most `big`'s, one smaller."""
    a, b = capacities(small), capacities(big)
    return a != b and all(x <= y for x, y in zip(a, b))


class Route(enum.Enum):
    """How ``generation.generation_candidates`` scores a generation program (fixed at load)."""

    MULTISTEP = "multistep"  # K > 1 steps (``multistep``)
    WIDE = "wide"  # unconstrained (decode, width one, rectangular): a prefix of the lane order
    DEVICE_WIDE = "device_wide"  # unconstrained, device-allocated: widths are its ceilings
    RAGGED = "ragged"  # an aggregate row capacity P binds the cohort


def is_unconstrained(g: GraphDescriptor) -> bool:
    """Every lane gets its full width: no aggregate row capacity P binds the cohort."""
    return g.kind is GraphKind.DECODE or g.token_capacity == 1 or g.is_rectangular


def generation_route(g: GraphDescriptor) -> Route:
    if g.steps > 1:
        return Route.MULTISTEP
    if is_unconstrained(g):
        return Route.DEVICE_WIDE if g.allocation is Allocation.PREFIX_LIMIT else Route.WIDE
    return Route.RAGGED


def mixed_shape(g: GraphDescriptor) -> MixedShape:
    return (g.batch_capacity, g.token_capacity, g.proposal_depth)


def by_cost_key(graphs: Iterable[GraphDescriptor]) -> dict[CostKey, list[GraphDescriptor]]:
    """The programs of each cost key (the programs an estimate's change concerns)."""
    out: dict[CostKey, list[GraphDescriptor]] = {}
    for g in graphs:
        out.setdefault(g.key, []).append(g)
    return out


class PreparedGraphs:
    """The eligible programs of one loaded mode, grouped once for repeated selection."""

    def __init__(self, graphs: Iterable[GraphDescriptor]):
        self.graphs = tuple(graphs)
        self.generation = [g for g in self.graphs if g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE)]
        self.prefill = [g for g in self.graphs if g.kind.is_prefill]
        self.mixed = [g for g in self.graphs if g.kind is GraphKind.MIXED]
        self.snapshots = [g for g in self.graphs if g.kind is GraphKind.SNAPSHOT]
        self.prerequisites = [g for g in self.graphs if g.kind in PREREQUISITE_KINDS]
        self.delivery = [g for g in self.graphs if g.kind.is_generation]
        self.prompt_followers, self.decode_followers = self._followers()
        self.dominators = {
            g: [h for h in self.graphs if h.kind is g.kind and dominates(h, g)] for g in self.graphs
        }
        self.dominator_ids = {id(g): {id(h) for h in hs} for g, hs in self.dominators.items()}
        # Programs that dominate another: leaving one's candidate out could keep a dominated row.
        self.dominating_ids = frozenset(i for ids in self.dominator_ids.values() for i in ids)
        # Each generation program with its route and lane-table shape (W, D), classified once.
        self.generation_routes = [
            (g, generation_route(g), g.token_capacity, g.proposal_depth) for g in self.generation
        ]
        self.generation_rows = GenerationRows(self.generation_routes, self.dominators)
        self.smaller_prefill = {
            g: [h for h in self.prefill if h.kind is g.kind and h.token_capacity < g.token_capacity]
            for g in self.prefill
        }
        self.mixed_decode_only = self._mixed_decode_only()
        self._drafted: PreparedGraphs | None = None
        self.largest_smaller_chunk = self._largest_smaller_chunk()
        self.smaller_mixed = {
            g: [
                h
                for h in self.mixed
                if h.batch_capacity == g.batch_capacity
                and h.token_capacity == g.token_capacity
                and h.prefill_capacity < g.prefill_capacity
            ]
            for g in self.mixed
        }
        self.mixed_dominator_classes = {g: self._mixed_dominator_classes(g) for g in self.mixed}
        # The (W, D) of every mixed shape: their decoder lane widths key the dominance rules,
        # which are kept across decisions (``mixed.MixedFamily.rules``; bounded).
        self.mixed_table_shapes = tuple(sorted({(g.token_capacity, g.proposal_depth) for g in self.mixed}))
        self.mixed_rules: dict[tuple, dict[int, tuple[int, int | None] | None]] = {}
        # The mixed shapes as arrays, for the family's upper bound (``mixed.mixed_upper_rates``):
        # B, and indices into their distinct prompt capacities and (W, D) table shapes.
        self.mixed_batch = np.array([g.batch_capacity for g in self.mixed], dtype=np.int64)
        self.mixed_capacities = tuple(sorted({g.prefill_capacity for g in self.mixed}))
        self.mixed_capacity_index = np.array(
            [self.mixed_capacities.index(g.prefill_capacity) for g in self.mixed], dtype=np.intp
        )
        self.mixed_table_index = np.array(
            [self.mixed_table_shapes.index((g.token_capacity, g.proposal_depth)) for g in self.mixed],
            dtype=np.intp,
        )
        self._mixed_durations: tuple[dict, np.ndarray | None] | None = None
        self.max_width = max([g.token_capacity for g in self.delivery] + [1])
        self.max_depth = max([g.proposal_depth for g in self.delivery] + [0])
        self._durations: tuple[CostModel, int, dict[int, float | None]] | None = None
        self._by_key = by_cost_key(self.graphs)
        self._sigmas: dict[tuple[str, int], float] = {}

    def require(self, kind: GraphKind, what: str) -> None:
        """Raises ValueError when no eligible program of `kind` exists: `what` would wait for
        work no program can run."""
        if not any(g.kind is kind for g in self.graphs):
            raise ValueError(f"{what} needs an eligible {kind.value} program; the catalog has none")

    def durations(self, costs: CostModel) -> dict[int, float | None]:
        """Every program's duration estimate (ms; None: unmeasured) by ``id``, kept while the
        cost model's version holds (every changed estimate bumps it); after a few changes, a
        copy with only the changed keys' programs read again (``CostModel.changed_since``).
        Read-only to callers."""
        kept = self._durations
        if kept is not None and kept[0] is costs and kept[1] == costs.version:
            return kept[2]
        changed = costs.changed_since(kept[1]) if kept is not None and kept[0] is costs else None
        if changed is None or kept is None:
            table = {id(g): costs.estimate_ms(g.key) for g in self.graphs}
        else:
            table = dict(kept[2])  # a new table: a caller may still hold the old one
            for key in changed:
                t = costs.estimate_ms(key)
                for g in self._by_key.get(key, ()):
                    table[id(g)] = t
        self._durations = (costs, costs.version, table)
        self._sigmas.clear()
        return table

    def mixed_durations(self, costs: CostModel) -> np.ndarray | None:
        """Every mixed program's duration estimate (ms) as an array in ``mixed`` order, kept
        with :meth:`durations`; None when one is unmeasured."""
        durations = self.durations(costs)
        kept = self._mixed_durations
        if kept is None or kept[0] is not durations:
            ts = [durations[id(g)] for g in self.mixed]
            array = None if any(t is None for t in ts) else np.array(ts, dtype=np.float64)
            kept = self._mixed_durations = (durations, array)
        return kept[1]

    def reference_interval(self, family: str, k: int, costs: CostModel) -> float:
        """``utility.reference_interval`` over ``delivery`` or ``snapshots``, kept per cost version."""
        durations = self.durations(costs)
        sigma = self._sigmas.get((family, k))
        if sigma is None:
            pairs = [
                (g.batch_capacity, t) for g in getattr(self, family) if (t := durations[id(g)]) is not None
            ]
            sigma = self._sigmas[(family, k)] = batch_feasible_interval(k, pairs)
        return sigma

    def drafted(self) -> PreparedGraphs:
        """The speculative programs with proposals (what acceptance probes choose among), grouped
        once and kept."""
        if self._drafted is None:
            self._drafted = PreparedGraphs(
                g for g in self.graphs if g.kind is GraphKind.SPECULATIVE and g.proposal_depth > 0
            )
        return self._drafted

    def _followers(self) -> tuple[list[GraphDescriptor], list[GraphDescriptor]]:
        """A prerequisite's followers (``following.following_graphs``): an enabled prompt's, and
        an enabled decoder's (single-step generation, or K-step where none is single-step)."""
        prompt = [g for g in self.graphs if g.kind.is_prefill or g.kind is GraphKind.MIXED]
        return prompt, [g for g in self.delivery if g.steps == 1] or list(self.delivery)

    def _largest_smaller_chunk(self) -> dict[int, int]:
        """Each prefill program that has dominators (by ``id``): their largest token capacity."""
        largest = {
            id(g): max((h.token_capacity for h in self.dominators[g]), default=None) for g in self.prefill
        }
        return {k: v for k, v in largest.items() if v is not None}

    def _mixed_decode_only(self) -> set[int]:
        """A decode-only population on a mixed shape is the same work on every prompt capacity of
        that (B, W, D): only the smallest capacity can survive the dominance filter."""
        smallest: dict[MixedShape, GraphDescriptor] = {}
        for g in self.mixed:
            shape = mixed_shape(g)
            if shape not in smallest or g.prefill_capacity < smallest[shape].prefill_capacity:
                smallest[shape] = g
        return {id(g) for g in smallest.values()}

    def _mixed_dominator_classes(self, g: GraphDescriptor) -> tuple[tuple[MixedShape, int], ...]:
        """Mixed dominators grouped by the shape that fixes their decoder rows: (B, W, D) -> the
        largest dominating prompt capacity (prompt work grows with capacity, so it decides)."""
        classes: dict[MixedShape, int] = {}
        for h in self.dominators[g]:
            shape = mixed_shape(h)
            classes[shape] = max(classes.get(shape, 0), h.prefill_capacity)
        return tuple(classes.items())


def dominated_steps(g: GraphDescriptor, dominators: Iterable[GraphDescriptor]) -> np.ndarray:
    """i64[B]: for cohorts of c = 1..B lanes of the K-step program `g`, the most steps any of its
    `dominators` holding c lanes runs (0: none holds them); a cohort whose lanes all take at
    most that many is dominated (read-only)."""
    kappa = np.zeros(g.batch_capacity, dtype=np.int64)
    for h in dominators:
        held = kappa[: h.batch_capacity]  # cohorts of c <= B' lanes
        np.maximum(held, h.steps, out=held)
    kappa.setflags(write=False)
    return kappa


def cohort_cover(g: GraphDescriptor, dominators: Iterable[GraphDescriptor]) -> int:
    """For an unconstrained generation program, the largest batch capacity among its
    `dominators` of the same route and lane table (W, D) (0: none; 0 for every other route).
    With n decoders, such a dominator of capacity at least min(B, n) takes the same cohort (the
    first min(B, n) of the same lane order) at the same widths: `g`'s row would share its
    dominance signature, and the dominance filter drop it (``ranking.prune_dominated``)."""
    route = generation_route(g)
    if route not in (Route.WIDE, Route.DEVICE_WIDE):
        return 0
    same = (
        h.batch_capacity
        for h in dominators
        if generation_route(h) is route
        and h.token_capacity == g.token_capacity
        and h.proposal_depth == g.proposal_depth
    )
    return max(same, default=0)


MEMO = 4096  # GenerationRows.live's kept answers (decoder counts and limits seen)


class GenerationRows:
    """Which generation programs can offer a row that the dominance filter keeps, read from
    the decoders' counts alone, for all of them at once (``generation_candidates`` builds only
    those). A program is left out when a dominator's row does the same work:

    - unconstrained (WIDE, DEVICE_WIDE): min(B, n) <= its :func:`cohort_cover`, n decoders;
    - K-step: with e eligible decoders and L the longest steps limit among them, every cohort
      size is dominated: ``dominated_steps[min(B, e) - 1] >= max(1, min(K, L))`` (the first
      sizes' dominators hold the larger ones, and no lane takes more steps), or e = 0.
    Ragged programs always build theirs."""

    def __init__(self, routes: list[tuple], dominators: dict[GraphDescriptor, list[GraphDescriptor]]):
        # Each K-step program's dominated steps by cohort size (:func:`dominated_steps`), read by
        # ``multistep.multistep_candidate``.
        self.dominated = {g: dominated_steps(g, dominators[g]) for g, *_ in routes if g.steps > 1}
        self.batch = np.array([g.batch_capacity for g, *_ in routes], dtype=np.int64)
        self.cover = np.array([cohort_cover(g, dominators[g]) for g, *_ in routes], dtype=np.int64)
        self.multistep = np.array([r is Route.MULTISTEP for _, r, *_ in routes], dtype=bool)
        self.any_multistep = bool(self.multistep.any())
        self.steps = np.array([g.steps for g, *_ in routes], dtype=np.int64)
        width = int(self.batch.max(initial=1))
        sizes = np.arange(1, width + 1)
        self.kappa = np.zeros((len(routes), width), dtype=np.int64)  # [program, min(e, width) - 1]
        for i, (g, *_) in enumerate(routes):
            if g.steps > 1:
                self.kappa[i] = self.dominated[g][np.minimum(sizes, g.batch_capacity) - 1]
        self.most_steps = int(self.steps.max(initial=1))
        self.routes = tuple(routes)
        self._memo: dict[tuple[int, ...], tuple[tuple[bool, ...], tuple[tuple, ...]]] = {}

    def live(self, decoders: int, extent: Callable[[], tuple[int, int]]) -> tuple[bool, ...]:
        """Whether each program of ``generation_routes`` may offer a surviving row, with
        `decoders` runnable decoders; `extent()`: how many of them may be K-step lanes and the
        longest steps limit among those (``multistep.KStepRanking.extent``), asked only of a
        catalog with K-step programs. Kept per distinct answer (a limit beyond the largest K
        reads as that K), at most ``MEMO`` of them."""
        return self._kept(decoders, extent)[0]

    def live_routes(self, decoders: int, extent: Callable[[], tuple[int, int]]) -> tuple[tuple, ...]:
        """The entries of ``generation_routes`` that :meth:`live` keeps, in their order."""
        return self._kept(decoders, extent)[1]

    def _kept(
        self, decoders: int, extent: Callable[[], tuple[int, int]]
    ) -> tuple[tuple[bool, ...], tuple[tuple, ...]]:
        if self.any_multistep:
            eligible, longest = extent()
            key: tuple[int, ...] = (decoders, eligible, min(longest, self.most_steps))
        else:
            key = (decoders,)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= MEMO:
                self._memo.clear()
            live = tuple(self.mask(*key).tolist())
            hit = self._memo[key] = (live, tuple(r for r, alive in zip(self.routes, live) if alive))
        return hit

    def mask(self, decoders: int, eligible: int = 0, longest: int = 0) -> np.ndarray:
        """bool[len(generation_routes)]: :meth:`live`, computed (`eligible` and `longest` are
        read only when the catalog has K-step programs)."""
        unconstrained = np.minimum(self.batch, decoders) > self.cover
        if not self.any_multistep:
            return unconstrained
        if eligible == 0:
            return unconstrained & ~self.multistep
        column = self.kappa[:, min(eligible, self.kappa.shape[1]) - 1]
        kstep = column < np.maximum(np.minimum(self.steps, longest), 1)
        return np.where(self.multistep, kstep, unconstrained)


def as_prepared(graphs: Iterable[GraphDescriptor] | PreparedGraphs) -> PreparedGraphs:
    return graphs if isinstance(graphs, PreparedGraphs) else PreparedGraphs(graphs)
