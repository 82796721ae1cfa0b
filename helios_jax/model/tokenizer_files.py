"""The tokenizer-side files of a Hugging Face model folder, beside ``tokenizer.json``.

    folder/
      chat_template.jinja        the chat template (preferred when present, as transformers does)
      tokenizer_config.json      ``chat_template`` (a string, or a list of {"name", "template"}
                                 whose "default" entry is used), ``eos_token``, ``bos_token``, ...
                                 and ``chat_control_tokens``
      generation_config.json     ``eos_token_id``: an int or a list of ints

`read_tokenizer_files` reads them into a `TokenizerFiles`; every file is optional, and a
missing one leaves its fields empty. The runtime tokenizer (`helios_jax.runtime.tokenizer`)
renders the template and resolves the end-of-sequence ids from them (docs/chat-templates.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# The tokenizer_config.json entries transformers passes to every template render
# (`special_tokens_map`): Llama-style templates write `bos_token` themselves.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """What a model folder says about chat rendering and end of sequence.

    Attributes:
      chat_template: the jinja source, or None when the folder has none.
      special_tokens: token name ("eos_token", "bos_token", ...) -> its text, from
        tokenizer_config.json; only names that are set.
      generation_eos_token_ids: generation_config.json's ``eos_token_id``, or None when absent.
      chat_control_tokens: tokenizer_config.json's ``chat_control_tokens``, or None when absent.
    """

    chat_template: str | None = None
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    generation_eos_token_ids: tuple[int, ...] | None = None
    chat_control_tokens: tuple[str, ...] | None = None


def read_tokenizer_files(folder: str | os.PathLike) -> TokenizerFiles:
    """Reads chat_template.jinja, tokenizer_config.json and generation_config.json in `folder`.

    Raises:
      ValueError: a file is present but malformed (the file and field are named).
    """
    folder = pathlib.Path(folder)
    config = _read_json(folder / TOKENIZER_CONFIG_FILE)
    generation = _read_json(folder / GENERATION_CONFIG_FILE)
    template_path = folder / CHAT_TEMPLATE_FILE
    if template_path.is_file():
        template = template_path.read_text(encoding="utf-8")
    else:
        template = _config_template(config.get("chat_template"), folder / TOKENIZER_CONFIG_FILE)
    controls = config.get("chat_control_tokens")
    return TokenizerFiles(
        chat_template=template,
        special_tokens=_special_tokens(config),
        generation_eos_token_ids=_eos_ids(generation.get("eos_token_id"), folder / GENERATION_CONFIG_FILE),
        chat_control_tokens=None if controls is None else tuple(str(t) for t in controls),
    )


def _read_json(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return value


def _config_template(value: object, path: pathlib.Path) -> str | None:
    """tokenizer_config.json's ``chat_template``: a string, or the named-list form whose
    "default" entry transformers uses when no template name is asked for."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, dict)}
        template = named.get("default")
        if isinstance(template, str):
            return template
        raise ValueError(f"{path}: chat_template lists {sorted(map(str, named))} but no 'default'")
    raise ValueError(f"{path}: chat_template must be a string or a list of named templates")


def _special_tokens(config: dict) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):  # the serialized AddedToken form: {"content": ..., ...}
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _eos_ids(value: object, path: pathlib.Path) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{path}: eos_token_id must be an int or a list of ints, got {value!r}")
    return tuple(values)
