"""The following graph of a two-stage sequence: its cohort, solved jointly with the
prerequisite's (spec, "Prerequisites and completion").

A prerequisite program g1 makes some blocked requests ready; the following inference program g2
then serves k >= 1 of them, already ready requests in its remaining rows, while g1's remaining
rows finish terminal requests. For fixed shapes lane values are additive, so:

- decode-like and prefill followers: sorted prefix sums over k (``utility.best_pair``), once
  per population shape (:func:`populations`; a mixed follower's prompt row is absent, already
  ready, or enabled by the prerequisite);
- ragged speculative followers, whose aggregate rows P bind as well as B: exact for host
  allocation in fixed mode (``utility.best_ragged_pair``), the adaptive orderings priced by the
  resulting causal allocation otherwise (:func:`ragged_cohort`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.follower_rows import DecoderRows
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import DecoderTable, PromptTable, computed_once
from helios_jax.scheduler.rounds import prefix_allocation_order
from helios_jax.scheduler.view import Lane, LaneRole, Phase, RequestView


class _LaneMemo:
    """Lane `i` built on its first request and kept (``functools.cache`` of a lambda, without
    creating a wrapped function per population: a selection builds several per follower)."""

    __slots__ = ("_build", "_built")

    def __init__(self, build: Callable[[int], Lane]):
        self._build = build
        self._built: dict[int, Lane] = {}

    def __call__(self, i: int) -> Lane:
        lane = self._built.get(i)
        if lane is None:
            lane = self._built[i] = self._build(i)
        return lane


@dataclasses.dataclass(frozen=True)
class Pair:
    """A prerequisite program followed by one inference program, with their timing."""

    prerequisite: GraphDescriptor  # g1
    following: GraphDescriptor  # g2
    group: list[RequestView]  # blocked requests whose next prerequisite g1 runs
    terminals: list[RequestView]  # terminal rows g1 may finish (snapshot programs only)
    terminal_values: np.ndarray  # f64[len(terminals)], their ages stopping at T
    prerequisite_ms: float | None  # T
    following_ms: float | None  # F
    total_ms: float  # U = T + F; 0 when either is unknown

    @computed_once
    def terminal_prefix(self) -> np.ndarray:
        """``utility.descending_prefix`` of the terminal values, shared by the pair's populations."""
        return utility.descending_prefix(self.terminal_values)

    @property
    def unknown(self) -> bool:
        return self.prerequisite_ms is None or self.following_ms is None


class FollowerCohort(NamedTuple):
    """The joint choice for one pair: what the following graph serves, what the prerequisite
    finishes besides the rows it enables."""

    enabled: set[int]  # rids the prerequisite makes ready and the following graph serves
    terminal_count: int  # terminal rows the prerequisite finishes (the best ones)
    lanes: list[Lane]  # the following graph's lanes
    value: float  # useful value of both stages


@dataclasses.dataclass(frozen=True)
class Population:
    """One population shape of a following graph: contributions and lanes of its row groups
    (a lane is built only for a row a cohort takes: ``follower_rows``)."""

    new_values: np.ndarray  # f64[k]: rows the prerequisite makes ready
    new_lane: Callable[[int], Lane]  # the lane of newly ready row i
    ready_values: np.ndarray  # f64[j]: rows already ready
    ready_lane: Callable[[int], Lane]
    room: int  # following-graph rows left for newly ready and ready rows
    fixed: list[Lane] = dataclasses.field(default_factory=list)  # a chosen prompt row
    fixed_new: bool = False  # the fixed prompt row is itself enabled by the prerequisite

    @property
    def fixed_value(self) -> float:
        return float(sum(lane.value for lane in self.fixed))

    def best_new(self, count: int) -> list[Lane]:
        """The `count` most valuable newly ready rows' lanes, best first."""
        return [self.new_lane(int(i)) for i in self._new_order[:count]]

    def best_ready(self, count: int) -> list[Lane]:
        return [self.ready_lane(int(i)) for i in self._ready_order[:count]]

    @computed_once
    def _new_order(self) -> np.ndarray:
        return np.argsort(-self.new_values, kind="stable")

    @computed_once
    def _ready_order(self) -> np.ndarray:
        return np.argsort(-self.ready_values, kind="stable")

    @computed_once
    def new_prefix(self) -> np.ndarray:
        return utility.descending_prefix(self.new_values)

    @computed_once
    def ready_prefix(self) -> np.ndarray:
        return utility.descending_prefix(self.ready_values)

    def with_room(self, room: int) -> Population:
        """The same rows with `room` following-graph rows (a prefill follower of another batch
        capacity and the same chunk), and the sorted sums and orders already computed for them."""
        new = object.__new__(Population)  # its fields and computed values, shared (read-only)
        new.__dict__.update(self.__dict__, room=room)
        return new


