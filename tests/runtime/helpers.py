"""A tiny random model with a small byte-level BPE tokenizer, for engine tests."""

from __future__ import annotations

import functools

import jax
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from helios_jax.model import init_params, tiny_config
from helios_jax.runtime.tokenizer import HFTokenizer

TEXT = [
    "def f(x):\n    return x + 1\n",
    "hello world, the quick brown fox jumps over the lazy dog\n",
    "import os\nprint(os.getcwd())\n",
    "for i in range(10):\n    print(i)\n",
] * 20


@functools.cache
def tokenizer() -> HFTokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    return HFTokenizer(tok)


@functools.cache
def model(mtp: bool = True, seed: int = 0):
    config = tiny_config(
        vocab_size=tokenizer().vocab_size, mtp_num_layers=1 if mtp else 0, max_position_embeddings=4096
    )
    return config, init_params(config, jax.random.key(seed))
