"""Prompt lookup: copy proposals drafted from a request's own context (docs/copy-proposals.md).

The context is everything the request has committed: its prompt, then its output tokens up to
and including the pending one. The proposal for the next round copies what followed the longest
earlier match of the context's recent suffix:

  1. for n = max_match down to min_match, take the suffix s = context[L - n : L];
  2. find the latest start j < L - n at which s occurred before (context[j : j + n] == s);
  3. the first n with such a j wins: propose context[j + n : j + n + limit] (never past L).

"Latest" because an edit of code the prompt holds tends to continue the copy being made now,
not an earlier one; "longest" because a longer match predicts its continuation better.

Worked example (min_match 1, max_match 3, limit 4), context "a b c d a b c" (L = 7):
  n = 3: suffix "a b c" occurred at j = 0 -> propose context[3 : 7] = "d a b c".
  After "x" is appended (L = 8, suffix "c x"): "c x" and "x" never occurred -> no proposal.

The index makes each step cheap whatever the context length: for every n it maps each n-gram to
the start of the latest continuation seen after it. Appending one token inserts the max_match -
min_match + 1 n-grams that end just before it (their continuation is the new token), so the
n-grams ending at the last token, the query, are never in the index: a match is always earlier.
A round therefore costs O(max_match) dictionary operations per committed token plus one lookup;
:func:`lookup_reference` is the naive scan the tests hold the index to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class LookupConfig:
    """Match lengths tried, longest first (``min_match`` >= 1, ``max_match`` >= ``min_match``)."""

    min_match: int = 2
    max_match: int = 8

    def __post_init__(self):
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")


DEFAULT_LOOKUP = LookupConfig()


class PromptLookup:
    """The n-gram index of one request's context, updated as its tokens commit."""

    def __init__(self, tokens: Iterable[int] = (), config: LookupConfig = DEFAULT_LOOKUP):
        self.config = config
        self.tokens: list[int] = []
        # n -> {n-gram: start of the continuation after its latest occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(config.min_match, config.max_match + 1)
        }
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens to the context."""
        ctx, index = self.tokens, self._index
        for t in tokens:
            end = len(ctx)  # the n-grams ending at end - 1 gain the continuation starting at end
            for n, grams in index.items():
                if end >= n:
                    grams[tuple(ctx[end - n : end])] = end
            ctx.append(int(t))

    def propose(self, limit: int) -> tuple[int, ...]:
        """Up to `limit` tokens copied after the longest earlier match of the context's suffix
        (module docstring); empty when nothing matched or `limit` is 0."""
        ctx = self.tokens
        size = len(ctx)
        if limit <= 0:
            return ()
        for n in range(min(self.config.max_match, size - 1), self.config.min_match - 1, -1):
            start = self._index[n].get(tuple(ctx[size - n :]))
            if start is not None:
                return tuple(ctx[start : min(start + limit, size)])
        return ()


def lookup_reference(
    context: Sequence[int], limit: int, config: LookupConfig = DEFAULT_LOOKUP
) -> tuple[int, ...]:
    """The proposal of :meth:`PromptLookup.propose`, by a plain scan of the whole context."""
    ctx = [int(t) for t in context]
    size = len(ctx)
    if limit <= 0:
        return ()
    for n in range(config.max_match, config.min_match - 1, -1):
        if n >= size:
            continue
        suffix = ctx[size - n :]
        for j in range(size - n - 1, -1, -1):  # latest earlier start first
            if ctx[j : j + n] == suffix:
                return tuple(ctx[j + n : min(j + n + limit, size)])
    return ()
