"""The selection entry points: every family's candidates, pruned, and the preferred one."""
from __future__ import annotations

from helios_jax.scheduler import utility
from helios_jax.scheduler.policy.generation import generation_rows
from helios_jax.scheduler.policy.mixed import mixed_rows
from helios_jax.scheduler.policy.prefill import prefill_rows
from helios_jax.scheduler.policy.prerequisites import prerequisite_rows
from helios_jax.scheduler.policy.ranking import ScoredRow, best, prune_dominated
from helios_jax.scheduler.policy.selection import Selection, SelectionInput
from helios_jax.scheduler.policy.snapshots import terminal_rows
from helios_jax.scheduler.view import Candidate


def scored(inp: SelectionInput) -> list[ScoredRow]:
    """Every program's best non-dominated candidate(s), scored but not yet materialised."""
    sel = Selection(inp)
    rows = (generation_rows(sel) + prefill_rows(sel) + mixed_rows(sel) + terminal_rows(sel)
            + prerequisite_rows(sel))
    return prune_dominated(rows, sel.prepared)


def candidates(inp: SelectionInput) -> list[Candidate]:
    """Every program's best non-dominated candidate(s), materialised."""
    return [r.build() for r in scored(inp)]


def select(inp: SelectionInput) -> Candidate | None:
    """The preferred candidate, or None when nothing is runnable.

    Only the leading rows (all indeterminate ones, or those within the tie tolerance of the
    best score) are materialised and compared in full.
    """
    rows = scored(inp)
    if not rows:
        return None
    pool = [r for r in rows if r.indeterminate] or rows
    top = max(r.score for r in pool)
    tied = [r for r in pool if utility.nearly_equal(r.score, top)]
    return best([r.build() for r in tied], inp.views)
