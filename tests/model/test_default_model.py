"""The shipped default model (helios_jax/assets/default_model, docs/default-model.md).

It must load through the ordinary checkpoint loader, carry an MTP head and a 4096-token context,
tokenize losslessly, decode greedily into something other than one repeated token, and its
head must make greedy speculation pay on text it was not trained on. The speculation numbers
come from `helios_jax.model.default.greedy_speculative_decode`, whose drafts are checked here
against the numpy oracle (reference/mtp.py) so that the threshold measures the head, not the
loop.
"""

import json
import pathlib
import sysconfig

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from helios_jax.model import load_checkpoint
from helios_jax.model.default import (
    SpeculationStats,
    default_model_path,
    greedy_decode,
    greedy_speculative_decode,
    load_default_model,
    speculation_round,
)
from helios_jax.reference.mtp import naive_proposals

from .helpers import hf_weights

DEPTH = 3
MAX_FOLDER_BYTES = 8 * 10**6


@pytest.fixture(scope="module")
def model():
    return load_default_model(dtype="float32")


@pytest.fixture(scope="module")
def held_out_prompts(model):
    """Token windows of held-out stdlib files, evenly spaced over their concatenation.

    The training run recorded which files it held out (training_info.json); they are read from
    this interpreter's stdlib, so the text is never one the model was trained on even when this
    Python's sources differ from the training run's.
    """
    info = json.loads((default_model_path() / "training_info.json").read_text())
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for rel in info["data"]["held_out_files"]:
        try:
            texts.append((root / rel).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # removed in this Python version
    ids = np.concatenate([model.tokenizer.encode(t).ids for t in texts if t.strip()])
    if len(ids) < 4096:
        pytest.skip("too little held-out text in this Python's stdlib")
    length = 64
    starts = np.linspace(0, len(ids) - length, 36).astype(int)
    return [ids[s : s + length] for s in starts]


def test_folder_loads_as_a_checkpoint_with_mtp_head_and_long_context(model):
    folder = default_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (folder / name).is_file(), name
    assert sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) <= MAX_FOLDER_BYTES
    shipped = load_checkpoint(folder)
    assert shipped.config.dtype == "bfloat16"
    assert shipped.has_mtp and model.has_mtp and model.config.mtp_num_layers == 1
    assert model.config.max_position_embeddings >= 4096
    assert model.config.vocab_size == model.tokenizer.get_vocab_size()
    # The float32 load computes with exactly the shipped (bf16) values.
    for a, b in zip(jax.tree.leaves(shipped.params), jax.tree.leaves(model.params)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))


def test_tokenizer_round_trips_and_has_the_chat_markers(model):
    tok = model.tokenizer
    for text in ["def f(x):\n    return x ** 2  # square\n", "naïve café — ünïcode ✓ 漢字 \t\r\n", ""]:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    ids = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert ids == [0, 1, 2]
    chat = "<|im_start|>user\nhi<|im_end|>\n"
    assert tok.encode(chat).ids[0] == 1 and 2 in tok.encode(chat).ids
    config = json.loads((default_model_path() / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"] and config["eos_token"] == "<|im_end|>"


def test_greedy_decoding_is_deterministic_and_not_degenerate(model):
    """24 greedy tokens after a fixed prompt: the same twice, and not a loop of one or two tokens
    (the shipped model gives 18 distinct tokens; a tiny model's greedy text does fall into
    longer loops, which is why the bar is 8)."""
    prompt = model.tokenizer.encode("def add(a, b):\n    return a + b\n\n\ndef").ids
    first = greedy_decode(model, prompt, 24)
    assert first == greedy_decode(model, prompt, 24)
    text = model.tokenizer.decode(first)
    assert len(set(first)) >= 8, text
    assert max(first.count(t) for t in first) <= 12, text
    assert any(c.isalpha() for c in text), text


def test_loop_drafts_what_the_oracle_drafts(model, held_out_prompts):
    """The first round's three drafts equal reference/mtp.py's naive proposals (float64)."""
    config, params = model.config, model.params
    weights = hf_weights(params)
    for prompt in held_out_prompts[:2]:
        prompt = prompt[:40]  # the oracle recomputes the whole draft sequence per proposal
        n = len(prompt)
        buf = np.zeros(128, np.int32)
        buf[:n] = prompt
        hidden = model.forward_hidden(buf)
        pending = int(np.argmax(np.asarray(model.forward_logits(prompt))[-1]))
        buf[n] = pending
        drafts, _, _ = speculation_round(config, params, hidden, DEPTH, jnp.asarray(buf), n - 1)
        expected, _ = naive_proposals(weights, config, np.asarray(hidden)[:n], buf[1 : n + 1], DEPTH)
        assert list(np.asarray(drafts)) == list(expected)


def _held_out_speculation(model, prompts) -> SpeculationStats:
    """Greedy decoding of 48 tokens from 4 prompts, plus one round from each of 32 contexts."""
    stats = SpeculationStats(DEPTH, ())
    for prompt in prompts[:4]:
        out, s = greedy_speculative_decode(model, prompt, 48, depth=DEPTH)
        stats = stats + s
    for context in prompts[4:]:
        stats = stats + greedy_speculative_decode(model, context, 2, depth=DEPTH)[1]
    return stats


def test_speculation_pays_on_held_out_text(model, held_out_prompts):
    """Three greedy drafts give >= 1.5 tokens per target forward on held-out text.

    About 200 rounds: 4 prompts decoded for 48 tokens each, and 32 single rounds that start from
    held-out text (so that a repetition loop in the decoded output cannot carry the number).
    The shipped head scores about 2.7 here. The training run's larger measurement gave 2.50
    over 4096 decoded tokens and 2.26 over 256 text rounds (docs/default-model.md), so 1.5
    leaves room for a different Python's stdlib text. A head that has learnt nothing drafts
    tokens unrelated to the context, which are accepted only by chance (about 1/V per draft).
    It scores about 1.0, and `test_a_random_head_does_not_pay` checks that this measurement
    tells the two apart.
    """
    stats = _held_out_speculation(model, held_out_prompts)
    assert stats.rounds >= 32 + 4 * 48 // (DEPTH + 1)
    assert stats.tokens_per_forward >= 1.5, stats.summary()
    assert stats.conditional_acceptance()[0] >= 0.4, stats.summary()


def test_a_random_head_does_not_pay(model, held_out_prompts):
    """One round from each of 16 held-out contexts with the `mtp.*` tensors re-initialised
    scores below 1.2 tokens per forward (the trained head scores about 2.4 on such rounds)."""
    rng = np.random.default_rng(1)
    flat = dict(traverse_util.flatten_dict(model.params))
    for path, value in flat.items():
        if path[0] == "mtp":  # norm scales 1, matrices N(0, 0.02): init_params' distribution
            fresh = np.ones(value.shape) if path[-1] == "weight" else rng.normal(0, 0.02, value.shape)
            flat[path] = jnp.asarray(fresh, value.dtype)
    random_head = type(model)(model.config, traverse_util.unflatten_dict(flat), model.tokenizer)
    stats = SpeculationStats(DEPTH, ())
    for context in held_out_prompts[4:20]:
        stats = stats + greedy_speculative_decode(random_head, context, 2, depth=DEPTH)[1]
    assert stats.tokens_per_forward < 1.2, stats.summary()
