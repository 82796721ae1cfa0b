"""Ragged paged attention: XLA and Pallas implementations against the naive per-row reference.

Every case is adversarial by construction (`make_case`): pages are assigned by a seeded
shuffle, every page byte outside a row's context is NaN (unused pages, partial-page tails),
page-table entries past a row's used pages are out-of-range garbage, packed query positions
that no row covers are NaN, and inactive rows carry garbage lengths. A single stray read of
any of them turns an output NaN. Scenarios cover length-1 rows, contexts at page size - 1, page
size and page size + 1, the maximum context, decode rows (query_len 1), verification rows
(2..8), one long prefill chunk beside decode rows, and GQA ratios 1, 2 and 4, in float32 and
bfloat16 with a tolerance table keyed by dtype.

Every (scenario, GQA ratio, dtype) compiles a program of its own (about a second each on a CPU),
so by default the XLA path runs every scenario in both dtypes with the GQA ratio rotating (every
scenario at two ratios, every (ratio, dtype) pair at least three times), and the Pallas kernel
in interpret mode, slower still, a covering subset (every scenario once, every ratio and dtype
at least once); HELIOS_KERNEL_CASES=full runs both on the whole product. Seeded random packings of
one static shape (so one compile) add 60 XLA and 24 kernel cases of mixed row kinds.
"""

import dataclasses
import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from helios_jax.kernels.ragged_paged_attention import (
    RaggedAttentionTiles,
    ragged_paged_attention,
    ragged_paged_attention_reference,
    select_impl,
)

TOLERANCE = {  # dtype -> (atol, rtol) against the float64 reference of the same rounded inputs
    jnp.float32: (2e-5, 2e-5),
    jnp.bfloat16: (3e-2, 3e-2),
}
GQA_RATIOS = (1, 2, 4)
DTYPES = (jnp.float32, jnp.bfloat16)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """rows: (context_len, query_len) per row, in slot order; query_len 0 is an inactive row."""

    name: str
    rows: tuple
    page_size: int = 4
    pages_per_row: int = 8
    spare_tokens: int = 3  # packed positions past the last row (NaN padding)
    head_dim: int = 16
    pool_pages: int = 0  # total pages; 0: the used pages plus five spare ones


PS = 4
SCENARIOS = [
    Scenario("length_one", ((1, 1),)),
    Scenario("decode_rows", ((1, 1), (PS - 1, 1), (PS, 1), (PS + 1, 1), (2 * PS, 1), (32, 1))),
    Scenario("verification_rows", ((2, 2), (PS + 1, 3), (9, 4), (PS * 3, 5), (17, 7), (30, 8))),
    Scenario("page_boundaries", ((PS - 1, PS - 1), (PS, PS), (PS + 1, PS + 1), (2 * PS + 1, 2))),
    Scenario("max_context", ((32, 3), (32, 1), (32, 32))),
    Scenario("prefill_with_decodes", ((40, 37), (7, 1), (19, 1), (1, 1), (33, 1), (12, 1)), pages_per_row=12),
    Scenario("chunked_prefill_mid_page", ((2 * PS + 2, 6), (14, 1)), spare_tokens=9),
    Scenario("inactive_rows_between", ((5, 2), (0, 0), (11, 1), (999, 0), (8, 8), (3, 0)), spare_tokens=5),
    Scenario("wide_pages", ((31, 4), (64, 1), (16, 16)), page_size=16, pages_per_row=4, head_dim=32),
]
SCENARIO_IDS = [s.name for s in SCENARIOS]


