"""Token ids of a rendered chat: control tokens from the template, plain text from the user.

`encode_plain` encodes text with no added token recognized (special or not): the normalizer,
the pre-tokenizer and the model of the ``tokenizers`` pipeline, without its added-token
extraction (the same path as transformers' ``_encode_without_added_tokens``). It reads the
tokenizer and mutates nothing, so server threads can share one tokenizer.

`encode_marked` encodes a rendering produced from marked messages
(`helios_jax.runtime.chat_template.mark_control_tokens`): piece by piece, as transformers'
``encode_marked_chat`` does, so the ids equal ``apply_chat_template(..., tokenize=True,
sanitize_control_tokens=True)``.

`prefix_endpoints` gives the scheduler's checkpoint anchors: the token count of the rendering
up to and including each message, kept only where those ids are a prefix of the prompt.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Sequence

import tokenizers

from helios_jax.runtime.chat_template import MARK_END, MARK_START


def encode_plain(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
    """`text` as plain text: ``<|im_start|>`` becomes ``<``, ``|``, ``im``..., never its id."""
    if tokenizer.normalizer is not None:
        text = tokenizer.normalizer.normalize_str(text)
    splits = [text]
    if tokenizer.pre_tokenizer is not None:
        splits = [split for split, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    return [token.id for split in splits for token in tokenizer.model.tokenize(split)]


def encode_parsed(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
    """`text` with added tokens recognized (the template's markup), no BOS/EOS added."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def independent_segments_pattern(tokenizer: tokenizers.Tokenizer) -> re.Pattern | None:
    """A regex capturing the tokenizer's added tokens when its encoding of a text is the
    concatenation of its segments' encodings, the text split at those tokens; else None.

    ``tokenizers`` splits a text at its added tokens before normalizing and pre-tokenizing, and
    encodes each segment on its own; a token that strips the whitespace beside it, matches only
    whole words or only after normalization, or a Metaspace pre-tokenizer (which prefixes only
    the first segment) or Prepend normalizer breaks that, and such a tokenizer gets None.
    The regex tries longer tokens first: the leftmost-longest match ``tokenizers`` makes.
    """
    added = list(tokenizer.get_added_tokens_decoder().values())
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
        return None
    config = json.loads(tokenizer.to_str())
    pipeline = json.dumps([config.get("normalizer"), config.get("pre_tokenizer")])
    if '"Metaspace"' in pipeline or '"Prepend"' in pipeline:
        return None
    longest_first = sorted({t.content for t in added}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")


class SegmentEncoder:
    """Encodes rendered chats with added tokens recognized, reusing the full rendering's ids.

    With an independent-segments pattern (`independent_segments_pattern`), a text is split at
    added tokens and each segment encoded on its own, as ``tokenizers`` does. The first text
    encoded (the full rendering) is indexed: the token count after each of its added tokens.
    A later text that is a prefix of it (a conversation prefix's rendering) takes the indexed
    ids up to its last added token that the full text also has ending there, and encodes only
    the rest: literal tokens matched leftmost-longest split a prefix exactly where they split
    the whole. So every message endpoint costs about one encode of the prompt. Without a
    pattern, every text is encoded whole (exact for any tokenizer, quadratic in the messages).
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, added_re: re.Pattern | None):
        self._tok = tokenizer
        self._added_re = added_re
        self._text: str | None = None  # the indexed text
        self._ids: list[int] = []
        self._token_ends: list[int] = []  # character end of each added token in the indexed text
        self._token_counts: list[int] = []  # ids up to and including that token

    def parsed(self, text: str) -> list[int]:
        if self._added_re is None:
            return encode_parsed(self._tok, text)
        if self._text is None:
            self._text = text
            self._ids = self._split_encode(text, self._token_ends, self._token_counts)
            return list(self._ids)
        if self._text.startswith(text):
            i = bisect.bisect_right(self._token_ends, len(text)) - 1
            if i >= 0:
                end = self._token_ends[i]
                return self._ids[: self._token_counts[i]] + self._split_encode(text[end:])
        return self._split_encode(text)

    def _split_encode(self, text: str, token_ends: list | None = None, token_counts: list | None = None):
        ids: list[int] = []
        position = 0
        for j, segment in enumerate(self._added_re.split(text)):
            position += len(segment)
            if j % 2 == 1:
                ids.append(self._tok.token_to_id(segment))
                if token_ends is not None and token_counts is not None:
                    token_ends.append(position)
                    token_counts.append(len(ids))
            elif segment:
                ids += encode_parsed(self._tok, segment)
        return ids

    def plain(self, text: str) -> list[int]:
        return encode_plain(self._tok, text)


def _encode_piece(encoder: SegmentEncoder, piece: str, as_text: bool, newline: list[int]) -> list[int]:
    """A piece from the middle of a chat. It is encoded after a newline that is then removed,
    so a SentencePiece tokenizer does not add the prefix space it adds at a string's start."""
    encode = encoder.plain if as_text else encoder.parsed
    ids = encode("\n" + piece)
    if ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return encode(piece)


def encode_marked(
    tokenizer: tokenizers.Tokenizer, text: str, markers_re: re.Pattern, encoder=None
) -> list[int]:
    """Token ids of a rendering whose user-side control tokens are marked.

    ``markers_re.split`` gives [text, marked token, text, ..., text] (None in place of the
    token for a lone marker, which is dropped but still separates the text around it).
    `encoder` (a `SegmentEncoder`) defaults to one that encodes every text whole.

    Raises:
      ValueError: the tokenizer produces a control token's id from its plain text, so the token
        cannot be kept out of user text.
    """
    encoder = encoder or SegmentEncoder(tokenizer, None)
    pieces = markers_re.split(text) if MARK_START in text or MARK_END in text else [text]
    newline = encode_parsed(tokenizer, "\n")
    ids = encoder.parsed(pieces[0])
    for i, piece in enumerate(pieces[1:], start=1):
        if not piece:
            continue
        as_text = i % 2 == 1
        piece_ids = _encode_piece(encoder, piece, as_text, newline)
        if as_text and tokenizer.token_to_id(piece) in piece_ids:
            raise ValueError(
                f"cannot keep {piece!r} out of user text: the tokenizer produces it from plain text"
            )
        ids += piece_ids
    return ids


def prefix_endpoints(
    messages: Sequence[dict],
    full_text: str,
    full_ids: Sequence[int],
    render_prefix: Callable[[Sequence[dict]], str | None],
    encode: Callable[[str], list[int]],
) -> tuple[int, ...]:
    """The exact token endpoint of each message whose rendering is a prefix of the prompt.

    Message i's endpoint is ``len(encode(render_prefix(messages[:i + 1])))``, the conversation
    up to and including message i rendered without a generation prompt. It is kept only when
    that rendering is a text prefix of `full_text` and its ids are a prefix of `full_ids`; a
    template that renders a message differently once later turns follow (Qwen3 drops an
    earlier assistant turn's thinking) loses that endpoint rather than getting a false one, and
    so does a prefix the template refuses to render (`render_prefix` returns None: Qwen3.5's
    template raises on a conversation without a user message, such as a lone system message).
    The cost is one render and at most one `encode` per message (little more than the prompt's
    own encode with a `SegmentEncoder` that reuses the full rendering's ids).
    """
    endpoints: list[int] = []
    for i in range(len(messages)):
        text = render_prefix(messages[: i + 1])
        if text is None or not text or not full_text.startswith(text):
            continue
        ids = encode(text)
        end = len(ids)
        if 0 < end <= len(full_ids) and list(full_ids[:end]) == ids and end not in endpoints:
            endpoints.append(end)
    return tuple(sorted(endpoints))
