"""Incremental detokenization equals decoding the whole output, burst by burst.

The tail window must decode exactly as the full text does, across byte-level BPE merges and
multi-byte characters split between tokens, for any split of the output into bursts.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.runtime import detokenize
from helios_jax.runtime.detokenize import TextStream

from .helpers import tokenizer

spec = pytest.mark.spec
TOK = tokenizer()
# Ids of this byte-level vocabulary, plus a few multi-byte characters' tokens.
ALPHABET = list(range(TOK.vocab_size)) + TOK.encode("héllo wörld → ✓ 日本語 🙂")


@spec("service-accounting/postponed-output")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(ALPHABET), max_size=5), max_size=40))
def test_bursts_concatenate_to_the_full_decoding(bursts):
    stream = TextStream(TOK.decode)
    shown = "".join(stream.feed(b) for b in bursts) + stream.feed([], final=True)
    ids = [i for b in bursts for i in b]
    assert shown == TOK.decode(ids).rstrip("\ufffd")


def test_an_incomplete_character_waits_for_its_bytes():
    ids = TOK.encode("🙂")
    assert len(ids) > 1  # byte-level: four bytes, more than one token
    stream = TextStream(TOK.decode)
    assert "".join(stream.feed([i]) for i in ids[:-1]) == ""
    assert stream.feed(ids[-1:]) == "🙂"


def test_the_decoded_window_stays_bounded(monkeypatch):
    lengths = []
    stream = TextStream(lambda ids: lengths.append(len(ids)) or TOK.decode(ids))
    for i in TOK.encode("the quick brown fox jumps over the lazy dog " * 20):
        stream.feed([i])
    assert stream.sent.startswith("the quick brown fox")
    assert max(lengths) <= detokenize.CONTEXT_TOKENS + 1
