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
    found = (
        generation_candidates(sel)
        + prefill_candidates(sel)
        + batch_prefill_candidates(sel)
        + mixed_candidates(sel)
        + terminal_candidates(sel)
        + prerequisite_candidates(sel)
    )
    return prune_dominated(found, sel.prepared)


def selection_rows(inp: SelectionInput) -> tuple[Selection, list[ScoredCandidate]]:
    """``Selection(inp)`` and its :func:`scored` rows, for a caller that reads them more than
    once (``Scheduler._plan``: the ordinary choice, a refresh alternative, a probe's tables).
    The rows are not kept on the selection: their builders refer to it, and the cycle would
    leave every decision's tables to the cyclic garbage collector."""
    sel = Selection(inp)
    return sel, scored(inp, sel)


def candidates(inp: SelectionInput) -> list[Candidate]:
    """Every program's best non-dominated candidate(s), materialised."""
    return [r.build() for r in scored(inp)]


def select(
    inp: SelectionInput, sel: Selection | None = None, rows: list[ScoredCandidate] | None = None
) -> Candidate | None:
    """The preferred candidate, or None when nothing is runnable.

    Only the leading candidates (all indeterminate ones, or those within the tie tolerance of
    the best score) are materialised and compared in full.
    """
    found = scored(inp, sel) if rows is None else rows  # rows: scored(inp), computed already
    if not found:
        return None
    pool = [r for r in found if r.indeterminate] or found
    top = max(r.score for r in pool)
    tied = [r for r in pool if utility.nearly_equal(r.score, top)]
    return best([r.build() for r in tied], inp.views)
