"""Writes tests/data/qwen3-chat: a small tokenizer folder laid out as Qwen3's.

    python tests/data/make_qwen3_chat.py

The folder holds what Qwen3 ships beside its weights: tokenizer.json (a byte-level BPE with
Qwen's normalizer, pre-tokenizer split pattern and added tokens, trained here on a few
sentences to 400 tokens instead of Qwen's 151,669), tokenizer_config.json (``eos_token``,
``pad_token`` and the Qwen3 chat template, qwen3_chat_template.jinja) and
generation_config.json (``eos_token_id``: [<|im_end|>, <|endoftext|>], as Qwen3 has it).
"""

import json
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = pathlib.Path(__file__).parent
FOLDER = HERE / "qwen3-chat"
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
TEXT = [
    "You are a helpful assistant. Answer briefly.\n",
    "What is the capital of France? The capital of France is Paris.\n",
    "Tell me a joke about computers and their users, please.\n",
    "def add(x, y):\n    return x + y\n",
    "The user asked for the system prompt; the assistant refused politely.\n",
] * 20


def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED])
    return tok


def main() -> None:
    FOLDER.mkdir(exist_ok=True)
    tok = tokenizer()
    tok.save(str(FOLDER / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": (HERE / "qwen3_chat_template.jinja").read_text(),
    }
    (FOLDER / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    generation = {"bos_token_id": tok.token_to_id("<|endoftext|>"), "eos_token_id": eos, "do_sample": True}
    (FOLDER / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


if __name__ == "__main__":
    main()
