"""Candidates and selection (spec, "Useful service and selection", "Prerequisites and completion").

:func:`select` returns the prepared program to run next with its cohort and per-lane work,
chosen by expected useful value per execution time (``utility.py``). Every loaded program
competes through its best non-dominated cohort; one module per program family:

- ``generation`` (decode, speculative): unconstrained programs take their highest additive lane
  values; fixed host ragged programs solve the B/P capacity problem exactly; adaptive ragged
  programs search cohort prefixes under three orderings priced by the causal allocation;
- ``prefill`` (prefill and scored prefill): each capacity with the tokens it can actually
  consume (prompt length, stops, atomic image spans); no smallest-fit filter, duration ceiling,
  oldest filter or lateness cost; an *unmeasured* capacity is excluded from exploration when a
  smaller prepared one consumes the same tokens up to the next message or prompt endpoint;
- ``mixed``: per shape, the best decode-only cohort and the best prompt row with the
  highest-value decoders in the remaining rows (exact over every legal cohort); prompt-only is
  legal;
- ``snapshots`` (terminal snapshots): terminal value and terminal age, under the same score and
  padding rules;
- ``prerequisites`` (initialize, restore, vision, window snapshots): the exact fixed-pair
  two-stage calculation against every following inference shape (``following``), and the
  individual continuation index V*T/(T+F) for longer chains.

Shared pieces: ``prepared`` groups a mode's programs once (:class:`PreparedGraphs`);
``selection`` holds one decision's input and state; ``tables`` the lane tables of runnable
decoders and prompts; ``ranking`` the scored candidates, the dominance filter and the tie order
(:func:`better`); ``selector`` the entry points :func:`scored`, :func:`candidates` and
:func:`select`.

Cost: the work is vectorised per family and a candidate's lanes are built only when it is
materialised (the winner, tied rivals, or an explicit :func:`candidates` listing), so a decision
stays near a millisecond with 64 resident requests (``scripts/bench/scheduler_select.py``).
"""

from helios_jax.scheduler.policy.prepared import (
    PREREQUISITE_KINDS,
    PreparedGraphs,
    as_prepared,
    capacities,
)
from helios_jax.scheduler.policy.ranking import ScoredCandidate, best, better, recency
from helios_jax.scheduler.policy.selection import Selection, SelectionInput
from helios_jax.scheduler.policy.selector import (
    bounded_rows,
    candidates,
    rows_with_ragged_programs,
    scored,
    select,
    selection_rows,
)

__all__ = [
    "PREREQUISITE_KINDS",
    "PreparedGraphs",
    "ScoredCandidate",
    "Selection",
    "SelectionInput",
    "as_prepared",
    "best",
    "better",
    "bounded_rows",
    "candidates",
    "capacities",
    "recency",
    "rows_with_ragged_programs",
    "scored",
    "select",
    "selection_rows",
]
