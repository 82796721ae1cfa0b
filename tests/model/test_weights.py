"""Checkpoint folders: save/load round trips and errors that name what is wrong."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from helios_jax.model import load_checkpoint, save_checkpoint, tiny_config
from helios_jax.model.weights import expected_tensors, parse_size

from .helpers import random_params


def _tokenizer() -> Tokenizer:
    """A word-level tokenizer built in memory (no download)."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("the quick brown fox jumps".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _assert_same_params(a, b):
    fa, fb = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k].dtype == fb[k].dtype, k
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=str(k))


@pytest.mark.parametrize(
    "tied, dtype, shard", [(False, "float32", None), (True, "bfloat16", "8KB"), (False, "float32", 20_000)]
)
def test_round_trip_with_mtp_head_and_tokenizer(tied, dtype, shard, tmp_path):
    config = tiny_config(tie_word_embeddings=tied, dtype=dtype, mtp_num_layers=1)
    params = random_params(config, seed=1)
    save_checkpoint(tmp_path, config, params, _tokenizer(), max_shard_size=shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == (shard is not None)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == config
    assert loaded.has_mtp
    _assert_same_params(loaded.params, params)
    assert loaded.tokenizer.encode("the quick fox").ids == [1, 2, 4]
    names = set(expected_tensors(config))
    assert {
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
    } <= names
    assert ("lm_head.weight" in names) == (not tied)


def test_load_casts_to_requested_dtype(tmp_path):
    config = tiny_config()
    params = random_params(config, seed=2)
    save_checkpoint(tmp_path, config, params)
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    assert loaded.config.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(loaded.params))
    assert loaded.tokenizer is None


def test_mtp_head_count_comes_from_tensors_when_config_is_silent(tmp_path):
    config = tiny_config(mtp_num_layers=1)
    save_checkpoint(tmp_path, config, random_params(config, seed=3))
    d = json.loads((tmp_path / "config.json").read_text())
    del d["mtp_num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_checkpoint(tmp_path).config.mtp_num_layers == 1


def _saved(tmp_path, **overrides):
    config = tiny_config(**overrides)
    save_checkpoint(tmp_path, config, random_params(config, seed=4))
    return tmp_path / "model.safetensors"


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path)
    _saved(tmp_path).unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_checkpoint(tmp_path)


def test_missing_shard_is_named(tmp_path):
    config = tiny_config()
    save_checkpoint(tmp_path, config, random_params(config, seed=5), max_shard_size="8KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=victim.name):
        load_checkpoint(tmp_path)


def _rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    path = _saved(tmp_path)
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        load_checkpoint(tmp_path)


def test_missing_mtp_tensor_is_named_when_config_declares_a_head(tmp_path):
    path = _saved(tmp_path, mtp_num_layers=1)
    _rewrite(path, lambda t: t.pop("mtp.fc.weight"))
    with pytest.raises(ValueError, match=r"mtp\.fc\.weight"):
        load_checkpoint(tmp_path)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    path = _saved(tmp_path)

    def shrink(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:, :31].copy()

    _rewrite(path, shrink)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\(64, 31\).*\(64, 32\)"):
        load_checkpoint(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    path = _saved(tmp_path)
    _rewrite(path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected.*q_proj\.bias"):
        load_checkpoint(tmp_path)


def test_parse_size():
    assert parse_size(123) == 123
    assert parse_size("20KB") == 20_000
    assert parse_size("2MiB") == 2 * 2**20
    with pytest.raises(ValueError):
        parse_size("lots")
