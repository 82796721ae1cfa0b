"""``prepared.PreparedGraphs`` groups the programs of one loaded mode once (families, dominators,
generation routes, the K-step and unconstrained row masks' tables, the smaller prompt capacities,
the mixed shapes). Each grouping is checked here against an independent brute-force computation
over every program (and every pair of programs) of the shipped catalogs, their eligible sets per
decode mode, K-step variants and the first members of the generated catalog family."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios_jax import catalog_family
from helios_jax.catalog import Allocation, DecodeMode, GraphKind
from helios_jax.reference.crosscheck import with_decode_steps
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import prepared

from .helpers import ORDINARY, POLICY, RAGGED, SPEC

FAMILY = list(catalog_family.family(4, 0))


def _eligible(catalog, mode):
    return catalog.eligible(DecodeMode(mode))


def _variant(catalog, graphs):
    """`catalog` with other programs (validated like a loaded catalog) in adaptive mode."""
    return _eligible(dataclasses.replace(catalog, graphs=tuple(graphs)), "adaptive")


def _device_rectangles(catalog):
    """Its rectangular host-allocated programs with proposals made device-allocated (DEVICE_WIDE)."""
    graphs = [
        dataclasses.replace(g, allocation=Allocation.PREFIX_LIMIT)
        if g.kind is GraphKind.SPECULATIVE and g.proposal_depth > 0 and g.is_rectangular
        else g
        for g in catalog.graphs
    ]
    return _variant(catalog, graphs)


def _narrower_lanes(catalog):
    """Plus, for each rectangular program of width W > 2, one of width W / 2 at the same depth
    (a WIDE dominator of another lane table), and a ragged one of width 2, depth 1 (P = B + 2 < 2B)."""
    extra = {}
    for g in catalog.of_kind(GraphKind.SPECULATIVE):
        if g.is_rectangular and g.token_capacity > 2:
            half = g.token_capacity // 2
            narrower = dataclasses.replace(g, token_capacity=half, target_capacity=g.batch_capacity * half)
            extra[narrower.key] = narrower
            if g.batch_capacity > 2:
                ragged = dataclasses.replace(
                    g, token_capacity=2, proposal_depth=1, target_capacity=g.batch_capacity + 2
                )
                extra[ragged.key] = ragged
    return _variant(catalog, catalog.graphs + tuple(extra.values()))


CASES = {
    "spec-adaptive": _eligible(SPEC, "adaptive"),
    "spec-fixed": _eligible(SPEC, "fixed"),
    "ordinary": _eligible(ORDINARY, "ordinary"),
    "ordinary-k": _eligible(with_decode_steps(ORDINARY, (4, 8), 0.5), "ordinary"),
    "spec-k": _eligible(with_decode_steps(SPEC, (2, 4), 0.6), "adaptive"),
    "ragged": _eligible(RAGGED, "adaptive"),
    "prefill-only": tuple(g for g in SPEC.graphs if g.kind is GraphKind.PREFILL),
    "empty": (),
    "spec-reversed": _eligible(SPEC, "adaptive")[::-1],
    "ordinary-k-reversed": _eligible(with_decode_steps(ORDINARY, (4, 8), 0.5), "ordinary")[::-1],
    "device-rectangles": _device_rectangles(SPEC),
    "narrower-lanes": _narrower_lanes(SPEC),
    "ragged-narrower": _narrower_lanes(RAGGED),
    **{
        f"family-{i}": _eligible(
            with_decode_steps(m.catalog, (4,), 0.6),
            "ordinary" if m.params["mode"] == "ordinary" else "adaptive",
        )
        for i, m in enumerate(FAMILY)
    },
}
cases = pytest.mark.parametrize("name", list(CASES))


def _prepared(name):
    return prepared.PreparedGraphs(CASES[name])


def _caps(g):
    return (
        g.batch_capacity,
        g.token_capacity,
        g.target_capacity,
        g.prefill_capacity,
        g.image_capacity,
        g.steps,
    )


def _brute_dominators(graphs, g):
    """Same kind, every capacity at most g's, and not all equal (a program never dominates itself)."""
    out = []
    for h in graphs:
        a, b = _caps(h), _caps(g)
        if h.kind is g.kind and all(a[i] <= b[i] for i in range(6)) and any(a[i] < b[i] for i in range(6)):
            out.append(h)
    return out


def _ids(graphs):
    return [id(g) for g in graphs]


