"""Speculative prefix allocation: kernel, jnp reference and numpy oracles agree on every rule.

Three layers, cheapest first:
1. The small-case grid: every shape B <= 4, D <= 3; every active mask, every active-lane
   ceiling 1..D+1 and every capacity from the active count to one above the ceilings' sum;
   joint probabilities from the grid {0, 0.25, 0.5, 1} (ties everywhere, rows monotone or
   not). Where a shape's full product fits the case budget it is enumerated outright;
   otherwise every structure is kept and its probability matrices are a seeded sample (half
   made monotone). The vectorised numpy and the jnp reference run the whole grid against the
   naive oracle; the interpret-mode kernel runs a seeded subset of it, batched with `vmap`.
2. Seeded random properties at serving sizes (B up to 64, D up to 16).
3. Host checks of the entry: bad ranks, dtypes, lane counts and values are ValueErrors.

HELIOS_KERNEL_CASES=N sets the per-shape budget (default 20000 for the oracles, 1000 of them
for the kernel); HELIOS_KERNEL_CASES=full uses 2,000,000 per shape and runs the kernel on all
of it (exhaustive through B*D = 6, sampled above: the B=4, D=3 product alone is 7e10 cases).
"""

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.kernels.prefix_allocation import prefix_allocation, prefix_allocation_reference
from helios_jax.reference.prefix_allocation import prefix_allocation_batched, prefix_allocation_naive

_KNOB = os.environ.get("HELIOS_KERNEL_CASES", "")
if _KNOB == "full":
    GRID_BUDGET, KERNEL_BUDGET = 2_000_000, 2_000_000
elif _KNOB:
    GRID_BUDGET = KERNEL_BUDGET = int(_KNOB)
else:
    GRID_BUDGET, KERNEL_BUDGET = 20_000, 1_000

PROBABILITY_GRID = np.array([0.0, 0.25, 0.5, 1.0], np.float32)
SHAPES = [(b, d) for b in range(1, 5) for d in range(0, 4)]

SPEC_ALLOCATION = (
    "speculative-coverage/device-frontier",
    "speculative-coverage/frontier-ties",
    "speculative-coverage/device-program-steps",
    "speculative-coverage/ceilings-over-p",
)


def _structures(b, depth):
    """Every (active, ceilings, capacity) of a shape; inactive lanes carry ceiling D+1 so that
    an implementation which forgot the mask would visibly grow them."""
    out = []
    for mask in itertools.product([False, True], repeat=b):
        k = sum(mask)
        for lane_ceilings in itertools.product(range(1, depth + 2), repeat=k):
            it = iter(lane_ceilings)
            ceilings = [next(it) if m else depth + 1 for m in mask]
            for capacity in range(k, sum(lane_ceilings) + 2):
                out.append((mask, ceilings, capacity))
    return out


