"""Prompt lookup's matching rule: the longest earlier match of the suffix, its latest occurrence,
its continuation up to the limit; the incremental index equals the naive scan."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.runtime.lookup import LookupConfig, PromptLookup, lookup_reference

A, B, C, D, X, Y = range(1, 7)


def test_the_worked_example_of_the_module_docstring():
    config = LookupConfig(min_match=1, max_match=3)
    lookup = PromptLookup([A, B, C, D, A, B, C], config)
    assert lookup.propose(4) == (D, A, B, C)
    lookup.extend([X])
    assert lookup.propose(4) == ()


def test_the_longest_match_wins_over_a_later_shorter_one():
    # Suffix "X A B": "A B" last occurred at 5 (before D), "X A B" only at 0 (before C).
    context = [X, A, B, C, Y, A, B, D, X, A, B]
    assert PromptLookup(context, LookupConfig(1, 3)).propose(2) == (C, Y)
    assert PromptLookup(context, LookupConfig(1, 2)).propose(2) == (D, X)  # only "A B": the latest


def test_the_latest_occurrence_wins_among_equal_lengths():
    context = [A, B, C, A, B, D, A, B]
    assert PromptLookup(context, LookupConfig(2, 2)).propose(1) == (D,)


def test_short_matches_below_min_match_propose_nothing():
    assert PromptLookup([A, C, D, A], LookupConfig(2, 4)).propose(3) == ()
    assert PromptLookup([A, C, D, A], LookupConfig(1, 4)).propose(3) == (C, D, A)


def test_the_limit_and_the_context_end_bound_the_proposal():
    lookup = PromptLookup([A, B, A, B], LookupConfig(1, 2))  # suffix "A B" at 0: continuation "A B"
    assert lookup.propose(5) == (A, B)  # never past the context's end
    assert lookup.propose(1) == (A,)
    assert lookup.propose(0) == ()


def test_a_suffix_never_matches_itself():
    assert PromptLookup([A, B, C], LookupConfig(1, 3)).propose(3) == ()


def test_bad_match_lengths_are_refused():
    with pytest.raises(ValueError):
        LookupConfig(min_match=0)
    with pytest.raises(ValueError):
        LookupConfig(min_match=3, max_match=2)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=12),
    st.integers(1, 3),
    st.integers(0, 3),
    st.integers(0, 6),
)
def test_the_incremental_index_equals_the_naive_scan(bursts, min_match, extra, limit):
    """Tokens committed burst by burst (as rounds commit them); a small alphabet makes repeats."""
    config = LookupConfig(min_match, min_match + extra)
    lookup = PromptLookup(config=config)
    context = []
    for burst in bursts:
        lookup.extend(burst)
        context += burst
        assert lookup.propose(limit) == lookup_reference(context, limit, config)