def test_the_cases_hold_the_shapes_the_groupings_distinguish():
    kinds = {g.kind for graphs in CASES.values() for g in graphs}
    assert kinds == set(GraphKind)
    assert any(g.steps > 1 for g in CASES["ordinary-k"]) and any(g.steps > 1 for g in CASES["spec-k"])
    assert any(g.allocation is Allocation.PREFIX_LIMIT for g in CASES["spec-adaptive"])
    assert not any(g.kind is GraphKind.DECODE for g in CASES["spec-adaptive"])
    routes = {prepared.generation_route(g) for g in CASES["device-rectangles"] + CASES["narrower-lanes"]}
    assert routes == {prepared.Route.WIDE, prepared.Route.DEVICE_WIDE, prepared.Route.RAGGED}
    assert any(g.proposal_depth == 1 and not g.is_rectangular for g in CASES["narrower-lanes"])


@cases
def test_require_raises_exactly_for_a_kind_without_an_eligible_program(name):
    """A request needing a kind (initialize, prompt scores) is refused at admission exactly when the
    loaded mode has no eligible program of that kind."""
    graphs = CASES[name]
    p = _prepared(name)
    for kind in GraphKind:
        present = [g for g in graphs if g.kind is kind]
        if present:
            p.require(kind, "the work")
        else:
            with pytest.raises(ValueError, match=f"the work needs an eligible {kind.value} program"):
                p.require(kind, "the work")


@cases
def test_families_are_the_programs_of_their_kinds_in_catalog_order(name):
    graphs = CASES[name]
    p = _prepared(name)
    K = GraphKind
    assert p.graphs == tuple(graphs)
    assert _ids(p.generation) == [id(g) for g in graphs if g.kind.value in ("decode", "speculative")]
    assert _ids(p.prefill) == [id(g) for g in graphs if g.kind.value in ("prefill", "scored_prefill")]
    assert _ids(p.mixed) == [id(g) for g in graphs if g.kind.value == "mixed"]
    assert _ids(p.snapshots) == [id(g) for g in graphs if g.kind.value == "snapshot"]
    state = (K.INITIALIZE, K.RESTORE, K.VISION, K.SNAPSHOT)
    assert _ids(p.prerequisites) == [id(g) for g in graphs if g.kind in state]
    assert _ids(p.delivery) == [id(g) for g in graphs if g.kind in (K.DECODE, K.SPECULATIVE, K.MIXED)]


@cases
def test_followers_are_prompt_programs_and_single_step_decoders_else_every_decoder(name):
    """A prerequisite is followed by a prompt program (prefill or mixed) and by a single-step
    generation program, or any generation program when the mode has only K-step ones."""
    graphs = CASES[name]
    p = _prepared(name)
    K = GraphKind
    assert _ids(p.prompt_followers) == [
        id(g) for g in graphs if g.kind in (K.PREFILL, K.SCORED_PREFILL, K.MIXED)
    ]
    delivery = [g for g in graphs if g.kind in (K.DECODE, K.SPECULATIVE, K.MIXED)]
    single = [g for g in delivery if g.steps == 1]
    assert _ids(p.decode_followers) == _ids(single if single else delivery)


def test_decode_followers_fall_back_to_k_step_programs_when_none_is_single_step():
    graphs = tuple(g for g in CASES["ordinary-k"] if g.kind is GraphKind.PREFILL or g.steps > 1)
    graphs = tuple(g for g in graphs if g.kind is not GraphKind.MIXED)
    p = prepared.PreparedGraphs(graphs)
    ksteps = [g for g in graphs if g.kind is GraphKind.DECODE]
    assert ksteps and _ids(p.decode_followers) == _ids(ksteps)


@cases
def test_dominators_are_every_same_kind_program_with_all_capacities_at_most_one_smaller(name):
    graphs = CASES[name]
    p = _prepared(name)
    assert list(p.dominators) == list(graphs)
    everyone = set()
    for g in graphs:
        brute = _brute_dominators(graphs, g)
        assert _ids(p.dominators[g]) == _ids(brute), g
        assert p.dominator_ids[id(g)] == {id(h) for h in brute}
        assert all(prepared.dominates(h, g) for h in brute)
        everyone |= {id(h) for h in brute}
    assert p.dominating_ids == everyone


def _brute_route(g):
    if g.steps > 1:
        return prepared.Route.MULTISTEP
    if (
        g.kind is GraphKind.DECODE
        or g.token_capacity == 1
        or g.target_capacity == g.batch_capacity * g.token_capacity
    ):
        return prepared.Route.DEVICE_WIDE if g.allocation is Allocation.PREFIX_LIMIT else prepared.Route.WIDE
    return prepared.Route.RAGGED


@cases
def test_generation_routes_classify_every_generation_program_once(name):
    p = _prepared(name)
    assert [id(g) for g, *_ in p.generation_routes] == _ids(p.generation)
    for g, route, width, depth in p.generation_routes:
        assert route is _brute_route(g) is prepared.generation_route(g)
        assert (width, depth) == (g.token_capacity, g.proposal_depth)


