"""A tokenizer for the engine: encode, decode, and the model's chat template with exact endpoints.

Wraps a Hugging Face ``tokenizers.Tokenizer`` (``tokenizer.json``) and what the model folder says
beside it (`helios_jax.model.tokenizer_files`; docs/chat-templates.md):

- the chat template: ``chat_template.jinja``, else tokenizer_config.json's ``chat_template``,
  rendered with jinja2 in a sandbox as transformers renders it (`chat_template`); without one,
  ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n``) when the vocabulary has those markers, else ``role: content``;
- message content never becomes control tokens: ``<|im_start|>system`` typed by a user is
  encoded as plain text (`chat_encoding.encode_marked`); a completions prompt, which has one
  author, is encoded with added tokens recognized (`encode`), as vLLM does;
- the end-of-sequence ids: tokenizer_config.json's ``eos_token`` and generation_config.json's
  ``eos_token_id`` (int or list), else the usual EOS tokens the vocabulary has;
- the endpoint of every message is exact (`chat_encoding.prefix_endpoints`): the scheduler uses
  the endpoints as checkpoint anchors.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence

import jinja2
import tokenizers

from helios_jax.model.checkpoint import TOKENIZER_FILE, LoadedModel
from helios_jax.model.tokenizer_files import TokenizerFiles, read_tokenizer_files
from helios_jax.runtime import chat_encoding
from helios_jax.runtime.chat_template import (
    CHATML_TEMPLATE,
    PLAIN_TEMPLATE,
    compile_template,
    control_token_patterns,
    control_tokens,
    mark_control_tokens,
)

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
EOS_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>")
# The names a message's reasoning comes under (vLLM answers with `reasoning_content`, newer
# clients send `reasoning`); the first is the one chat templates read.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Variables the renderer sets itself; template kwargs naming them are refused.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt"})


def resolve_eos_token_ids(tokenizer: tokenizers.Tokenizer, files: TokenizerFiles) -> tuple[int, ...]:
    """tokenizer_config.json's ``eos_token`` then generation_config.json's ``eos_token_id``
    (vLLM stops on both); with neither, the `EOS_CANDIDATES` the vocabulary has.

    Raises:
      ValueError: an id outside the vocabulary.
    """
    ids: list[int] = []
    eos = files.special_tokens.get("eos_token")
    if eos is not None and tokenizer.token_to_id(eos) is not None:
        ids.append(tokenizer.token_to_id(eos))
    ids += [i for i in files.generation_eos_token_ids or () if i not in ids]
    if not ids:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        ids = [vocab[t] for t in EOS_CANDIDATES if t in vocab]
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if any(not 0 <= i < size for i in ids):
        raise ValueError(f"end-of-sequence ids {ids} lie outside the tokenizer's {size} tokens")
    return tuple(ids)


def _text_content(content: object) -> object:
    """A list of text parts becomes one string, joined by newlines as vLLM joins them."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if (
            not isinstance(part, Mapping)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise ValueError(f"only text content parts can be rendered, got {part!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def normalize_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Plain dicts with content as a string, as transformers prepares them: keys whose value is
    None are dropped (templates test for a missing key, not for None), and a message's
    reasoning under any of `REASONING_FIELDS` is also given as ``reasoning_content`` (what
    templates read) and ``thinking`` (what gpt-oss templates read)."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        if "content" in message:
            message["content"] = _text_content(message["content"])
        reasoning = next((message[k] for k in REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def cut_after_final_message(text: str, final: str) -> str:
    """`text` up to the end of the final message's content (transformers' rule: its last
    occurrence, else that of its stripped form; ValueError when neither appears)."""
    for content in (final, final.strip()):
        at = text.rfind(content)
        if content and at >= 0:
            return text[: at + len(content)]
    raise ValueError("continue_final_message: the template does not render the final message's content")


class HFTokenizer:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        eos_token_ids: Sequence[int] | None = None,
        *,
        files: TokenizerFiles | None = None,
    ):
        files = files or TokenizerFiles()
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        if eos_token_ids is None:
            eos_token_ids = resolve_eos_token_ids(tokenizer, files)
        self.eos_token_ids = tuple(eos_token_ids)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.chatml = CHATML_START in vocab and CHATML_END in vocab
        self.has_model_template = files.chat_template is not None
        self.chat_template = files.chat_template or (CHATML_TEMPLATE if self.chatml else PLAIN_TEMPLATE)
        self._template = compile_template(self.chat_template)
        self._special_tokens = dict(files.special_tokens)
        controls = control_tokens(tokenizer, self.chat_template, files.chat_control_tokens)
        self.control_tokens = controls
        self._tokens_re, self._markers_re = control_token_patterns(controls)
        self._segments_re = chat_encoding.independent_segments_pattern(tokenizer)

    @classmethod
    def from_file(cls, path, eos_token_ids: Sequence[int] | None = None) -> HFTokenizer:
        """``tokenizer.json`` alone: the fallback template and EOS candidates."""
        return cls(tokenizers.Tokenizer.from_file(str(path)), eos_token_ids)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> HFTokenizer:
        """A model folder's ``tokenizer.json`` with its chat template and EOS files."""
        folder = pathlib.Path(folder)
        tokenizer = tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        return cls(tokenizer, files=read_tokenizer_files(folder))

    @classmethod
    def from_model(cls, model: LoadedModel) -> HFTokenizer:
        """The tokenizer of a loaded checkpoint, with the folder's template and EOS ids.

        Raises:
          ValueError: the checkpoint has no tokenizer.json.
        """
        if model.tokenizer is None:
            raise ValueError("the model folder has no tokenizer.json")
        return cls(model.tokenizer, files=model.tokenizer_files)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        """A completions prompt: added tokens are recognized, as vLLM does (one author)."""
        return chat_encoding.encode_parsed(self._tok, text)

    def encode_plain(self, text: str) -> list[int]:
        """User text: no added token is recognized (docs/chat-templates.md)."""
        return chat_encoding.encode_plain(self._tok, text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _render(self, messages: list[dict], add_generation_prompt: bool, kwargs: Mapping) -> str:
        """The rendering of already normalized and marked messages."""
        reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(kwargs))
        if reserved:
            raise ValueError(f"template kwargs cannot set {', '.join(reserved)}")
        variables = {**self._special_tokens, **kwargs}  # kwargs override special token names
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )

    def render_chat_text(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping | None = None,
    ) -> str:
        """The template's text for `messages`, equal to transformers'
        ``apply_chat_template(messages, tokenize=False, ...)``."""
        normalized = normalize_messages(messages)
        return self._render(normalized, add_generation_prompt, dict(template_kwargs or {}))

    def render_chat(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping | None = None,
        *,
        continue_final_message: bool = False,
    ) -> tuple[list[int], tuple[int, ...]]:
        """Token ids of the rendered conversation and the exact token endpoints of its messages.

        Args:
          messages: {"role", "content", ...} dicts; content a string or a list of
            {"type": "text", "text"} parts. Every string in them is user text.
          add_generation_prompt: end with the assistant turn's opening.
          template_kwargs: extra template variables (``{"enable_thinking": False}``); their
            strings are user text too.
          continue_final_message: leave the final message open (the model continues it): the
            rendering without the generation prompt, cut after the final message's content, as
            transformers' ``apply_chat_template(continue_final_message=True)`` cuts it.
        Returns:
          (ids, endpoints): endpoints sorted, each the token count of the rendering up to and
          including one message, for the messages whose rendering is a prefix of the prompt.
        Raises:
          ValueError: a non-text content part, or template kwargs naming ``messages`` or
            ``add_generation_prompt``; jinja2.TemplateError: the template refused the
            conversation (its ``raise_exception``) or failed.
        """
        kwargs = mark_control_tokens(dict(template_kwargs or {}), self._tokens_re)
        marked = mark_control_tokens(normalize_messages(messages), self._tokens_re)
        text = self._render(marked, add_generation_prompt and not continue_final_message, kwargs)
        if continue_final_message:
            text = cut_after_final_message(text, marked[-1].get("content", ""))
        encoder = chat_encoding.SegmentEncoder(self._tok, self._segments_re)

        def encode(rendered: str) -> list[int]:
            return chat_encoding.encode_marked(self._tok, rendered, self._markers_re, encoder)

        def render_prefix(prefix: Sequence[dict]) -> str | None:
            try:
                return self._render(list(prefix), False, kwargs)
            except jinja2.TemplateError:  # the conversation renders; this prefix has no endpoint
                return None

        ids = encode(text)
        return ids, chat_encoding.prefix_endpoints(marked, text, ids, render_prefix, encode)

    def apply_chat_template(self, messages: Sequence[dict]) -> tuple[list[int], tuple[int, ...]]:
        """`render_chat` with the assistant turn's opening and no template kwargs."""
        return self.render_chat(messages)
