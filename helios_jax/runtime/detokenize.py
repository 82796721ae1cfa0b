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
    def __init__(self, decode, stop: Sequence[str] = (), include_stop: bool = False):
        self._decode = decode
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop
        self.ids: list[int] = []
        self.text = ""  # text of ids[:read_offset]
        self.sent = ""  # text already made visible (a prefix of `text`)
        self.stopped = False
        self._prefix_offset = 0
        self._read_offset = 0

    def _held(self, text: str) -> int:
        """Characters at the end of `text` that must wait (a prefix of a stop string)."""
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    return k
        return 0

    def _read(self, final: bool) -> None:
        """Move decoded text of the unread tokens into `text`."""
        if self._read_offset == len(self.ids):
            return
        window = self.ids[self._prefix_offset :]
        known = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full = self._decode(window)
        if full.endswith("\ufffd") and not final:
            return  # an incomplete character: wait for its remaining bytes
        if not full.startswith(known):  # a decoder whose window text is not a prefix: decode all
            self.text = self._decode(self.ids)
        else:
            self.text += full[len(known) :]
        if final:
            self.text = self.text.rstrip("\ufffd")
        self._read_offset = len(self.ids)
        self._prefix_offset = max(0, self._read_offset - CONTEXT_TOKENS)

    def feed(self, ids: Sequence[int], *, final: bool = False) -> str:
        """Add tokens; returns newly visible text. `final`: flush what was held back."""
        if self.stopped:
            return ""
        self.ids.extend(int(i) for i in ids)
        self._read(final)
        text = self.text
        cut = end = None
        for s in self.stop:
            at = text.find(s, max(0, len(self.sent) - len(s) + 1))
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
        new = visible[len(self.sent) :] if visible.startswith(self.sent) else ""
        self.sent += new
        return new
