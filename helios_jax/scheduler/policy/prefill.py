"""Prefill and scored prefill programs: one request's prompt chunk per program.

Each capacity is offered the tokens it can actually consume (prompt length, stops, atomic image
spans). There is no smallest-fit filter, duration ceiling, oldest filter or lateness cost: a
chunk whose work a smaller prepared chunk does as well is left to the dominance rule, and an
*unmeasured* capacity is excluded from exploration when a smaller prepared one consumes the same
tokens up to the next message or prompt endpoint.
"""

from __future__ import annotations

import functools

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import PromptTable
from helios_jax.scheduler.view import Lane


def prefill_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Each prefill program's best prompt row (scored prefill: only requests that need scores)."""
    prompts = sel.prompts
    if prompts.count == 0:
        return []
    found = []
    for g in sel.prepared.prefill:
        if g.batch_capacity > 1:  # multi-prompt prefill: `batchprefill`
            continue
        i = _best_prompt(sel, g)
        if i is not None:
            cap = g.token_capacity
            found.append(
                sel.score(
                    g,
                    float(prompts.values(cap)[i]),
                    0.0,
                    None,
                    functools.partial(_prompt_lanes, prompts, i, cap),
                )
            )
    return found


def _best_prompt(sel: Selection, g: GraphDescriptor) -> int | None:
    prompts = sel.prompts
    work = prompts.work(g.token_capacity)
    allowed = (prompts.needs_scores == (g.kind is GraphKind.SCORED_PREFILL)) & (work > 0)
    smaller = sel.prepared.largest_smaller_chunk.get(id(g))
    if smaller is not None:  # the same work on a smaller chunk (work grows with the chunk)
        allowed &= prompts.work(smaller) != work
    if not sel.costs.is_known(g.key):
        smaller_capacities = [h.token_capacity for h in sel.prepared.smaller_prefill[g]]
        allowed &= ~prompts.excluded_from_exploration(smaller_capacities, work)
    return prompts.pick(allowed, g.token_capacity)


def _prompt_lanes(prompts: PromptTable, i: int, capacity: int) -> list[Lane]:
    return [prompts.lane(i, capacity)]
