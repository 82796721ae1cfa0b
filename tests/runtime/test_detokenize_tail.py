"""The tail-only TextStream shows exactly the text the whole-text bookkeeping it replaced showed.

`WholeText` is the previous implementation, kept here as the reference: it held the whole
decoded text and the whole sent text and searched, held back and cut on them. Any stop
strings, `include_stop`, bursts, a final flush and decoders whose window text is not a prefix
of the full text (the whole-text fallback) must give the same bursts and the same stop.
"""

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.runtime.detokenize import CONTEXT_TOKENS, TextStream

from .helpers import tokenizer

TOK = tokenizer()
ALPHABET = list(range(TOK.vocab_size)) + TOK.encode("héllo wörld → ✓ 日本語 🙂")
STOPS = ["o", "lo", "wo", "ld", " w", "🙂", "日本", "→ ✓", "\ufffd", "oo", "héllo", "llo w", "LO"]


class WholeText:
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


PIECES = [TOK.encode(w) for w in ["hé", "llo", "l", "o", " wo", "rld", "→ ✓", "日本", "語", " "]]
PIECES += [[i] for i in TOK.encode("🙂日")]  # the bytes of multi-byte characters, one by one
QUIRK = TOK.encode(" wo")[-1]


def _quirky(ids):
    """A decoder whose window text is not always a prefix of the whole text: a window ending
    in QUIRK decodes upper-cased (the engine falls back to whole-text bookkeeping)."""
    text = TOK.decode(ids)
    return text.upper() if ids and ids[-1] == QUIRK else text


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(PIECES), st.lists(st.sampled_from(ALPHABET), max_size=2)), max_size=24
    ),
    st.lists(st.integers(1, 4), min_size=1, max_size=8),
    st.lists(st.sampled_from(STOPS), max_size=3),
    st.booleans(),
    st.sampled_from([TOK.decode, _quirky]),
    st.booleans(),
)
def test_bursts_and_stops_equal_the_whole_text_bookkeeping(pieces, sizes, stop, include, decode, final):
    ids = [i for piece in pieces for i in piece]
    bursts, at = [], 0
    while at < len(ids):
        size = sizes[len(bursts) % len(sizes)]
        bursts.append(ids[at : at + size])
        at += size
    new, old = TextStream(decode, stop, include), WholeText(decode, stop, include)
    for i, burst in enumerate(bursts):
        last = final and i == len(bursts) - 1
        assert new.feed(burst, final=last) == old.feed(burst, final=last)
        assert new.stopped == old.stopped
    assert new.feed([], final=True) == old.feed([], final=True)
    assert new.sent == old.sent and new.text == old.text


def test_a_long_output_keeps_a_short_tail():
    stream = TextStream(TOK.decode, ("never shown",))
    for i in TOK.encode("the quick brown fox jumps over the lazy dog " * 40):
        stream.feed([i])
    assert len(stream._pending) + len(stream._lookback) <= 2 * len("never shown") + 8 * CONTEXT_TOKENS
    assert stream.sent.startswith("the quick brown fox")
