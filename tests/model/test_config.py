"""ModelConfig reads every spelling of a Qwen3 config.json that the loader promises to read."""

import pytest

from helios_jax.model import ModelConfig, tiny_config

BASE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


@pytest.mark.parametrize(
    "extra, theta",
    [
        ({"rope_theta": 5e5}, 5e5),
        ({"rope_parameters": {"rope_theta": 2e6, "rope_type": "default"}}, 2e6),
        ({"rope_theta": 1e4, "rope_scaling": None}, 1e4),
    ],
)
def test_rope_theta_spellings(extra, theta):
    assert ModelConfig.from_hf_dict({**BASE, **extra}).rope_theta == theta


def test_fields_and_defaults():
    c = ModelConfig.from_hf_dict({**BASE, "torch_dtype": "bfloat16"})
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.queries_per_kv) == (8, 2, 32, 4)
    assert c.head_dim != c.hidden_size // c.num_heads
    assert c.dtype == "bfloat16" and c.tie_word_embeddings and c.rms_norm_eps == 1e-5
    assert c.mtp_num_layers == 0 and not c.has_mtp
    no_head_dim = {k: v for k, v in BASE.items() if k != "head_dim"}
    assert ModelConfig.from_hf_dict(no_head_dim).head_dim == 8
    assert ModelConfig.from_hf_dict({**BASE, "dtype": "float32"}).dtype == "float32"


@pytest.mark.parametrize("key", ["mtp_num_hidden_layers", "num_nextn_predict_layers"])
def test_mtp_layer_count_keys(key):
    assert ModelConfig.from_hf_dict({**BASE, key: 1}).mtp_num_layers == 1


def test_hf_dict_round_trip():
    c = tiny_config(mtp_num_layers=1, tie_word_embeddings=True, rope_theta=123.0)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c
    assert hash(c) == hash(ModelConfig.from_hf_dict(c.to_hf_dict()))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn"}}, "rope_type"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"dtype": "int8"}, "dtype"),
        ({"vocab_size": None}, None),
    ],
)
def test_bad_configs_are_value_errors(change, message):
    d = {**BASE, **change}
    if change.get("vocab_size", 0) is None:
        del d["vocab_size"]
        message = "vocab_size"
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict(d)
