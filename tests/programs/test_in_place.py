"""The KV caches are updated in place: no compiled program copies a whole cache.

A copy of the target or draft cache per layer costs as much as reading the whole pool; on the
CPU it once made `decode[B=1]` twenty times slower than `decode[B=2]` (a one-token write became
a dynamic-update-slice that the compiler guarded with copies, because the attention loop reads
the same buffer). These tests compile programs ahead of time, as the engine does, and look for
copies of a cache-shaped array in the optimised HLO.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.programs.program_set import build_program
from helios_jax.programs.state import state_shapes

from ..model.helpers import widened_pools
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


MULTISTEP_B1 = GraphDescriptor(GraphKind.DECODE, 1, token_capacity=1, target_capacity=1, steps=4)


@pytest.mark.parametrize("name", ["decode-B1", "drafted-B1", "prefill", "multistep-B1"])
def test_no_bfloat16_program_widens_a_cache(name, params):
    """On a CPU a bf16 cache is stored as its bits (uint16) and gathered and scattered as bits
    (kernels/raw_bits.py): this compiler has no bf16 scatter or gather and, given one, converts
    the whole pool to float32 and back (hoisting the copy out of the attention's key loop), which
    made a default-model `decode[B=1]` 30 ms against 0.6 ms in float32; and a bit cast of a whole
    bf16 pool is a copy here, so none may appear either (a K-step program would pay it every
    step). No float32 or bf16 array shaped like a cache, whole or with its pages flattened as the
    attention reads them, may appear in the compiled program."""
    state = state_shapes(BF16, ENGINE)
    bf16_params = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, BF16.jnp_dtype), params)
    shape = MULTISTEP_B1 if name == "multistep-B1" else SHAPES[name]
    program = build_program(BF16, ENGINE, shape)
    hlo = program.compile(bf16_params, state).as_text()
    pools = [leaf for leaf in jax.tree_util.tree_leaves(state) if len(leaf.shape) == 5]
    assert pools and all(leaf.dtype == jnp.uint16 for leaf in pools), "a CPU stores bf16 pools as bits"
    widened = {m for leaf in pools for m in widened_pools(hlo, leaf.shape)}
    assert not widened, f"{program.name} converts a whole cache: {sorted(widened)}"
