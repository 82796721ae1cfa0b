"""Prefill and scored prefill programs: one request's prompt chunk per program.

Each capacity is offered the tokens it can actually consume (prompt length, stops, atomic image
spans). There is no smallest-fit filter, duration ceiling, oldest filter or lateness cost: a
chunk whose work a smaller prepared chunk does as well is left to the dominance rule, and an
*unmeasured* capacity is excluded from exploration when a smaller prepared one consumes the same
tokens up to the next message or prompt endpoint.
"""

from __future__ import annotations

import functools

import numpy as np

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import PromptTable
from helios_jax.scheduler.view import Lane


def prefill_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Each prefill program's best prompt row (scored prefill: only requests that need scores)."""
    prompts = sel.prompts
    programs = [g for g in sel.prepared.prefill if g.batch_capacity == 1]  # else `batchprefill`
    if prompts.count == 0 or not programs:  # (a probe's drafted programs: no prefill)
        return []
    found = []
    for g, i in zip(programs, _best_prompts(sel, programs)):
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


def _best_prompts(sel: Selection, programs: list[GraphDescriptor]) -> list[int | None]:
    """Each program's best allowed prompt row, every program's rows at once (one row of the
    [programs, prompts] matrices each)."""
    prompts = sel.prompts
    caps = [g.token_capacity for g in programs]
    smaller = [sel.prepared.largest_smaller_chunk.get(id(g)) for g in programs]
    index = {c: j for j, c in enumerate(dict.fromkeys(caps + [c for c in smaller if c is not None]))}
    work_at, values_at = prompts.rows_at(list(index))
    rows = [index[c] for c in caps]
    work = work_at[rows]
    scored = np.array([g.kind is GraphKind.SCORED_PREFILL for g in programs])
    allowed = (prompts.needs_scores[None, :] == scored[:, None]) & (work > 0)
    below = [(j, index[c]) for j, c in enumerate(smaller) if c is not None]
    if below:  # the same work on a smaller chunk (work grows with the chunk)
        mine, theirs = [j for j, _ in below], [k for _, k in below]
        allowed[mine] &= work_at[theirs] != work[mine]
    for j, g in enumerate(programs):
        if not sel.costs.is_known(g.key):
            smaller_capacities = [h.token_capacity for h in sel.prepared.smaller_prefill[g]]
            allowed[j] &= ~prompts.excluded_from_exploration(smaller_capacities, work[j])
    return prompts.pick_rows(allowed, values_at[rows], work)


def _prompt_lanes(prompts: PromptTable, i: int, capacity: int) -> list[Lane]:
    return [prompts.lane(i, capacity)]