def _brute_cover(g, graphs):
    """The largest B among g's dominators of its unconstrained route and lane table (W, D)."""
    route = _brute_route(g)
    if route not in (prepared.Route.WIDE, prepared.Route.DEVICE_WIDE):
        return 0
    same = [
        h.batch_capacity
        for h in _brute_dominators(graphs, g)
        if _brute_route(h) is route
        and (h.token_capacity, h.proposal_depth) == (g.token_capacity, g.proposal_depth)
    ]
    return max(same + [0])


def _brute_kappa(g, graphs, c):
    """The most steps a dominator of the K-step g holding a cohort of c lanes runs (0: none)."""
    return max([h.steps for h in _brute_dominators(graphs, g) if h.batch_capacity >= c] + [0])


@cases
def test_generation_rows_tables_match_the_dominators_program_by_program(name):
    graphs = CASES[name]
    rows = _prepared(name).generation_rows
    gen = [g for g in graphs if g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE)]
    assert rows.batch.tolist() == [g.batch_capacity for g in gen]
    assert rows.cover.tolist() == [_brute_cover(g, graphs) for g in gen]
    assert rows.multistep.tolist() == [g.steps > 1 for g in gen]
    assert rows.any_multistep is any(g.steps > 1 for g in gen)
    assert rows.steps.tolist() == [g.steps for g in gen]
    assert rows.most_steps == max([g.steps for g in gen] + [1])
    width = max([g.batch_capacity for g in gen] + [1])
    assert rows.kappa.shape == (len(gen), width)
    assert [id(g) for g in rows.dominated] == [id(g) for g in gen if g.steps > 1]
    for i, g in enumerate(gen):
        if g.steps > 1:
            kappa = [_brute_kappa(g, graphs, c) for c in range(1, g.batch_capacity + 1)]
            assert rows.dominated[g].tolist() == kappa and not rows.dominated[g].flags.writeable
            cohorts = [min(c, g.batch_capacity) for c in range(1, width + 1)]
            assert rows.kappa[i].tolist() == [kappa[c - 1] for c in cohorts]
        else:
            assert not rows.kappa[i].any()
    assert [id(r[0]) for r in rows.routes] == [id(g) for g in gen]


@cases
def test_smaller_prefill_and_largest_smaller_chunk(name):
    """A prompt program's smaller chunks: same kind, smaller token capacity; the largest chunk
    among its dominators is kept for the programs that have any."""
    graphs = CASES[name]
    p = _prepared(name)
    prefill = [g for g in graphs if g.kind.is_prefill]
    assert list(p.smaller_prefill) == prefill
    largest = {}
    for g in prefill:
        smaller = [h for h in prefill if h.kind is g.kind and h.token_capacity < g.token_capacity]
        assert _ids(p.smaller_prefill[g]) == _ids(smaller)
        chunks = [h.token_capacity for h in _brute_dominators(graphs, g)]
        if chunks:
            largest[id(g)] = max(chunks)
    assert p.largest_smaller_chunk == largest


@cases
def test_mixed_groupings_match_brute_force(name):
    graphs = CASES[name]
    p = _prepared(name)
    mixed = [g for g in graphs if g.kind is GraphKind.MIXED]
    assert list(p.smaller_mixed) == mixed and list(p.mixed_dominator_classes) == mixed
    for g in mixed:
        same = [
            h for h in mixed if (h.batch_capacity, h.token_capacity) == (g.batch_capacity, g.token_capacity)
        ]
        assert _ids(p.smaller_mixed[g]) == _ids([h for h in same if h.prefill_capacity < g.prefill_capacity])
        classes = {}
        for h in _brute_dominators(graphs, g):
            shape = (h.batch_capacity, h.token_capacity, h.proposal_depth)
            classes[shape] = max(classes.get(shape, 0), h.prefill_capacity)
        assert p.mixed_dominator_classes[g] == tuple(classes.items())
    # decode-only work on a mixed shape: only its smallest prompt capacity (the first such) survives
    smallest = set()
    for g in mixed:
        shape = (g.batch_capacity, g.token_capacity, g.proposal_depth)
        rivals = [h for h in mixed if (h.batch_capacity, h.token_capacity, h.proposal_depth) == shape]
        least = min(h.prefill_capacity for h in rivals)
        if g is next(h for h in rivals if h.prefill_capacity == least):
            smallest.add(id(g))
    assert p.mixed_decode_only == smallest


