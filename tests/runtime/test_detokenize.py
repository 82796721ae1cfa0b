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


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_ends_the_text_before_it_or_through_it(include):
    """vLLM's include_stop_str_in_output: the matched stop string ends the visible text,
    left out by default and kept with `include_stop`; nothing after it is ever shown."""
    stream = TextStream(TOK.decode, ("world", "wor"), include_stop=include)
    ids = TOK.encode("hello world and more")
    shown = "".join(stream.feed([i]) for i in ids) + stream.feed([], final=True)
    assert stream.stopped and shown == ("hello wor" if include else "hello ")


def test_special_tokens_reach_the_text_only_when_asked():
    eos = TOK.eos_token_ids[0]
    ids = TOK.encode("hi") + [eos]
    assert TOK.decode(ids) == "hi"
    special = TOK.decode(ids, skip_special_tokens=False)
    assert special.startswith("hi") and len(special) > 2
    stream = TextStream(lambda i: TOK.decode(i, skip_special_tokens=False))
    assert stream.feed(ids, final=True) == special


def test_the_decoded_window_stays_bounded(monkeypatch):
    lengths = []
    stream = TextStream(lambda ids: lengths.append(len(ids)) or TOK.decode(ids))
    for i in TOK.encode("the quick brown fox jumps over the lazy dog " * 20):
        stream.feed([i])
    assert stream.sent.startswith("the quick brown fox")
    assert max(lengths) <= detokenize.CONTEXT_TOKENS + 1
