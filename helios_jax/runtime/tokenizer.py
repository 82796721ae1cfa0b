"""A tokenizer for the engine: encode, decode, and a chat template with exact message endpoints.

Wraps a Hugging Face ``tokenizers.Tokenizer`` (``tokenizer.json``). The chat template is ChatML
(``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n``) when
the vocabulary has those markers, as Qwen tokenizers do; otherwise a plain ``role: content``
rendering. Each message is encoded on its own, so the token endpoint of every message is exact:
the scheduler uses them as checkpoint anchors.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
EOS_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>")


class HFTokenizer:
    def __init__(self, tokenizer: tokenizers.Tokenizer, eos_token_ids: Sequence[int] | None = None):
        self._tok = tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        if eos_token_ids is None:
            eos_token_ids = [vocab[t] for t in EOS_CANDIDATES if t in vocab]
        self.eos_token_ids = tuple(eos_token_ids)
        self.chatml = CHATML_START in vocab and CHATML_END in vocab

    @classmethod
    def from_file(cls, path, eos_token_ids: Sequence[int] | None = None) -> HFTokenizer:
        return cls(tokenizers.Tokenizer.from_file(str(path)), eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[dict]) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of the conversation, ending with the assistant's turn opening, and the
        exact token endpoint of each message."""
        ids: list[int] = []
        endpoints = []
        for message in messages:
            role, content = message["role"], message["content"]
            if self.chatml:
                text = f"{CHATML_START}{role}\n{content}{CHATML_END}\n"
            else:
                text = f"{role}: {content}\n"
            ids += self._tok.encode(text, add_special_tokens=False).ids
            endpoints.append(len(ids))
        opening = f"{CHATML_START}assistant\n" if self.chatml else "assistant: "
        ids += self._tok.encode(opening, add_special_tokens=False).ids
        return ids, tuple(endpoints)