def make_case(scenario: Scenario, gqa: int, dtype, seed: int, num_kv_heads: int = 2):
    """Builds the arguments of `ragged_paged_attention` for one scenario (see module docstring)."""
    rng = np.random.default_rng(seed)
    ps, ppr, dim = scenario.page_size, scenario.pages_per_row, scenario.head_dim
    num_q_heads = gqa * num_kv_heads
    used = [-(-ctx // ps) if q_len else 0 for ctx, q_len in scenario.rows]
    total_pages = scenario.pool_pages or sum(used) + 5  # spare pages nobody owns, all NaN
    k_pages = np.full((num_kv_heads, total_pages, ps, dim), np.nan, np.float32)
    v_pages = np.full_like(k_pages, np.nan)
    owner = iter(rng.permutation(total_pages))
    tables = rng.integers(-1000, total_pages + 1000, (len(scenario.rows), ppr)).astype(np.int32)
    num_tokens = sum(q for _, q in scenario.rows) + scenario.spare_tokens
    q = np.full((num_tokens, num_q_heads, dim), np.nan, np.float32)
    context_lens, query_starts, query_lens = [], [], []
    offset = 0
    for r, (ctx, q_len) in enumerate(scenario.rows):
        context_lens.append(ctx)
        query_lens.append(q_len)
        query_starts.append(offset)
        if q_len == 0:
            continue
        for j in range(used[r]):
            page = next(owner)
            tables[r, j] = page
            n = min(ps, ctx - j * ps)  # the rest of the page stays NaN
            k_pages[:, page, :n] = rng.standard_normal((num_kv_heads, n, dim))
            v_pages[:, page, :n] = rng.standard_normal((num_kv_heads, n, dim))
        q[offset : offset + q_len] = rng.standard_normal((q_len, num_q_heads, dim))
        offset += q_len

    def to(x):
        return jnp.asarray(x, dtype)

    return (
        to(q),
        to(k_pages),
        to(v_pages),
        jnp.asarray(tables),
        jnp.asarray(context_lens, jnp.int32),
        jnp.asarray(query_starts, jnp.int32),
        jnp.asarray(query_lens, jnp.int32),
    )


def covered_mask(args):
    num_tokens = args[0].shape[0]
    covered = np.zeros(num_tokens, bool)
    for start, q_len in zip(np.asarray(args[5]), np.asarray(args[6])):
        covered[start : start + q_len] = True
    return covered


def check_against_reference(out, args, dtype):
    sm_scale = args[0].shape[2] ** -0.5
    assert out.shape == args[0].shape and out.dtype == args[0].dtype
    out = np.asarray(out.astype(jnp.float32))
    want = ragged_paged_attention_reference(*args, sm_scale=sm_scale)
    assert not np.isnan(out).any()
    assert (out[~covered_mask(args)] == 0).all()
    atol, rtol = TOLERANCE[dtype]
    np.testing.assert_allclose(out, want, atol=atol, rtol=rtol)


FULL_PRODUCT = list(itertools.product(range(len(SCENARIOS)), GQA_RATIOS, DTYPES))
# Every scenario once, rotating GQA ratio and dtype so each of those appears too.
COVERING = [(i, GQA_RATIOS[i % 3], DTYPES[(i // 3) % 2]) for i in range(len(SCENARIOS))]
# Every scenario in both dtypes, the GQA ratio rotating by scenario and dtype.
BOTH_DTYPES = [
    (i, GQA_RATIOS[(i + j) % 3], dtype) for i in range(len(SCENARIOS)) for j, dtype in enumerate(DTYPES)
]
FULL = os.environ.get("HELIOS_KERNEL_CASES") == "full"
XLA_CASES = FULL_PRODUCT if FULL else BOTH_DTYPES
PALLAS_CASES = FULL_PRODUCT if FULL else COVERING


def _case_id(case):
    i, gqa, dtype = case
    return f"{SCENARIOS[i].name}-gqa{gqa}-{jnp.dtype(dtype).name}"


@pytest.mark.parametrize("case", XLA_CASES, ids=[_case_id(c) for c in XLA_CASES])
def test_xla_matches_reference(case):
    i, gqa, dtype = case
    args = make_case(SCENARIOS[i], gqa, dtype, seed=i)
    out = ragged_paged_attention(*args, sm_scale=args[0].shape[2] ** -0.5, impl="xla")
    check_against_reference(out, args, dtype)


def test_xla_odd_page_size():
    """Page size 3 (not a power of two): the XLA path has no shape constraint."""
    scenario = Scenario("odd_pages", ((2, 2), (3, 1), (4, 4), (10, 1), (24, 5)), page_size=3)
    args = make_case(scenario, 2, jnp.float32, seed=3)
    check_against_reference(ragged_paged_attention(*args, sm_scale=0.25, impl="xla"), args, jnp.float32)


def test_auto_is_xla_off_gpu():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU auto selects pallas")
    assert select_impl("auto", head_dim=64, page_size=16, pages_per_row=8) == "xla"


def test_under_jit_with_traced_lengths():
    """The model calls the entry inside its jitted program: value checks are skipped, shapes kept."""
    args = make_case(SCENARIOS[5], 2, jnp.float32, seed=11)
    run = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.25, impl="xla"))
    check_against_reference(run(*args), args, jnp.float32)


def _poison_variants(args, seed):
    """The same case with every garbage value swapped for other garbage: large finite numbers
    instead of NaN, and in-range (but foreign) page ids in the unused page-table slots."""
    q, k_pages, v_pages, tables, context_lens, query_starts, query_lens = args

    def refill(x, value):
        return jnp.where(jnp.isnan(x), jnp.asarray(value, x.dtype), x)

    page_size, total_pages = k_pages.shape[2], k_pages.shape[1]
    used = np.arange(tables.shape[1])[None, :] < (-(-np.asarray(context_lens) // page_size))[:, None]
    used &= (np.asarray(query_lens) > 0)[:, None]
    foreign = np.random.default_rng(seed).integers(0, total_pages, tables.shape)
    tables = jnp.asarray(np.where(used, np.asarray(tables), foreign), jnp.int32)
    return (
        refill(q, 1e4),
        refill(k_pages, 3e4),
        refill(v_pages, -7e3),
        tables,
        context_lens,
        query_starts,
        query_lens,
    )


def random_packings(count, seed, num_tokens=48, num_rows=6, pages_per_row=8, page_size=4):
    """Scenarios of one static shape (T, R, pool) with seeded random row lengths: one compile."""
    rng = np.random.default_rng(seed)
    window = pages_per_row * page_size
    out = []
    for i in range(count):
        rows, room = [], num_tokens
        for _ in range(num_rows):
            q_len = int(rng.choice([0, 1, 1, int(rng.integers(2, 9)), int(rng.integers(9, 25))]))
            q_len = min(q_len, room)
            ctx = int(rng.integers(max(q_len, 1), window + 1)) if q_len else int(rng.integers(0, 99))
            rows.append((ctx, q_len))
            room -= q_len
        out.append(
            Scenario(
                f"random_{i}",
                tuple(rows),
                page_size=page_size,
                pages_per_row=pages_per_row,
                spare_tokens=room,
                pool_pages=num_rows * pages_per_row + 3,
            )
        )
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_xla_random_packings(dtype):
    run = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.25, impl="xla"))
    for i, scenario in enumerate(random_packings(60, seed=17)):
        args = make_case(scenario, 2, dtype, seed=100 + i)
        check_against_reference(run(*args), args, dtype)


@pytest.mark.parametrize("block_k", [1, 12])
def test_xla_key_blocks_of_every_size(block_k):
    """Small key blocks make the online softmax step through many blocks (and one page per
    block at page size 4, with the last block partial): the result does not depend on them,
    for short tiles and for full ones (prompt chunks: their own key step)."""
    tiles = RaggedAttentionTiles(xla_block_q=2, xla_block_k=block_k, xla_prompt_block_k=block_k + 3)
    run = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.25, impl="xla", tiles=tiles))
    for i, scenario in enumerate(random_packings(12, seed=23 + block_k)):
        args = make_case(scenario, 2, jnp.float32, seed=200 + i)
        check_against_reference(run(*args), args, jnp.float32)
    for i in (1, 5, 8):
        args = make_case(SCENARIOS[i], 2, jnp.float32, seed=i)
        out = ragged_paged_attention(*args, sm_scale=args[0].shape[2] ** -0.5, impl="xla", tiles=tiles)
        check_against_reference(out, args, jnp.float32)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_stacked_layers_read_the_named_layer(impl):
    """With `layer`, the pages are every layer's ([L, K, pages, page_size, D]); the result equals
    the same call on that layer alone, and the other layers (NaN here) are never read."""
    args = make_case(SCENARIOS[5], 2, jnp.float32, seed=31)
    q, k_pages, v_pages, *rest = args
    poison = jnp.full_like(k_pages, jnp.nan)
    for layer in range(3):
        k_stack = jnp.stack([k_pages if i == layer else poison for i in range(3)])
        v_stack = jnp.stack([v_pages if i == layer else poison for i in range(3)])
        out = ragged_paged_attention(
            q, k_stack, v_stack, *rest, sm_scale=0.25, impl=impl, interpret=impl == "pallas", layer=layer
        )
        check_against_reference(out, args, jnp.float32)
        want = ragged_paged_attention_reference(q, k_stack, v_stack, *rest, sm_scale=0.25, layer=layer)
        np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)


def test_stacked_layers_reject_bad_layers():
    q, k_pages, v_pages, *rest = make_case(SCENARIOS[0], 2, jnp.float32, seed=1)
    stack = jnp.stack([k_pages, k_pages])
    for layer in (2, -1, 0.5, True):
        with pytest.raises(ValueError, match="layer must be an int"):
            ragged_paged_attention(q, stack, stack, *rest, sm_scale=0.25, impl="xla", layer=layer)
    with pytest.raises(ValueError, match="5-d"):
        ragged_paged_attention(q, k_pages, v_pages, *rest, sm_scale=0.25, impl="xla", layer=0)


def test_xla_long_window_short_contexts():
    """A 1024-key window over contexts of a few tokens to the whole window: the loop stops at
    the longest row's last key, and rows far shorter than the window are still exact."""
    scenario = Scenario(
        "long_window",
        ((3, 1), (130, 1), (1024, 1), (700, 9), (64, 64)),
        page_size=16,
        pages_per_row=64,
        head_dim=32,
    )
    args = make_case(scenario, 2, jnp.float32, seed=5)
    check_against_reference(ragged_paged_attention(*args, sm_scale=32**-0.5, impl="xla"), args, jnp.float32)
    short = Scenario(
        "long_window_short_rows", ((3, 1), (17, 2), (5, 5)), page_size=16, pages_per_row=64, head_dim=32
    )
    args = make_case(short, 2, jnp.float32, seed=6)
    check_against_reference(ragged_paged_attention(*args, sm_scale=32**-0.5, impl="xla"), args, jnp.float32)


class TestRaggedPagedAttentionKernel:
    """The Pallas kernel, compiled for the GPU; the subclass below runs it in interpret mode."""

    INTERPRET = False

    @pytest.fixture(autouse=True)
    def _needs_gpu_unless_interpreted(self):
        if not self.INTERPRET and jax.default_backend() != "gpu":
            pytest.skip("compiled Pallas needs a GPU; the Interpret subclass covers CPU")

    def attend(self, args, impl="pallas"):
        return ragged_paged_attention(
            *args, sm_scale=args[0].shape[2] ** -0.5, impl=impl, interpret=self.INTERPRET
        )

    @pytest.mark.parametrize("case", PALLAS_CASES, ids=[_case_id(c) for c in PALLAS_CASES])
    def test_pallas_matches_reference(self, case):
        i, gqa, dtype = case
        args = make_case(SCENARIOS[i], gqa, dtype, seed=i)
        check_against_reference(self.attend(args), args, dtype)

    def test_random_packings(self):
        run = jax.jit(
            lambda *a: ragged_paged_attention(*a, sm_scale=0.25, impl="pallas", interpret=self.INTERPRET)
        )
        for i, scenario in enumerate(random_packings(24, seed=23)):
            args = make_case(scenario, 4, jnp.float32, seed=200 + i)
            check_against_reference(run(*args), args, jnp.float32)

    def test_garbage_never_reaches_the_output(self):
        """Replacing every NaN and every unused page id by other garbage changes no bit."""
        args = make_case(SCENARIOS[7], 2, jnp.float32, seed=5)
        base = np.asarray(self.attend(args))
        again = np.asarray(self.attend(_poison_variants(args, seed=6)))
        np.testing.assert_array_equal(base, again)

    def test_pallas_agrees_with_xla(self):
        args = make_case(SCENARIOS[5], 4, jnp.float32, seed=9)
        np.testing.assert_allclose(
            np.asarray(self.attend(args)), np.asarray(self.attend(args, impl="xla")), atol=2e-5, rtol=2e-5
        )

    def test_auto_on_gpu_is_pallas(self):
        if self.INTERPRET:
            pytest.skip("auto selection is a property of the compiled backend")
        assert select_impl("auto", head_dim=64, page_size=16, pages_per_row=8) == "pallas"


class TestRaggedPagedAttentionKernelInterpret(TestRaggedPagedAttentionKernel):
    INTERPRET = True


def test_xla_garbage_never_reaches_the_output():
    args = make_case(SCENARIOS[7], 2, jnp.float32, seed=5)
    run = functools.partial(ragged_paged_attention, sm_scale=0.25, impl="xla")
    np.testing.assert_array_equal(np.asarray(run(*args)), np.asarray(run(*_poison_variants(args, seed=6))))


def _valid_args():
    return make_case(SCENARIOS[2], 2, jnp.float32, seed=1)


def _replace(args, index, value):
    args = list(args)
    args[index] = value
    return args


BAD_INPUTS = [
    ("q_rank", lambda a: _replace(a, 0, a[0][0]), "q must be"),
    ("q_int", lambda a: _replace(a, 0, a[0].astype(jnp.int32)), "q must be"),
    ("kv_shapes", lambda a: _replace(a, 2, a[2][:, :-1]), "share one 4-d shape"),
    ("kv_dtypes", lambda a: _replace(a, 2, a[2].astype(jnp.bfloat16)), "share a float dtype"),
    ("head_dim", lambda a: _replace(a, 0, a[0][..., :8]), "head_dim differs"),
    ("heads_multiple", lambda a: _replace(a, 0, a[0][:, :3]), "not a multiple"),
    ("tables_rank", lambda a: _replace(a, 3, a[3][0]), "page_tables must be"),
    ("tables_float", lambda a: _replace(a, 3, a[3].astype(jnp.float32)), "page_tables must be"),
    ("lens_count", lambda a: _replace(a, 6, a[6][:-1]), "query_lens must be"),
    ("ctx_float", lambda a: _replace(a, 4, a[4].astype(jnp.float32)), "context_lens must be"),
    ("query_over_context", lambda a: _replace(a, 6, a[6].at[0].set(3)), "exceeds its context_lens"),
    ("negative_query", lambda a: _replace(a, 6, a[6].at[0].set(-1)), ">= 0"),
    ("context_over_window", lambda a: _replace(a, 4, a[4].at[5].set(33)), "pages_per_row"),
    ("past_capacity", lambda a: _replace(a, 5, a[5].at[5].set(a[0].shape[0] - 2)), "packed capacity"),
    ("overlap", lambda a: _replace(a, 5, a[5].at[1].set(1)), "overlap"),
    ("used_page_out_of_range", lambda a: _replace(a, 3, a[3].at[0, 0].set(-1)), "page-table entry"),
]


@pytest.mark.parametrize("mutate,match", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_entry_rejects_bad_inputs(mutate, match):
    with pytest.raises(ValueError, match=match):
        ragged_paged_attention(*mutate(_valid_args()), sm_scale=0.25, impl="xla")


def test_entry_rejects_unknown_impl_and_untritonable_shapes():
    args = _valid_args()
    with pytest.raises(ValueError, match="impl"):
        ragged_paged_attention(*args, sm_scale=0.25, impl="cuda")
    small = make_case(dataclasses.replace(SCENARIOS[0], head_dim=8), 1, jnp.float32, seed=0)
    with pytest.raises(ValueError, match="power of two >= 16"):
        ragged_paged_attention(*small, sm_scale=0.25, impl="pallas", interpret=False)


def test_pallas_lowers_to_triton_for_cuda():
    """No GPU here, but the Pallas -> Triton IR lowering runs on any host: export for cuda.

    This catches unsupported primitives and non-power-of-two blocks; compiling the Triton IR
    to PTX and running it still needs a GPU (the compiled test class)."""
    shapes = jax.ShapeDtypeStruct
    f = jax.jit(functools.partial(ragged_paged_attention, sm_scale=0.125, impl="pallas", interpret=False))
    for dtype, heads, kv_heads in ((jnp.bfloat16, 40, 8), (jnp.float32, 8, 2)):
        exported = export.export(
            f,
            platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(
            shapes((300, heads, 128), dtype),
            shapes((kv_heads, 500, 16, 128), dtype),
            shapes((kv_heads, 500, 16, 128), dtype),
            shapes((9, 40), jnp.int32),
            shapes((9,), jnp.int32),
            shapes((9,), jnp.int32),
            shapes((9,), jnp.int32),
        )
        assert "__gpu$xla.gpu.triton" in exported.mlir_module()


def _fused_computations(hlo: str) -> list[str]:
    """The text of each fused computation of an optimised HLO module."""
    parts = hlo.split("\n%fused_computation")[1:]
    return [p.split("\n}\n")[0] for p in parts]


def test_xla_gathers_key_blocks_in_product_order():
    """Sixteen decode rows over 16-token pages (the default model's attention): no fused
    computation of the compiled XLA path both gathers pages and transposes, i.e. the key and value
    blocks arrive in the products' (item, kv head) order. Gathered head-major, every block was
    transposed as it was gathered, a tenth of a sixteen-lane decode step on a CPU."""
    rows = tuple((40 + 9 * i, 1) for i in range(16))
    scenario = Scenario("decode16", rows, page_size=16, pages_per_row=12, head_dim=32)
    args = make_case(scenario, 3, jnp.float32, seed=8)
    run = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=32**-0.5, impl="xla"))
    check_against_reference(run(*args), args, jnp.float32)
    fused = _fused_computations(run.lower(*args).compile().as_text())
    assert any(" gather(" in f for f in fused)
    assert not [f for f in fused if " gather(" in f and " transpose(" in f]
