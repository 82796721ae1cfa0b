"""Incremental detokenization with stop strings and stop buffering.

Each request keeps its output token ids and the text already sent. New tokens are decoded in a
bounded tail window, not by re-decoding the whole output: ``prefix_offset`` .. ``read_offset`` are
tokens already turned into text, kept as context so that merges across token boundaries
(byte-level BPE, SentencePiece's leading spaces) decode exactly as in the full text, and the new
text is what decoding ``ids[prefix_offset:]`` adds to decoding ``ids[prefix_offset:read_offset]``.
This is the offset scheme of ``tokenizers``' ``DecodeStream`` and of vLLM's and TGI's
detokenizers, written against the engine's ``decode(ids)`` so it serves any tokenizer (the test
fakes too). The window stays a few tokens long, so a burst costs the same at the thousandth token
as at the first.

What becomes visible waits for:

- an incomplete UTF-8 character at the end (decoded as U+FFFD): its tokens stay unread until
  the character completes;
- text that could still become a stop string (stop buffering), so a stop string is never shown;
  when a stop string appears, the text before it is the last visible text (with
  ``include_stop``, vLLM's ``include_stop_str_in_output``: the text through it).

A burst whose visible text is empty publishes nothing (the scheduler's delivery is postponed
until output actually becomes visible).
"""

from __future__ import annotations

from collections.abc import Sequence

# Tokens of context decoded before the unread ones (vLLM and TGI use 5 or 6).
CONTEXT_TOKENS = 6


class TextStream:
    """One request's output text: tokens in, newly visible text out (module docstring).

    Only the unsent tail of the text is kept as a string (`_pending`, text decoded but not yet
    visible, and `_lookback`, the last characters of the sent text a stop string could start
    in): a burst costs the same at any output length. A decoder whose window text is not a
    prefix of the full text switches the stream to whole-text bookkeeping (`_text`), where
    earlier text may change."""

    def __init__(self, decode, stop: Sequence[str] = (), include_stop: bool = False):
        self._decode = decode
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop
        self.ids: list[int] = []
        self.stopped = False
        self._prefix_offset = 0
        self._read_offset = 0
        self._reach = max((len(s) for s in self.stop), default=1) - 1  # lookback a stop may need
        self._sent_parts: list[str] = []  # text already made visible, in pieces
        self._pending = ""  # decoded text after the sent text
        self._lookback = ""  # the sent text's last `_reach` characters
        self._text: str | None = None  # whole-text bookkeeping: text of ids[:read_offset]

    @property
    def sent(self) -> str:
        """The text made visible so far."""
        if len(self._sent_parts) > 1:
            self._sent_parts = ["".join(self._sent_parts)]
        return self._sent_parts[0] if self._sent_parts else ""

    @property
    def text(self) -> str:
        """The text of the tokens read so far (`sent` is a prefix of it unless it changed)."""
        return self._text if self._text is not None else self.sent + self._pending

    def _held(self, text: str) -> int:
        """Characters at the end of `text` that must wait (a prefix of a stop string)."""
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    return k
        return 0

    def _read(self, final: bool) -> None:
        """Move decoded text of the unread tokens into the text."""
        if self._read_offset == len(self.ids):
            return
        window = self.ids[self._prefix_offset :]
        known = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(window)
        if full.endswith("\ufffd") and not final:
            return  # an incomplete character: wait for its remaining bytes
        if not full.startswith(known):  # a decoder whose window text is not a prefix: decode all
            self._text = self._decode(self.ids)
        elif self._text is not None:
            self._text += full[len(known) :]
        else:
            self._pending += full[len(known) :]
        if final:
            self._strip_incomplete()
        self._read_offset = len(self.ids)
        self._prefix_offset = max(0, self._read_offset - CONTEXT_TOKENS)

    def _strip_incomplete(self) -> None:
        """The final text loses a trailing incomplete character (U+FFFD)."""
        if self._text is not None:
            self._text = self._text.rstrip("\ufffd")
            return
        stripped = self._pending.rstrip("\ufffd")
        if stripped or not self.sent.endswith("\ufffd"):
            self._pending = stripped
        else:  # the strip reaches into sent text
            self._text = (self.sent + self._pending).rstrip("\ufffd")

    def feed(self, ids: Sequence[int], *, final: bool = False) -> str:
        """Add tokens; returns newly visible text. `final`: flush what was held back."""
        if self.stopped:
            return ""
        self.ids.extend(int(i) for i in ids)
        self._read(final)
        if self._text is not None:
            return self._visible_whole(final)
        # The tail from `base` characters before the unsent text: a stop string found from
        # `start` on begins after the sent text's first len(sent) - len(s) + 1 characters.
        tail, base = self._lookback + self._pending, len(self._lookback)
        cut = end = None
        for s in self.stop:
            at = tail.find(s, max(0, base - len(s) + 1))
            if at >= 0 and (cut is None or at < cut):
                cut, end = at, at + len(s)
        if cut is not None:
            self.stopped = True
            visible = end if self.include_stop else cut
        elif final or not self.stop:
            visible = len(tail)
        else:
            visible = len(tail) - self._held(tail)
        # Visible text is never retracted: a cut inside the sent text shows nothing more.
        new = tail[base:visible] if visible >= base else ""
        if new:
            self._sent_parts.append(new)
            self._pending = self._pending[len(new) :]
            self._lookback = (self._lookback + new)[-self._reach :] if self._reach else ""
        return new

    def _visible_whole(self, final: bool) -> str:
        """`feed` over the whole text, whose earlier part may have changed."""
        text, sent = self._text, self.sent
        cut = end = None
        for s in self.stop:
            at = text.find(s, max(0, len(sent) - len(s) + 1))
            if at >= 0 and (cut is None or at < cut):
                cut, end = at, at + len(s)
        if cut is not None:
            self.stopped = True
            visible = text[: end if self.include_stop else cut]
        elif final:
            visible = text
        else:
            visible = text[: len(text) - self._held(text)]
        # Visible text is never retracted; a changed earlier part simply waits.
        new = visible[len(sent) :] if visible.startswith(sent) else ""
        if new:
            self._sent_parts.append(new)
        return new
