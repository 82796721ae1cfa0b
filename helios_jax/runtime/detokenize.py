"""Incremental detokenization with stop strings and stop buffering.

Each request keeps its output token ids and the text already sent. New tokens re-decode the
whole output (byte-level BPE merges across token boundaries) and the new suffix becomes visible
except for what must wait:

- an incomplete UTF-8 character at the end (decoded as U+FFFD) is held back;
- text that could still become a stop string is held back (stop buffering), so a stop string
  is never shown; when a stop string appears, the text before it is the last visible text.

A burst whose visible text is empty publishes nothing (the scheduler's delivery is postponed
until output actually becomes visible).
"""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    def __init__(self, decode, stop: Sequence[str] = ()):
        self._decode = decode
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.sent = ""  # text already made visible
        self.stopped = False

    def _held(self, text: str) -> int:
        """Characters at the end of `text` that must wait (partial character, stop prefix)."""
        hold = 0
        while hold < len(text) and text[len(text) - 1 - hold] == "\ufffd":
            hold += 1
        body = text[: len(text) - hold]
        for s in self.stop:
            for k in range(min(len(s) - 1, len(body)), 0, -1):
                if body.endswith(s[:k]):
                    hold = max(hold, k + (len(text) - len(body)))
                    break
        return hold

    def feed(self, ids: Sequence[int], *, final: bool = False) -> str:
        """Add tokens; returns newly visible text. `final`: flush what was held back."""
        if self.stopped:
            return ""
        self.ids.extend(int(i) for i in ids)
        text = self._decode(self.ids)
        cut = None
        for s in self.stop:
            at = text.find(s, max(0, len(self.sent) - len(s) + 1))
            if at >= 0 and (cut is None or at < cut):
                cut = at
        if cut is not None:
            self.stopped = True
            visible = text[:cut]
        elif final:
            visible = text.rstrip("\ufffd")
        else:
            visible = text[: len(text) - self._held(text)]
        # Re-decoding never retracts visible text; a changed earlier part simply waits.
        new = visible[len(self.sent) :] if visible.startswith(self.sent) else ""
        self.sent += new
        return new