def following_graphs(sel: Selection, enables: Phase) -> list[GraphDescriptor]:
    """Every prepared inference shape that can follow: prefill, scored prefill and mixed
    programs for an enabled prompt; every single-step generation program, ragged ones included,
    for an enabled decoder, or every K-step one where the catalog has no single-step program
    (RESOLUTIONS.md, 25: without one, a decoder's capture would have no follower and no value)."""
    prepared = sel.prepared
    return prepared.prompt_followers if enables is Phase.PREFILL else prepared.decode_followers


def is_ragged(g: GraphDescriptor) -> bool:
    return g.kind is GraphKind.SPECULATIVE and g.token_capacity > 1 and not g.is_rectangular


def prompt_value(sel: Selection, v: RequestView, capacity: int, scored: bool = False) -> float:
    """A prompt lane's value in a chunk of `capacity`; zero in the wrong prefill family
    (a request that needs prompt scores runs only scored prefill, and no other does)."""
    n = v.prompt_work(capacity)
    if n <= 0 or v.needs_scores != scored:
        return 0.0
    prefill, output = sel.prompt_prices(v)
    value = prefill * n
    if n == v.prompt_remaining:
        value += output
    return value


def prompt_lane(sel: Selection, v: RequestView, capacity: int, scored: bool = False) -> Lane:
    n = v.prompt_work(capacity)
    return Lane(
        v.rid,
        v.slot,
        LaneRole.PROMPT,
        prompt_tokens=n,
        value=prompt_value(sel, v, capacity, scored),
        expected_tokens=1.0 if n == v.prompt_remaining else 0.0,
    )


def populations(
    sel: Selection, g2: GraphDescriptor, new_views: list[RequestView], u: float, rows: DecoderRows
) -> list[Population]:
    """Every legal population shape of a decode-like following graph for one fixed pair of
    shapes (a prefill follower has one: :func:`prefill_population`).

    Decode-like followers take newly ready and already ready decoders. A mixed follower's
    prompt row is absent, already ready, or enabled by the prerequisite (then it is itself the
    newly ready row and holds one prerequisite row); each case leaves an exact capacity problem
    for the decode rows. `rows`: `DecoderRows(sel, g2, new_views)`, which the caller keeps for
    every pair with this follower.
    """
    (new_values, new_lane), (ready_values, ready_lane) = rows.new(u), rows.ready(u)
    b2 = g2.batch_capacity
    shapes = [Population(new_values, new_lane, ready_values, ready_lane, b2)]
    if g2.kind is GraphKind.MIXED:
        prompts, cap = sel.prompts, g2.prefill_capacity
        smaller = _unexplored_below(sel, g2)
        for i in _ready_prompt_rows(prompts, cap, False, smaller):
            fixed = [prompts.lane(i, cap)]
            shapes.append(Population(new_values, new_lane, ready_values, ready_lane, b2 - 1, fixed))
        enabled = [v for v in new_views if v.enables is Phase.PREFILL]
        for v in _explored(sel, enabled, cap, smaller):
            if prompt_value(sel, v, cap) > 0:
                fixed = [prompt_lane(sel, v, cap)]
                shapes.append(Population(new_values, new_lane, ready_values, ready_lane, b2 - 1, fixed, True))
    return shapes


