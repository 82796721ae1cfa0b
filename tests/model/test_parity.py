"""Logits equal transformers' Qwen3ForCausalLM on tiny random checkpoints it saves itself.

Each case builds a seeded random `Qwen3ForCausalLM` (initializer_range 0.1 and perturbed norm
weights, so that a transposed matrix, a swapped rotary half or a misplaced q/k norm moves the
logits by far more than the tolerance), writes it with `save_pretrained`, loads it with
`load_checkpoint` and compares float32 logits (max abs error <= 1e-4). The grid covers tied and
untied embeddings, head_dim != hidden/heads, GQA ratios 1, 2 and 4, the rotary base given as
`rope_parameters` (transformers >= 5) and as the legacy top-level `rope_theta`, and a sharded
save. The last test goes the other way: transformers loads a folder that `save_checkpoint`
wrote (MTP tensors included, which transformers ignores).
"""

import json

import numpy as np
import pytest
import torch
import transformers

from helios_jax.model import load_checkpoint, save_checkpoint, tiny_config

from .helpers import max_abs, random_params

transformers.logging.set_verbosity_error()

# name -> (Qwen3Config overrides, rope spelling written to config.json)
CASES = {
    "untied_gqa2_headdim16": (
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            rope_theta=10_000.0,
        ),
        "rope_parameters",
    ),
    "tied_gqa1_legacy_rope_theta": (
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=8,
            tie_word_embeddings=True,
            rope_theta=1_000_000.0,
        ),
        "rope_theta",
    ),
    "untied_gqa4_legacy_rope_theta": (
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=False,
            rope_theta=500_000.0,
        ),
        "rope_theta",
    ),
    "tied_gqa4_headdim24": (
        dict(
            hidden_size=48,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=24,
            tie_word_embeddings=True,
            rope_theta=1_000_000.0,
        ),
        "rope_parameters",
    ),
}


def _hf_model(overrides, seed):
    config = transformers.Qwen3Config(
        vocab_size=384,
        intermediate_size=96,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        attn_implementation="eager",
        **overrides,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _write_legacy_rope_theta(folder):
    """Rewrites config.json the way transformers < 5 saved Qwen3: a top-level rope_theta."""
    path = folder / "config.json"
    d = json.loads(path.read_text())
    d["rope_theta"] = d.pop("rope_parameters")["rope_theta"]
    d["torch_dtype"] = d.pop("dtype", "float32")
    path.write_text(json.dumps(d))


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)[None]).logits[0].numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path):
    overrides, rope_spelling = CASES[case]
    model = _hf_model(overrides, seed=1)
    model.save_pretrained(tmp_path)
    if rope_spelling == "rope_theta":
        _write_legacy_rope_theta(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config.rope_theta == overrides["rope_theta"]
    assert loaded.config.head_dim == overrides["head_dim"]
    assert loaded.config.tie_word_embeddings == overrides["tie_word_embeddings"]
    assert not loaded.has_mtp
    tokens = np.random.default_rng(2).integers(0, 384, size=24)
    want = _hf_logits(model, tokens)
    got = np.asarray(loaded.forward_logits(tokens))
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(want).max() > 0.5  # logits are not vanishingly small
    assert max_abs(got, want) <= 1e-4


def test_sharded_checkpoint_matches_transformers(tmp_path):
    overrides, _ = CASES["untied_gqa2_headdim16"]
    model = _hf_model(overrides, seed=3)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    tokens = np.random.default_rng(4).integers(0, 384, size=24)
    got = np.asarray(load_checkpoint(tmp_path).forward_logits(tokens))
    assert max_abs(got, _hf_logits(model, tokens)) <= 1e-4


@pytest.mark.parametrize("tied", [False, True])
def test_transformers_reads_saved_checkpoint(tied, tmp_path):
    config = tiny_config(vocab_size=384, tie_word_embeddings=tied, mtp_num_layers=1)
    params = random_params(config, seed=5)
    save_checkpoint(tmp_path, config, params, max_shard_size="30KB" if tied else None)
    model = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tokens = np.random.default_rng(6).integers(0, 384, size=24)
    got = np.asarray(load_checkpoint(tmp_path).forward_logits(tokens))
    assert max_abs(got, _hf_logits(model, tokens)) <= 1e-4
