"""The selection entry points: every family's candidates, pruned, and the preferred one."""

from __future__ import annotations

from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.batchprefill import batch_prefill_candidates
from helios_jax.scheduler.policy.generation import generation_candidates
from helios_jax.scheduler.policy.mixed import mixed_candidates
from helios_jax.scheduler.policy.prefill import prefill_candidates
from helios_jax.scheduler.policy.prerequisites import prerequisite_candidates
from helios_jax.scheduler.policy.ranking import ScoredCandidate, best, prune_dominated
from helios_jax.scheduler.policy.selection import Selection, SelectionInput
from helios_jax.scheduler.policy.snapshots import terminal_candidates
from helios_jax.scheduler.view import Candidate


def scored(inp: SelectionInput, sel: Selection | None = None) -> list[ScoredCandidate]:
    """Every program's best non-dominated candidate(s), scored but not yet materialised
    (`sel`: ``Selection(inp)`` when the caller built it already)."""
    sel = Selection(inp) if sel is None else sel
    if sel.scored_rows is None:  # scored once per selection (a refresh alternative rereads them)
        found = (
            generation_candidates(sel)
            + prefill_candidates(sel)
            + batch_prefill_candidates(sel)
            + mixed_candidates(sel)
            + terminal_candidates(sel)
            + prerequisite_candidates(sel)
        )
        sel.scored_rows = tuple(prune_dominated(found, sel.prepared))
    return list(sel.scored_rows)


def candidates(inp: SelectionInput) -> list[Candidate]:
    """Every program's best non-dominated candidate(s), materialised."""
    return [r.build() for r in scored(inp)]


def select(inp: SelectionInput, sel: Selection | None = None) -> Candidate | None:
    """The preferred candidate, or None when nothing is runnable.

    Only the leading candidates (all indeterminate ones, or those within the tie tolerance of
    the best score) are materialised and compared in full.
    """
    found = scored(inp, sel)
    if not found:
        return None
    pool = [r for r in found if r.indeterminate] or found
    top = max(r.score for r in pool)
    tied = [r for r in pool if utility.nearly_equal(r.score, top)]
    return best([r.build() for r in tied], inp.views)