def prefill_population(sel: Selection, g2: GraphDescriptor, new_views: list[RequestView]) -> Population:
    """A prefill follower's population: the prompts the prerequisite enables, worth something
    in this chunk, and the prompts already ready; an unmeasured follower leaves out those it
    would explore where a smaller chunk consumes the same tokens (:func:`_unexplored_below`)."""
    prompts = sel.prompts
    cap, scored = g2.token_capacity, g2.kind is GraphKind.SCORED_PREFILL
    smaller = _unexplored_below(sel, g2)
    enabled = [v for v in new_views if v.enables is Phase.PREFILL]
    explored = _explored(sel, enabled, cap, smaller)
    worth = [(x, v) for v in explored if (x := prompt_value(sel, v, cap, scored)) > 0]
    ready = _ready_prompt_rows(prompts, cap, scored, smaller)
    # A lane is built only for a row a cohort takes, and once: the population is shared by every
    # prerequisite shape and batch capacity that may follow, whose rows take the same lanes.
    return Population(
        np.array([x for x, _ in worth], dtype=np.float64),
        _LaneMemo(lambda i: prompt_lane(sel, worth[i][1], cap, scored)),
        prompts.values(cap)[ready],
        _LaneMemo(lambda j: prompts.lane(ready[j], cap)),
        g2.batch_capacity,
    )


def _unexplored_below(sel: Selection, g2: GraphDescriptor) -> list[int]:
    """The prompt capacities of `g2`'s smaller prepared programs of its shape when `g2` is
    unmeasured (duration-estimates/prefill-explore-smaller, RESOLUTIONS 36: a follower explores
    as its direct candidates do): a prompt row that one of them consumes the same way up to its
    next endpoint is not explored on `g2`. Empty when `g2` is measured."""
    if sel.costs.is_known(g2.key):
        return []
    if g2.kind is GraphKind.MIXED:
        return [h.prefill_capacity for h in sel.prepared.smaller_mixed[g2]]
    return [h.token_capacity for h in sel.prepared.smaller_prefill[g2]]


def _ready_prompt_rows(prompts: PromptTable, capacity: int, scored: bool, smaller: list[int]) -> list[int]:
    """The already ready prompt rows of the follower's family (`scored`) that consume tokens in a
    chunk of `capacity`, in table order, less those an unmeasured follower would explore where a
    smaller chunk consumes the same tokens (`smaller`: as :func:`_unexplored_below`; empty, the
    measured case, costs no exclusion pass): the mask ``batchprefill.best_rows`` takes too."""
    work = prompts.work(capacity)
    allowed = (prompts.needs_scores == scored) & (work > 0)
    if smaller:
        allowed &= ~prompts.excluded_from_exploration(smaller, work)
    return np.flatnonzero(allowed).tolist()


def _explored(
    sel: Selection, views: list[RequestView], capacity: int, smaller: list[int]
) -> list[RequestView]:
    """The enabled prompt `views` a chunk of `capacity` may explore (`smaller`: as
    :func:`_unexplored_below`), by the prompt table's own rule."""
    if not smaller:
        return views
    table = sel.prompt_table(views)
    excluded = table.excluded_from_exploration(smaller, table.work(capacity))
    return [v for v, out in zip(views, excluded) if not out]


def population_choice(pair: Pair, pop: Population) -> utility.PairCohort | None:
    """How many rows of each group the exact joint cohort for one population shape takes, and
    their total (``utility.best_pair``); None when no cohort is feasible."""
    room1 = pair.prerequisite.batch_capacity - (1 if pop.fixed_new else 0)
    return utility.best_pair_of_prefixes(
        pop.new_prefix,
        pop.ready_prefix,
        pair.terminal_prefix,
        room1,
        pop.room,
        min_new=0 if pop.fixed_new else 1,
    )


