"""The GPU-shaped parts of ragged paged attention: split-KV, the layer as a runtime value, and
the Triton lowering of the shapes the engine compiles.

Split-KV cases use long windows of 16-token pages with one page per key block, so a row walks
up to 16 blocks and a split holds a few of them; every case is checked against the naive
float64 reference (`make_case` poisons every byte outside the rows' contexts with NaN). The
kernel class runs compiled on a GPU (skipped elsewhere: `scripts/gpu/check.sh` fails on that
skip) and in interpret mode everywhere.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from helios_jax.kernels.ragged_paged_attention import (
    DEFAULT_TILES,
    RaggedAttentionTiles,
    kv_splits,
    merge_splits,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

from .test_ragged_paged_attention import Scenario, check_against_reference, make_case

# Decode rows at 3, 17, 200 and 256 (the whole window) keys and a verification row, 16 blocks max.
LONG = Scenario(
    "long_window_decode",
    ((200, 1), (256, 1), (3, 1), (100, 4), (17, 1)),
    page_size=16,
    pages_per_row=16,
    head_dim=32,
)
ONE_ROW = Scenario("one_decode_row", ((250, 1),), page_size=16, pages_per_row=16, head_dim=32, spare_tokens=0)
ONE_PAGE_BLOCKS = dict(pallas_block_k=16)
FULL_WINDOW = Scenario(
    "full_window", ((256, 1),), page_size=16, pages_per_row=16, head_dim=32, spare_tokens=0
)


def test_kv_splits_grow_the_grid_toward_the_target():
    tiles = RaggedAttentionTiles(pallas_target_programs=256, pallas_max_kv_splits=32)
    assert kv_splits(2, 64, tiles) == 32  # B=1 decode, 2 kv heads, 4096-key window in 64-key blocks
    assert kv_splits(32, 64, tiles) == 8  # 16 decode rows
    assert kv_splits(8, 4, tiles) == 4  # never more splits than key blocks
    assert kv_splits(300, 64, tiles) == 1  # a prefill chunk already fills the GPU
    assert kv_splits(200, 64, tiles) == 1
    assert kv_splits(2, 64, RaggedAttentionTiles(pallas_kv_splits=3)) == 3  # forced
    assert kv_splits(2, 2, RaggedAttentionTiles(pallas_kv_splits=8)) == 2
    assert kv_splits(2, 64, DEFAULT_TILES) == 32


def test_merge_splits_of_empty_and_real_splits():
    """Empty splits (no keys: max MASK_VALUE, sum 0) weigh nothing; an item with no keys is 0."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 8))  # 3 splits of 8 keys, one query row
    values = rng.standard_normal((3, 8, 4))
    acc = np.einsum("sk,skd->sd", np.exp(logits - logits.max(1, keepdims=True)), values)
    row_max, row_sum = logits.max(1), np.exp(logits - logits.max(1, keepdims=True)).sum(1)
    empty = (np.zeros((1, 4)), np.full((1,), -0.7 * np.finfo(np.float32).max), np.zeros((1,)))
    parts = [np.concatenate([a, e])[:, None] for a, e in zip((acc, row_max, row_sum), empty)]
    out = merge_splits(*(jnp.asarray(p, jnp.float32) for p in parts), jnp.float32)
    weights = np.exp(logits.ravel() - logits.max())
    want = weights @ values.reshape(24, 4) / weights.sum()
    np.testing.assert_allclose(np.asarray(out)[0], want, rtol=1e-5, atol=1e-6)
    nothing = merge_splits(*(jnp.asarray(e, jnp.float32)[None, :, None][0] for e in empty), jnp.float32)
    assert (np.asarray(nothing) == 0).all()


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_layer_is_a_runtime_value(impl):
    """A traced layer (the layer loop of a scan, or one jitted call for every layer) reads the
    named layer only, and one trace serves every layer. On a GPU the Pallas case runs the
    compiled kernel (the GPU check), elsewhere the interpreter."""
    args = make_case(LONG, 2, jnp.float32, seed=3)
    q, k_pages, v_pages, *rest = args
    poison = jnp.full_like(k_pages, jnp.nan)
    k_stack = jnp.stack([poison, k_pages, poison])
    v_stack = jnp.stack([poison, v_pages, poison])
    traces = []
    on_gpu = jax.default_backend() == "gpu"

    @jax.jit
    def run(layer):
        traces.append(layer)
        return ragged_paged_attention(
            q,
            k_stack,
            v_stack,
            *rest,
            sm_scale=0.25,
            impl=impl,
            interpret=impl == "pallas" and not on_gpu,
            layer=layer,
        )

    out = run(jnp.int32(1))
    want = ragged_paged_attention_reference(q, k_stack, v_stack, *rest, sm_scale=0.25, layer=1)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)
    assert np.isnan(np.asarray(run(jnp.int32(0)))[: int(rest[-1].sum())]).all()  # layer 0 is NaN
    assert len(traces) == 1
    with pytest.raises(ValueError, match="layer must be an int"):
        ragged_paged_attention(q, k_stack, v_stack, *rest, sm_scale=0.25, impl="xla", layer=jnp.float32(1))
    with pytest.raises(ValueError, match="layer must be an int"):
        ragged_paged_attention(q, k_stack, v_stack, *rest, sm_scale=0.25, impl="xla", layer=jnp.int32(3))


