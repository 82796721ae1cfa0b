"""Fused sibling projections (`model/fused.py`): the same model, one product per group.

The fused forward (q/k/v as one `qkv_proj`, gate/up as one `gate_up_proj`) must equal the
separate products' forward, the draft head's included, on configurations whose grouped-query
layout a wrong grouping would scramble (two and four query heads per KV head); the layout must
be the one `init_params` declares for a fused config; and splitting must give back the
checkpoint's tensors exactly.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from helios_jax.model import draft_forward_full, forward_full, param_shapes, tiny_config
from helios_jax.model.forward import compute_logits
from helios_jax.model.fused import fuse_projections, split_projections
from helios_jax.model.sharding import param_spec

from .helpers import random_params

CONFIGS = {
    "gqa2": tiny_config(mtp_num_layers=1),
    "gqa4_tied": tiny_config(mtp_num_layers=1, num_kv_heads=1, tie_word_embeddings=True),
}


def _paths(tree) -> dict:
    return {path: leaf.shape for path, leaf in traverse_util.flatten_dict(tree).items()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_forward_equals_separate_products(name):
    config = CONFIGS[name]
    params = random_params(config, seed=3)
    fused_config, fused = fuse_projections(config, params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, 11), jnp.int32)

    def outputs(c, p):
        hidden = forward_full(c, p, tokens)
        draft = draft_forward_full(c, p, hidden[:-1], tokens[1:])
        return compute_logits(c, p, hidden), compute_logits(c, p, draft)

    want = outputs(config, params)
    got = outputs(fused_config, fused)
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(want[0]))) > 0.1  # the comparison is not between zeros


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_layout_is_the_one_a_fused_config_declares(name):
    config = CONFIGS[name]
    fused_config, fused = fuse_projections(config, random_params(config, seed=0))
    assert fused_config.fused_projections and not config.fused_projections
    assert _paths(fused) == _paths(param_shapes(fused_config))
    g = config.queries_per_kv
    qkv = fused["layers_0"]["self_attn"]["qkv_proj"]["kernel"]
    assert qkv.shape == (config.hidden_size, config.num_kv_heads, g + 2, config.head_dim)
    assert "q_proj" not in fused["mtp"]["layers_0"]["self_attn"]  # the draft head's blocks too


def test_split_gives_back_the_checkpoint_tensors_exactly():
    config = CONFIGS["gqa2"]
    params = random_params(config, seed=1)
    fused_config, fused = fuse_projections(config, params)
    assert fuse_projections(fused_config, fused) == (fused_config, fused)  # already fused: unchanged
    split_config, split = split_projections(fused_config, fused)
    assert split_config == config
    flat, want = traverse_util.flatten_dict(split), traverse_util.flatten_dict(params)
    assert flat.keys() == want.keys()
    for path, leaf in want.items():
        np.testing.assert_array_equal(np.asarray(flat[path]), np.asarray(leaf), err_msg=str(path))


def test_tensor_parallel_splits_fused_kernels_by_kv_head_and_intermediate():
    """A shard of `qkv_proj` holds whole KV groups (queries, key and value of its KV heads), and
    a shard of `gate_up_proj` the same intermediate columns of gate and up."""
    layer = ("layers_0",)
    assert tuple(param_spec(layer + ("self_attn", "qkv_proj", "kernel"))) == (None, "tp")
    assert tuple(param_spec(layer + ("mlp", "gate_up_proj", "kernel"))) == (None, None, "tp")
    assert tuple(param_spec(("mtp", "layers_0", "self_attn", "qkv_proj", "kernel"))) == (None, "tp")


def test_the_config_file_never_carries_the_layout():
    fused = CONFIGS["gqa2"].replace(fused_projections=True)
    assert "fused_projections" not in fused.to_hf_dict()
    assert type(fused).from_hf_dict(fused.to_hf_dict()) == CONFIGS["gqa2"]