def population_cohort(pop: Population, res: utility.PairCohort) -> FollowerCohort:
    """The exact joint cohort for one population shape, given its `population_choice` `res`
    (a feasible one: the caller scores the choice before it builds the cohort's lanes)."""
    new_lanes = pop.best_new(res.new_count)
    ready_lanes = pop.best_ready(res.ready_count)
    enabled = {lane.rid for lane in new_lanes} | (
        {lane.rid for lane in pop.fixed} if pop.fixed_new else set()
    )
    return FollowerCohort(
        enabled, res.terminal_count, pop.fixed + new_lanes + ready_lanes, res.total + pop.fixed_value
    )


@dataclasses.dataclass(frozen=True)
class _RaggedDecoders:
    """A ragged follower's decoders: newly ready ones and already ready ones, valued to U."""

    new: DecoderTable
    ready: DecoderTable
    new_delivery_value: np.ndarray  # f64[k]: delivery and age value, with the individual reference U
    ready_delivery_value: np.ndarray  # f64[j]: delivery and age value to U
    new_widths: np.ndarray  # i64[k]: lane ceilings on the following program
    ready_widths: np.ndarray  # i64[j]


class _RaggedChoice(NamedTuple):
    new: list[int]  # newly ready lanes served
    ready: list[int]  # already ready lanes served
    terminal_count: int
    new_rows: np.ndarray  # i64[k]: target rows of each newly ready lane
    ready_rows: np.ndarray  # i64[j]


def ragged_cohort(sel: Selection, pair: Pair, new_views: list[RequestView]) -> FollowerCohort | None:
    """A prerequisite followed by a ragged speculative program, whose aggregate rows P bind
    the cohort as well as B: exact for host allocation in fixed mode (``best_ragged_pair``),
    the adaptive orderings priced by the resulting causal allocation otherwise, in both
    cases with at least one newly ready row and the prerequisite's rows shared with terminal
    rows."""
    views = [v for v in new_views if v.enables is Phase.DECODE]
    if not views:
        return None
    groups = _ragged_decoders(sel, pair, views)
    device = pair.following.allocation is Allocation.PREFIX_LIMIT
    if sel.mode is DecodeMode.FIXED:
        choice = _fixed_ragged_choice(pair, groups)
    else:
        choice = _adaptive_ragged_choice(pair, groups, device)
    if choice is None:
        return None
    new_lanes = [
        _ragged_lane(
            groups.new, groups.new_delivery_value, i, choice.new_rows[i], groups.new_widths[i], device
        )
        for i in choice.new
    ]
    ready_lanes = [
        _ragged_lane(
            groups.ready, groups.ready_delivery_value, i, choice.ready_rows[i], groups.ready_widths[i], device
        )
        for i in choice.ready
    ]
    total = sum(lane.value for lane in new_lanes + ready_lanes) + float(
        np.sort(pair.terminal_values)[::-1][: choice.terminal_count].sum()
    )
    return FollowerCohort(
        {lane.rid for lane in new_lanes}, choice.terminal_count, new_lanes + ready_lanes, total
    )


def _ragged_decoders(sel: Selection, pair: Pair, views: list[RequestView]) -> _RaggedDecoders:
    ready = sel.decoders
    new = DecoderTable(views, sel.decision, sel.prepared.max_width, sel.prepared.max_depth)
    u = pair.total_ms
    # Newly ready streams use their individual future-delivery reference sigma_i = U; every
    # served age resets at U.
    ages = np.array([v.age_ms for v in views])
    new_delivery = new.delivery_price + sel.decision.decode_age * u * (ages + u)
    ready_delivery = ready.delivery_value + ready.age_value_per_ms * u if ready.count else np.zeros(0)
    width, depth = pair.following.token_capacity, pair.following.proposal_depth
    ready_widths = ready.lane_widths(width, depth) if ready.count else np.zeros(0, dtype=np.int64)
    new_widths = new.lane_widths(width, depth)
    return _RaggedDecoders(new, ready, new_delivery, ready_delivery, new_widths, ready_widths)


