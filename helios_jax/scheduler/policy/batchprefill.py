"""Multi-prompt prefill: B > 1 prompt rows, each one request's chunk of up to C tokens
(RESOLUTIONS.md, 26).

A cohort's value is the sum of its rows' prefill values (each row's priced prompt tokens, plus
its output price when the chunk ends the prompt), exactly as each row would earn on a one-row
prefill; the program competes by that value over its own measured duration. Requests that need
prompt scores run only scored prefill (B = 1).

Dominance, per cohort: a cohort of k rows on (B, C) is the work of a smaller prefill (B', C')
(both at most, one smaller) when k <= B' and every row consumes the same tokens at C' as at C.
Work grows with the chunk, so the rows flat at a chunk C' are also flat at every larger one:
the binding dominators of size k are those with the largest C' among B' >= k. The best
surviving k-row cohort is therefore the top k rows when one of them is not flat there, else the
top k - 1 plus the best non-flat row; the candidate is the best over k (equal values: more
rows). An unmeasured program leaves out, as one-row prefill does, the rows that a smaller
prepared chunk consumes the same way up to their next endpoint.
"""

from __future__ import annotations

import functools

import numpy as np

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import PromptTable
from helios_jax.scheduler.view import Lane


def batch_prefill_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Each multi-row prefill program's best non-dominated cohort of prompt rows."""
    prompts = sel.prompts
    found: list[ScoredCandidate] = []
    if prompts.count == 0:
        return found
    for g in sel.prepared.prefill:
        if g.batch_capacity == 1 or g.kind is not GraphKind.PREFILL:
            continue
        rows = best_rows(sel, g)
        if rows:
            cap = g.token_capacity
            value = float(prompts.values(cap)[rows].sum())
            found.append(sel.score(g, value, 0.0, None, functools.partial(_lanes, prompts, rows, cap)))
    return found


def best_rows(sel: Selection, g: GraphDescriptor) -> list[int]:
    """The rows of `g`'s best non-dominated cohort (module docstring); [] when none is legal."""
    prompts, cap = sel.prompts, g.token_capacity
    work = prompts.work(cap)
    allowed = ~prompts.needs_scores & (work > 0)
    if not sel.costs.is_known(g.key):
        smaller = [h.token_capacity for h in sel.prepared.smaller_prefill[g]]
        allowed &= ~prompts.excluded_from_exploration(smaller, work)
    values = prompts.values(cap)
    order = [int(i) for i in np.flatnonzero(allowed)]
    order.sort(key=lambda i: -values[i])  # stable: the selection's tie order among equal values
    best: list[int] = []
    best_value = -np.inf
    for k in range(1, min(g.batch_capacity, len(order)) + 1):
        rows = _best_of_size(prompts, order, k, _binding_chunk(sel, g, k), work)
        if rows is not None:
            total = float(values[rows].sum())
            if total >= best_value:  # equal values: more rows
                best, best_value = rows, total
    return best


def _binding_chunk(sel: Selection, g: GraphDescriptor, k: int) -> int | None:
    """The largest chunk of a smaller prefill program with at least k rows (None: none)."""
    chunks = [h.token_capacity for h in sel.prepared.dominators[g] if h.batch_capacity >= k]
    return max(chunks, default=None)


def _best_of_size(
    prompts: PromptTable, order: list[int], k: int, chunk: int | None, work: np.ndarray
) -> list[int] | None:
    top = order[:k]
    if chunk is None:
        return top
    flat = prompts.work(chunk) == work
    if not all(flat[i] for i in top):
        return top
    rest = [i for i in order[k:] if not flat[i]]
    return top[: k - 1] + rest[:1] if rest else None


def _lanes(prompts: PromptTable, rows: list[int], capacity: int) -> list[Lane]:
    return [prompts.lane(i, capacity) for i in rows]