@cases
def test_mixed_shape_arrays_index_the_distinct_capacities_and_tables(name):
    p = _prepared(name)
    mixed = p.mixed
    tables = sorted({(g.token_capacity, g.proposal_depth) for g in mixed})
    capacities = sorted({g.prefill_capacity for g in mixed})
    assert p.mixed_table_shapes == tuple(tables)
    assert p.mixed_capacities == tuple(capacities)
    assert p.mixed_batch.dtype == np.int64 and p.mixed_batch.tolist() == [g.batch_capacity for g in mixed]
    for i, g in enumerate(mixed):
        assert capacities[p.mixed_capacity_index[i]] == g.prefill_capacity
        assert tables[p.mixed_table_index[i]] == (g.token_capacity, g.proposal_depth)
    assert p.mixed_capacity_index.dtype == np.intp and p.mixed_table_index.dtype == np.intp
    assert p.mixed_rules == {}
    delivery = p.delivery
    assert p.max_width == max([1] + [g.token_capacity for g in delivery])
    assert p.max_depth == max([0] + [g.proposal_depth for g in delivery])


@cases
def test_drafted_groups_the_speculative_programs_with_proposals_once(name):
    graphs = CASES[name]
    p = _prepared(name)
    drafted = p.drafted()
    assert drafted is p.drafted()
    want = [g for g in graphs if g.kind is GraphKind.SPECULATIVE and g.proposal_depth > 0]
    assert _ids(drafted.graphs) == _ids(want) == _ids(drafted.generation)
    assert drafted.drafted() is not p and _ids(drafted.drafted().graphs) == _ids(want)


def test_capacities_order_the_dominance_fields():
    g = SPEC.of_kind(GraphKind.MIXED)[0]
    assert prepared.capacities(g) == _caps(g)
    bigger = dataclasses.replace(g, image_capacity=g.image_capacity + 1)
    assert prepared.dominates(g, bigger) and not prepared.dominates(bigger, g)
    assert not prepared.dominates(g, g)


def test_mixed_durations_follow_every_estimate_and_are_kept_while_the_version_holds():
    """The mixed programs' durations, in ``mixed`` order, as a float64 array (None while one is
    unmeasured), equal to the cost model's estimates after every observation; the same array is
    handed out again until an estimate changes, and a handed-out array never changes."""
    rng = np.random.default_rng(3)
    p = prepared.PreparedGraphs(CASES["spec-adaptive"])
    keys = [g.key for g in p.mixed] + [g.key for g in p.prefill[:2]]
    costs, now, handed = CostModel(POLICY.estimate_ttl_ns), 0, []
    for step in range(300):
        now += int(rng.choice([1, 1000, POLICY.estimate_ttl_ns // 3]))
        costs.observe(keys[int(rng.integers(len(keys)))], [float(rng.uniform(1e5, 9e6))], now)
        want = [costs.estimate_ms(g.key) for g in p.mixed]
        got = p.mixed_durations(costs)
        if any(t is None for t in want):
            assert got is None, step
            continue
        assert got.dtype == np.float64 and got.tolist() == want, step
        assert p.mixed_durations(costs) is got, step
        handed.append((got, list(want)))
    assert len(handed) > 100 and len({id(a) for a, _ in handed}) > 50
    assert all(a.tolist() == w for a, w in handed)


def _brute_interval(programs, costs, k):
    """k x the least T / min(B, k) over the measured programs (0.0: k = 0 or none measured)."""
    if k == 0:
        return 0.0
    rates = [costs.estimate_ms(g.key) / min(g.batch_capacity, k) for g in programs if costs.is_known(g.key)]
    return k * min(rates) if rates else 0.0


def test_reference_interval_is_the_batch_feasible_interval_of_the_measured_family_programs():
    """sigma for k streams over the delivery (or snapshot) programs measured so far, after every
    observation: k x the least T / min(B, k) (a program larger than k serves only k of them)."""
    rng = np.random.default_rng(5)
    p = prepared.PreparedGraphs(CASES["ordinary"])
    keys = [g.key for g in p.delivery + p.snapshots]
    costs, now = CostModel(POLICY.estimate_ttl_ns), 0
    for step in range(200):
        now += int(rng.choice([1, 1000, POLICY.estimate_ttl_ns // 3]))
        costs.observe(keys[int(rng.integers(len(keys)))], [float(rng.uniform(1e5, 9e6))], now)
        for family, programs in (("delivery", p.delivery), ("snapshots", p.snapshots)):
            for k in (0, 1, 2, 3, 5, 8, 13, 40):
                want = _brute_interval(programs, costs, k)
                assert p.reference_interval(family, k, costs) == pytest.approx(want, rel=1e-12), (step, k)
                assert p.reference_interval(family, k, costs) == pytest.approx(want, rel=1e-12), (step, k)