def _fixed_ragged_choice(pair: Pair, groups: _RaggedDecoders) -> _RaggedChoice | None:
    new, ready = groups.new, groups.ready
    new_values = (
        new.output_price * new.expected_output[np.arange(new.count), groups.new_widths]
        + groups.new_delivery_value
    )
    ready_values = (
        ready.output_price * ready.expected_output[np.arange(ready.count), groups.ready_widths]
        + groups.ready_delivery_value
        if ready.count
        else np.zeros(0)
    )
    g2 = pair.following
    res = utility.best_ragged_pair(
        new_values,
        groups.new_widths,
        ready_values,
        groups.ready_widths,
        pair.terminal_values,
        pair.prerequisite.batch_capacity,
        g2.batch_capacity,
        g2.target_capacity,
    )
    if res is None:
        return None
    return _RaggedChoice(res.new, res.ready, res.terminal_count, groups.new_widths, groups.ready_widths)


def _adaptive_ragged_choice(pair: Pair, groups: _RaggedDecoders, device: bool) -> _RaggedChoice | None:
    new, ready = groups.new, groups.ready
    n_new, room1 = new.count, pair.prerequisite.batch_capacity
    new_pending = new.output_price + groups.new_delivery_value
    pending = (
        np.concatenate([new_pending, ready.output_price + groups.ready_delivery_value])
        if ready.count
        else new_pending
    )
    extension = (
        np.vstack([new.extension_value, ready.extension_value]) if ready.count else new.extension_value
    )
    ceilings = np.concatenate([groups.new_widths, groups.ready_widths])
    rank_key = (
        (np.vstack([new.forecast, ready.forecast]) if ready.count else new.forecast) if device else extension
    )
    slots = np.concatenate([new.slots, ready.slots]) if ready.count else new.slots
    by_slot = np.argsort(slots, kind="stable")
    alloc_lanes, alloc_depths = prefix_allocation_order(
        rank_key[by_slot], np.minimum(ceilings[by_slot], extension.shape[1] + 1)
    )
    terminal_sorted = np.sort(pair.terminal_values)[::-1]
    terminal_prefix = np.concatenate([[0.0], np.cumsum(terminal_sorted)])
    ks = np.arange(min(room1, n_new) + 1)
    bonus = terminal_prefix[np.minimum(room1 - ks, terminal_sorted.size)]  # terminal rows beside k new
    bonus[0] = -np.inf  # at least one newly ready row
    is_new = np.arange(ceilings.size) < n_new
    g2 = pair.following
    _, cohort, alloc = utility.adaptive_ragged(
        pending,
        extension,
        ceilings,
        by_slot[alloc_lanes],
        alloc_depths,
        g2.batch_capacity,
        g2.target_capacity,
        new=is_new,
        new_bonus=bonus,
    )
    if not cohort:
        return None
    new_idx = [i for i in cohort if i < n_new]
    ready_idx = [i - n_new for i in cohort if i >= n_new]
    terminal_count = int(min(room1 - len(new_idx), terminal_sorted.size))
    return _RaggedChoice(new_idx, ready_idx, terminal_count, alloc[:n_new], alloc[n_new:])


def _ragged_lane(
    group: DecoderTable, delivery_value: np.ndarray, i: int, rows: int, ceiling: int, device: bool
) -> Lane:
    """A decode lane of a ragged follower: predicted `rows` under device `ceiling`, or host rows."""
    expected = float(group.expected_output[i, int(rows)])
    return Lane(
        int(group.rids[i]),
        int(group.slots[i]),
        LaneRole.DECODE,
        query_length=0 if device else int(rows),
        ceiling=int(ceiling) if device else 0,
        expected_tokens=expected,
        value=float(group.output_price[i] * expected + delivery_value[i]),
    )
