"""The KV caches are updated in place: no compiled program copies a whole cache.

A copy of the target or draft cache per layer costs as much as reading the whole pool; on the
CPU it once made `decode[B=1]` twenty times slower than `decode[B=2]` (a one-token write became
a dynamic-update-slice that the compiler guarded with copies, because the attention loop reads
the same buffer). These tests compile programs ahead of time, as the engine does, and look for
copies of a cache-shaped array in the optimised HLO.
"""

import re

import jax
import pytest

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.programs.program_set import build_program
from helios_jax.programs.state import state_shapes

from .helpers import MIXED_W1, MODEL, PREFILLS, SPECULATIVE_ENGINE, spec_graph

SHAPES = {
    "decode-B1": GraphDescriptor(GraphKind.DECODE, 1, token_capacity=1, target_capacity=1),
    "decode-B2": GraphDescriptor(GraphKind.DECODE, 2, token_capacity=1, target_capacity=2),
    "width-one-B1": spec_graph(1, 1, 0, 1),
    "drafted-B1": spec_graph(1, 4, 3, 4),
    "prefill": PREFILLS[0],
    "mixed": MIXED_W1,
}


def _spec(tree):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _cache_shapes(state) -> set[str]:
    """HLO spellings of the caches' shapes, e.g. 'f32[2,2,88,4,16]'."""
    out = set()
    for leaf in jax.tree_util.tree_leaves(state):
        if len(leaf.shape) == 5:
            dtype = {"float32": "f32", "bfloat16": "bf16"}[str(leaf.dtype)]
            out.add(f"{dtype}[{','.join(map(str, leaf.shape))}]")
    return out


# Pages of 16 tokens and a 512-token window: several key blocks per attention call, the shape
# under which the one-token write used to be guarded with copies (tiny windows were not).
ENGINE = SPECULATIVE_ENGINE.replace(page_size=16, max_model_len=512, kv_pages=None)


@pytest.fixture(scope="module")
def state():
    return state_shapes(MODEL, ENGINE)


@pytest.mark.parametrize("name", list(SHAPES))
def test_no_program_copies_a_cache(name, params, state):
    program = build_program(MODEL, ENGINE, SHAPES[name])
    hlo = program.compile(_spec(params), state).as_text()
    shapes = _cache_shapes(state)
    assert shapes, "the state has no cache-shaped arrays"
    copies = [
        line.strip()[:160]
        for line in hlo.splitlines()
        if re.search(r"= (\S+)\{[0-9,]*\} copy\(", line) and re.search(r"= (\S+)\{", line).group(1) in shapes
    ]
    assert not copies, f"{program.name} copies a whole cache:\n" + "\n".join(copies[:5])


BF16 = MODEL.replace(dtype="bfloat16")


@pytest.mark.parametrize("name", ["decode-B1", "drafted-B1", "prefill"])
def test_no_bfloat16_program_widens_a_cache(name, params):
    """In bf16 the caches are written and read in bf16 (kernels/raw_bits.py): the CPU compiler,
    given a bf16 scatter or gather, converts the whole pool to float32 and back (hoisting the
    copy out of the attention's key loop), which made a default-model `decode[B=1]` 30 ms
    against 0.6 ms in float32. No float32 array shaped like a cache may appear."""
    state = state_shapes(BF16, ENGINE)
    bf16_params = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, BF16.jnp_dtype), params)
    program = build_program(BF16, ENGINE, SHAPES[name])
    hlo = program.compile(bf16_params, state).as_text()
    pools = set()
    for leaf in jax.tree_util.tree_leaves(state):
        if len(leaf.shape) == 5 and leaf.dtype == BF16.jnp_dtype:  # whole, or flattened as attention reads it
            layers, heads, pages, size, dim = leaf.shape
            pools |= {f"f32[{','.join(map(str, leaf.shape))}]", f"f32[{layers * heads * pages},{size},{dim}]"}
    assert pools, "the bf16 state has no bf16 caches"
    widened = {m for m in re.findall(r"\bf32\[[0-9,]*\]", hlo) if m in pools}
    assert not widened, f"{program.name} converts a whole cache to float32: {sorted(widened)}"