class TestSplitKvKernel:
    """Split-KV against the reference, compiled on a GPU; the subclass runs it interpreted."""

    INTERPRET = False

    @pytest.fixture(autouse=True)
    def _needs_gpu_unless_interpreted(self):
        if not self.INTERPRET and jax.default_backend() != "gpu":
            pytest.skip("compiled Pallas needs a GPU; the Interpret subclass covers CPU")

    def attend(self, args, **tiles):
        return ragged_paged_attention(
            *args,
            sm_scale=args[0].shape[2] ** -0.5,
            impl="pallas",
            interpret=self.INTERPRET,
            tiles=RaggedAttentionTiles(**tiles),
        )

    @pytest.mark.parametrize("splits", [1, 3, 4, 16])
    def test_forced_splits_match_reference(self, splits):
        args = make_case(LONG, 2, jnp.float32, seed=splits)
        check_against_reference(
            self.attend(args, pallas_kv_splits=splits, **ONE_PAGE_BLOCKS), args, jnp.float32
        )

    @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
    def test_shape_chosen_splits_match_reference(self, dtype):
        """One decode row and 2 kv heads: the default choice splits the 16 blocks 16 ways."""
        assert kv_splits(2, 16, DEFAULT_TILES) == 16
        args = make_case(ONE_ROW, 4, dtype, seed=7)
        check_against_reference(self.attend(args, **ONE_PAGE_BLOCKS), args, dtype)

    @pytest.mark.parametrize("splits", [1, 4])
    def test_a_context_past_the_page_window_reads_only_the_window(self, splits):
        """A row whose context runs past its page table's window (refused when the context is
        concrete; inside a program, where it is traced, one bad state must not fault the GPU)
        attends to the window's keys and reads no page id past its row: the same output as a
        context of exactly the window."""
        q, k, v, tables, context_lens, starts, lens = args = make_case(FULL_WINDOW, 2, jnp.float32, seed=5)
        past = (q, k, v, tables, context_lens + 3 * 16, starts, lens)
        with pytest.raises(ValueError, match="a context exceeds"):
            self.attend(past)
        out = jax.jit(lambda *a: self.attend(a, pallas_kv_splits=splits, **ONE_PAGE_BLOCKS))(*past)
        check_against_reference(out, args, jnp.float32)

    def test_splits_agree_with_no_split(self):
        args = make_case(LONG, 4, jnp.float32, seed=11)
        whole = np.asarray(self.attend(args, pallas_kv_splits=1, **ONE_PAGE_BLOCKS))
        split = np.asarray(self.attend(args, pallas_kv_splits=8, **ONE_PAGE_BLOCKS))
        np.testing.assert_allclose(split, whole, atol=2e-6, rtol=2e-6)


class TestSplitKvKernelInterpret(TestSplitKvKernel):
    INTERPRET = True


def _export_for_cuda(f, *shapes):
    return export.export(
        jax.jit(f),
        platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*shapes)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: jnp.dtype(d).name)
def test_engine_shapes_lower_to_one_triton_kernel_for_all_layers(dtype):
    """The shapes the engine compiles (default model: 6 q heads, 2 kv heads, head_dim 32; a
    Qwen3-8B-like 32/8/128), at decode B=1 (split-KV), B=16 and a prefill chunk, exported for
    cuda with four layers called by Python int as the model does: the Triton lowering accepts
    them, and the module holds one kernel, not one per layer."""
    s = jax.ShapeDtypeStruct
    for heads, kv_heads, dim, tokens, rows in (
        (6, 2, 32, 1, 1),
        (32, 8, 128, 1, 1),
        (6, 2, 32, 16, 16),
        (32, 8, 128, 256, 1),
    ):
        pages = s((4, kv_heads, 257, 16, dim), dtype)
        ints = [s((rows, 256), jnp.int32)] + [s((rows,), jnp.int32)] * 3

        def all_layers(q, k, v, *meta, sm_scale=dim**-0.5):
            attend = functools.partial(ragged_paged_attention, sm_scale=sm_scale, impl="pallas")
            return sum(attend(q, k, v, *meta, layer=i) for i in range(4))

        module = _export_for_cuda(
            all_layers, s((tokens, heads, dim), dtype), pages, pages, *ints
        ).mlir_module()
        assert module.count("__gpu$xla.gpu.triton") == 1, (heads, tokens)


def test_is_tracer_without_jax_core_tracer(monkeypatch):
    """The fallback for a jax without `jax.core.Tracer` tells traced from concrete values too."""
    from helios_jax.kernels import jax_compat

    for tracer_class in (jax_compat._TRACER, None):
        monkeypatch.setattr(jax_compat, "_TRACER", tracer_class)
        seen = []

        def record(x, seen=seen):
            seen.append(jax_compat.is_tracer(x))
            return x

        jax.jit(record)(jnp.int32(1))
        assert seen == [True]
        assert not jax_compat.is_tracer(jnp.int32(1)) and not jax_compat.is_tracer(np.ones(2))
        assert jax_compat.triton_dot(jnp.ones((2, 3)), jnp.ones((4, 3)), trans_b=True).shape == (2, 4)