@functools.cache
def grid(b, depth, budget=GRID_BUDGET):
    """The shape's grid as batched arrays (joint_prob, ceilings, active, capacity)."""
    structures = _structures(b, depth)
    n_matrices = len(PROBABILITY_GRID) ** (b * depth)
    if len(structures) * n_matrices <= budget:
        digits = np.arange(n_matrices)[:, None] // 4 ** np.arange(b * depth) % 4
        matrices = PROBABILITY_GRID[digits].reshape(n_matrices, b, depth)
        pairs = itertools.product(range(len(structures)), range(n_matrices))
        s_idx, m_idx = map(np.array, zip(*pairs))
    else:
        rng = np.random.default_rng(1000 * b + depth)
        per = max(1, budget // len(structures))
        s_idx = np.repeat(np.arange(len(structures)), per)
        matrices = PROBABILITY_GRID[rng.integers(0, 4, (len(s_idx), b, depth))]
        monotone = rng.random(len(s_idx)) < 0.5
        matrices[monotone] = -np.sort(-matrices[monotone], axis=-1)
        m_idx = np.arange(len(s_idx))
    active = np.array([structures[i][0] for i in s_idx], bool).reshape(-1, b)
    ceilings = np.array([structures[i][1] for i in s_idx], np.int32).reshape(-1, b)
    capacity = np.array([structures[i][2] for i in s_idx], np.int32)
    return matrices[m_idx].astype(np.float32), ceilings, active, capacity


@functools.cache
def naive_grid(b, depth):
    probs, ceilings, active, capacity = grid(b, depth)
    return np.stack(
        [prefix_allocation_naive(*case) for case in zip(probs, ceilings, active, capacity)]
    ).reshape(len(capacity), b)


def _first_mismatch(got, want, arrays):
    bad = np.flatnonzero((np.asarray(got) != want).any(axis=1))
    if len(bad) == 0:
        return None
    i = bad[0]
    return {
        "case": [a[i].tolist() for a in arrays],
        "got": np.asarray(got)[i].tolist(),
        "want": want[i].tolist(),
    }


WORKED = (
    np.array([[0.9, 0.5, 0.1], [0.9, 0.8, 0.7], [0.5, 0.5, 0.4]], np.float32),
    np.array([4, 2, 4], np.int32),
    np.array([True, True, True]),
)


@pytest.mark.spec(*SPEC_ALLOCATION)
def test_docstring_worked_example_by_oracles():
    assert prefix_allocation_naive(*WORKED, 6).tolist() == [2, 2, 2]
    assert np.asarray(prefix_allocation_reference(*WORKED, 6)).tolist() == [2, 2, 2]


@pytest.mark.spec(*SPEC_ALLOCATION)
@pytest.mark.parametrize("b,depth", SHAPES)
def test_grid_vectorised_numpy_matches_naive(b, depth):
    arrays = grid(b, depth)
    got = prefix_allocation_batched(*arrays)
    assert _first_mismatch(got, naive_grid(b, depth), arrays) is None


@pytest.mark.spec(*SPEC_ALLOCATION)
@pytest.mark.parametrize("b,depth", SHAPES)
def test_grid_jnp_reference_matches_naive(b, depth):
    arrays = grid(b, depth)
    got = jax.jit(jax.vmap(prefix_allocation_reference))(*arrays)
    assert _first_mismatch(got, naive_grid(b, depth), arrays) is None


@pytest.mark.spec("speculative-coverage/device-frontier", "speculative-coverage/prices-rank-cohorts")
def test_only_the_joint_probability_order_ranks_the_frontier():
    """No price enters: a strictly increasing transform of the probabilities leaves the result
    unchanged, and on tie-free inputs renumbering the slots only renumbers the result."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        b, depth = [(3, 2), (8, 5)][rng.integers(2)]
        probs = np.cumprod(rng.random((b, depth)), axis=1).astype(np.float32)
        ceilings = rng.integers(1, depth + 2, b).astype(np.int32)
        active = rng.random(b) < 0.8
        capacity = int(active.sum() + rng.integers(0, b * depth + 1))
        base = prefix_allocation_naive(probs, ceilings, active, capacity)
        squashed = np.sqrt(probs) * 0.5 + 0.25  # strictly increasing on [0, 1]
        assert np.array_equal(
            np.asarray(prefix_allocation_reference(squashed, ceilings, active, capacity)), base
        )
        perm = rng.permutation(b)
        permuted = prefix_allocation_reference(probs[perm], ceilings[perm], active[perm], capacity)
        assert np.array_equal(np.asarray(permuted), base[perm])


def _valid_problem():
    return (np.zeros((3, 2), np.float32), np.array([1, 2, 3], np.int32), np.array([True, True, False]), 4)


@pytest.mark.spec("speculative-coverage/ceiling-bound")
@pytest.mark.parametrize(
    "field,value,match",
    [
        ("joint_prob", np.zeros((3,), np.float32), "joint_prob"),
        ("joint_prob", np.zeros((1, 3, 2), np.float32), "joint_prob"),
        ("joint_prob", np.zeros((3, 2), np.int32), "joint_prob"),
        ("joint_prob", np.array([[0, 0], [np.nan, 0], [0, 0]], np.float32), "NaN"),
        ("ceilings", np.array([1.0, 2.0, 3.0], np.float32), "ceilings"),
        ("ceilings", np.ones((3, 1), np.int32), "ceilings"),
        ("ceilings", np.array([1, 2], np.int32), "lane counts"),
        ("ceilings", np.array([0, 2, 3], np.int32), "outside 1..3"),
        ("ceilings", np.array([1, 4, 3], np.int32), "outside 1..3"),
        ("active", np.array([1, 1, 0], np.int32), "active"),
        ("active", np.array([True, True, False, False]), "lane counts"),
        ("capacity", 1, "below the 2 active"),
        ("capacity", np.array([4], np.int32), "capacity"),
        ("capacity", 4.0, "capacity"),
    ],
)
def test_entry_rejects_bad_inputs(field, value, match):
    names = ("joint_prob", "ceilings", "active", "capacity")
    args = dict(zip(names, _valid_problem()))
    args[field] = value
    with pytest.raises(ValueError, match=match):
        prefix_allocation(**args, interpret=True)


@pytest.mark.spec("speculative-coverage/ceiling-bound", "speculative-coverage/device-fixed-cohort")
def test_entry_ignores_ceilings_of_inactive_lanes():
    probs, _, active, _ = _valid_problem()
    out = prefix_allocation(probs, np.array([2, 3, 99], np.int32), active, 4, interpret=True)
    assert np.asarray(out).tolist() == [2, 2, 0]


def _random_batch(rng, n, b, depth, kind):
    """n problems of one shape. kind: 'uniform', 'ties' (values k/4) or 'monotone'."""
    if kind == "ties":
        probs = rng.integers(0, 5, (n, b, depth)) / 4
    elif kind == "monotone":
        probs = np.cumprod(rng.random((n, b, depth)), axis=-1)
    else:
        probs = rng.random((n, b, depth))
    active = rng.random((n, b)) < rng.uniform(0.3, 1.0, (n, 1))
    ceilings = rng.integers(1, depth + 2, (n, b))
    capacity = active.sum(1) + rng.integers(0, b * (depth + 1) + 2, n)
    return probs.astype(np.float32), ceilings.astype(np.int32), active, capacity.astype(np.int32)


PROPERTY_SHAPES = [(1, 1), (5, 3), (16, 8), (33, 5), (64, 16)]


class TestPrefixAllocationKernel:
    """The Pallas kernel, compiled for the GPU; the subclass below runs it in interpret mode."""

    INTERPRET = False

    @pytest.fixture(autouse=True)
    def _needs_gpu_unless_interpreted(self):
        if not self.INTERPRET and jax.default_backend() != "gpu":
            pytest.skip("compiled Pallas needs a GPU; the Interpret subclass covers CPU")

    def allocate_batch(self, probs, ceilings, active, capacity):
        run = functools.partial(prefix_allocation, interpret=self.INTERPRET)
        return np.asarray(jax.jit(jax.vmap(run))(probs, ceilings, active, capacity))

    @pytest.mark.spec(*SPEC_ALLOCATION)
    def test_docstring_worked_example(self):
        got = [
            np.asarray(prefix_allocation(*WORKED, p, interpret=self.INTERPRET)).tolist()
            for p in (3, 6, 7, 11)
        ]
        assert got == [[1, 1, 1], [2, 2, 2], [3, 2, 2], [4, 2, 4]]

    @pytest.mark.spec(*SPEC_ALLOCATION)
    @pytest.mark.parametrize("b,depth", SHAPES)
    def test_grid_subset_matches_naive(self, b, depth):
        arrays = grid(b, depth)
        want = naive_grid(b, depth)
        n = len(arrays[-1])
        pick = np.sort(np.random.default_rng(b * 10 + depth).permutation(n)[:KERNEL_BUDGET])
        subset = [a[pick] for a in arrays]
        assert _first_mismatch(self.allocate_batch(*subset), want[pick], subset) is None

    @pytest.mark.spec(
        "speculative-coverage/device-program-steps",
        "speculative-coverage/device-fixed-cohort",
        "speculative-coverage/ceiling-bound",
        "speculative-coverage/ceilings-over-p",
    )
    @pytest.mark.parametrize("b,depth", PROPERTY_SHAPES)
    @pytest.mark.parametrize("kind", ["uniform", "ties", "monotone"])
    def test_random_properties(self, b, depth, kind):
        rng = np.random.default_rng([b, depth, ["uniform", "ties", "monotone"].index(kind)])
        probs, ceilings, active, capacity = _random_batch(rng, 64, b, depth, kind)
        got = self.allocate_batch(probs, ceilings, active, capacity)
        limit = np.where(active, np.minimum(ceilings, depth + 1), 0)
        assert got.shape == (64, b) and got.dtype == np.int32
        assert (got.sum(1) <= capacity).all()
        # Every unit of capacity is spent while any lane has room, zero probabilities included.
        assert np.array_equal(got.sum(1), np.minimum(capacity, limit.sum(1)))
        assert (got[~active] == 0).all() and (got[active] >= 1).all()
        assert (got <= limit).all()
        assert np.array_equal(got, prefix_allocation_batched(probs, ceilings, active, capacity))

    @pytest.mark.spec("speculative-coverage/device-frontier", "speculative-coverage/device-program-steps")
    @pytest.mark.parametrize("b,depth", [(6, 4), (64, 16)])
    def test_raising_capacity_never_shrinks_a_lane(self, b, depth):
        rng = np.random.default_rng(b + depth)
        for kind in ("ties", "uniform"):
            probs, ceilings, active, _ = _random_batch(rng, 1, b, depth, kind)
            k = int(active.sum())
            capacities = np.arange(k, k + b * depth + 2, dtype=np.int32)
            n = len(capacities)

            def tile(a, n=n):
                return np.repeat(a, n, axis=0)

            got = self.allocate_batch(tile(probs), tile(ceilings), tile(active), capacities)
            assert (np.diff(got, axis=0) >= 0).all()
            assert (np.diff(got.sum(1)) <= 1).all()

    @pytest.mark.spec("speculative-coverage/device-frontier")
    def test_under_jit_capacity_is_traced_and_nan_ranks_last(self):
        probs = np.array([[np.nan, 0.9], [0.0, 0.0]], np.float32)
        ceilings, active = np.array([3, 3], np.int32), np.array([True, True])
        run = jax.jit(lambda p, cap: prefix_allocation(p, ceilings, active, cap, interpret=self.INTERPRET))
        got = [np.asarray(run(probs, np.int32(cap))).tolist() for cap in (3, 4, 5, 6)]
        # NaN is -inf: the zeros of lane 1 go first, then lane 0's NaN frontier, then its 0.9.
        assert got == [[1, 2], [1, 3], [2, 3], [3, 3]]
        want = [
            np.asarray(prefix_allocation_reference(probs, ceilings, active, cap)).tolist()
            for cap in (3, 4, 5, 6)
        ]
        assert got == want


class TestPrefixAllocationKernelInterpret(TestPrefixAllocationKernel):
    INTERPRET = True


@pytest.mark.spec("speculative-coverage/device-program-steps")
@pytest.mark.parametrize("b,depth", [(1, 0), (3, 3), (64, 16)])
def test_kernel_lowers_to_triton_for_cuda(b, depth):
    """No GPU here, but the Pallas -> Triton IR lowering runs on any host: export for cuda.

    This catches unsupported primitives and non-power-of-two blocks; compiling the IR to PTX
    and running it still needs a GPU (the compiled test class)."""
    from jax import export

    shapes = jax.ShapeDtypeStruct
    exported = export.export(
        jax.jit(lambda *a: prefix_allocation(*a, interpret=False)),
        platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(
        shapes((b, depth), jnp.float32),
        shapes((b,), jnp.int32),
        shapes((b,), jnp.bool_),
        shapes((), jnp.int32),
    )
    assert "__gpu$xla.gpu.triton" in exported.mlir_module()
