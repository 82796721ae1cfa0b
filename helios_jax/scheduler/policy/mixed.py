"""Mixed programs: one prompt row beside decode rows (spec, "Useful service and selection").

Per shape, two candidates: the best decode-only cohort (offered once per (B, W, D), on the
smallest prompt capacity, since it is the same work on every one), and the best prompt row with
the highest-value decoders in the remaining rows. Lane values are additive and the prompt row's
value does not depend on the decoders, so this is exact over every legal cohort; prompt-only is
legal. A prompt row is left out where a smaller shape serves the same decoders at the same
widths and consumes the same prompt tokens (dominance, decided before scoring).
"""

from __future__ import annotations

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler.policy.prepared import MixedShape
from helios_jax.scheduler.policy.ranking import ScoredCandidate
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.policy.tables import LaneTable
from helios_jax.scheduler.view import Lane

# The decoder work beside a prompt row: (lanes, depth, widths key), or 0 when there is none.
DecoderWork = tuple[int, int, bytes] | int
# Which prompt rows a shape may use: (its prompt capacity, the largest smaller capacity serving the
# same decoder work, or None).
Rule = tuple[int, int | None]
_NOT_PICKED = -1  # no prompt row index is negative
RULE_MEMO = 64  # dominance-rule sets kept per prepared catalog (``MixedFamily.rules``)


class MixedFamily:
    """The mixed candidates of one selection, with the caches its shapes share."""

    def __init__(self, sel: Selection):
        self.sel = sel
        self.prompt_ok = ~sel.prompts.needs_scores  # scored prompts run only scored prefill
        self._picks: dict[tuple[int, bytes], int | None] = {}
        self._decoder_work: dict[MixedShape, DecoderWork] = {}
        self._allowed_rows: dict[Rule, np.ndarray] = {}
        self._rule_picks: dict[Rule, int | None] = {}  # per rule, read through _picks
        self._rules: dict[int, Rule | None] | None = None

    def candidates(self) -> list[ScoredCandidate]:
        decoders, prompts = self.sel.decoders, self.sel.prompts
        found = []
        for g in self.sel.prepared.mixed:
            table = decoders.table(g.token_capacity, g.proposal_depth)
            if decoders.count and id(g) in self.sel.prepared.mixed_decode_only:
                found.append(self._decode_only_candidate(g, table))
            if not prompts.count:
                continue
            candidate = self._prompt_row_candidate(g, table)
            if candidate is not None:
                found.append(candidate)
        return found

    def _decode_only_candidate(self, g: GraphDescriptor, table: LaneTable) -> ScoredCandidate:
        sel = self.sel
        m = min(g.batch_capacity, sel.decoders.count)
        signature = (g.kind, -1, 0, g.proposal_depth, table.work_key, m)
        return sel.score(
            g,
            float(table.prefix_values[m]),
            m * sel.decoders.age_value_per_ms,
            signature,
            sel.decoder_lanes(table.order[:m], table.widths, g, False),
        )

    def _prompt_row_candidate(self, g: GraphDescriptor, table: LaneTable) -> ScoredCandidate | None:
        """The best prompt row with the m = min(B - 1, decoders) highest-value decoders."""
        sel, decoders, prompts = self.sel, self.sel.decoders, self.sel.prompts
        cap = g.prefill_capacity
        m = min(g.batch_capacity - 1, decoders.count)
        rule = self.rules()[id(g)]
        if rule is None:
            return None
        if sel.costs.is_known(g.key):
            i = self._pick(rule)
        else:
            smaller_capacities = [h.prefill_capacity for h in sel.prepared.smaller_mixed[g]]
            allowed = self._allowed(rule) & ~prompts.excluded_from_exploration(
                smaller_capacities, prompts.work(cap)
            )
            pick_key = (cap, allowed.tobytes())
            if pick_key not in self._picks:
                self._picks[pick_key] = prompts.pick(allowed, cap)
            i = self._picks[pick_key]
        if i is None:
            return None

        def lanes() -> list[Lane]:
            until_ms = sel.duration(g) or 0.0
            return [prompts.lane(i, cap)] + decoders.lanes(table.order[:m], table.widths, until_ms)

        value = float(prompts.values(cap)[i] + table.prefix_values[m])
        return sel.score(g, value, m * decoders.age_value_per_ms, None, lanes)

    def rules(self) -> dict[int, Rule | None]:
        """Every mixed shape's :meth:`_dominance_rule`, by ``id``. A rule reads only the number
        of decoders and their lane widths at each (W, D), so the rules are kept across decisions
        under that key (on the prepared programs; at most ``RULE_MEMO`` keys)."""
        if self._rules is None:
            prepared, decoders = self.sel.prepared, self.sel.decoders
            widths = tuple(decoders.table(w, d).work_key for w, d in prepared.mixed_table_shapes)
            key = (decoders.count, widths)
            hit = prepared.mixed_rules.get(key)
            if hit is None:
                if len(prepared.mixed_rules) >= RULE_MEMO:
                    prepared.mixed_rules.clear()
                hit = prepared.mixed_rules[key] = {id(g): self._dominance_rule(g) for g in prepared.mixed}
            self._rules = hit
        return self._rules

    def _decoder_work_of(self, batch: int, width: int, depth: int) -> DecoderWork:
        """The decoder work beside a prompt row in a (B, W, D) shape: lanes and widths (0: none)."""
        key = (batch, width, depth)
        hit = self._decoder_work.get(key)
        if hit is None:
            m = min(batch - 1, self.sel.decoders.count)
            hit = 0 if m == 0 else (m, depth, self.sel.decoders.table(width, depth).work_key)
            self._decoder_work[key] = hit
        return hit

    def _dominance_rule(self, g: GraphDescriptor) -> Rule | None:
        """Which prompt rows of mixed shape g no smaller shape serves with the same work, as
        (g's prompt capacity, the largest smaller capacity that serves the same decoder work, or
        None); None when an equal capacity does (every row dominated).

        A smaller shape h carries the same candidate when it serves the same decoder lanes at the
        same widths and consumes the same prompt tokens. Prompt work grows with capacity, so
        equality with the largest smaller capacity decides.
        """
        mine = self._decoder_work_of(g.batch_capacity, g.token_capacity, g.proposal_depth)
        largest = None
        for shape, capacity in self.sel.prepared.mixed_dominator_classes[g]:
            if self._decoder_work_of(*shape) != mine:
                continue
            if capacity == g.prefill_capacity:
                return None
            largest = capacity if largest is None else max(largest, capacity)
        return g.prefill_capacity, largest

    def _allowed(self, rule: Rule) -> np.ndarray:
        """The undominated prompt rows under `rule` (``_dominance_rule``): unscored prompts with
        work at g's capacity that differs from the largest same-work smaller capacity's."""
        hit = self._allowed_rows.get(rule)
        if hit is None:
            prompts = self.sel.prompts
            cap, largest = rule
            work = prompts.work(cap)
            hit = self.prompt_ok & (work > 0)
            if largest is not None:
                hit &= prompts.work(largest) != work
            self._allowed_rows[rule] = hit
        return hit

    def _pick(self, rule: Rule) -> int | None:
        """The best undominated prompt row under `rule`: shapes sharing a rule share it, and so
        do rules that allow the same rows at the same capacity."""
        hit = self._rule_picks.get(rule, _NOT_PICKED)
        if hit is _NOT_PICKED:
            allowed = self._allowed(rule)
            pick_key = (rule[0], allowed.tobytes())
            if pick_key not in self._picks:
                self._picks[pick_key] = self.sel.prompts.pick(allowed, rule[0])
            hit = self._rule_picks[rule] = self._picks[pick_key]
        return hit


def mixed_upper_rates(sel: Selection) -> tuple[np.ndarray, np.ndarray] | None:
    """Upper bounds on the scores of every mixed program's candidates, in ``prepared.mixed``
    order, and each bound's magnitude (|value| / T + T / 2 * waiting, for the caller's rounding
    margin); None when a mixed program's duration is unmeasured (its rows are indeterminate).

    A shape's prompt-row candidate earns one prompt row's value at its prompt capacity (at most
    the largest there, allowed or not) and its decoders' value, which is exactly the m best
    lanes of the (W, D) lane table (m = min(B - 1, decoders)); its decode-only candidate the
    min(B, decoders) best. Every shape in one array pass."""
    prepared, decoders, prompts = sel.prepared, sel.decoders, sel.prompts
    t = prepared.mixed_durations(sel.costs)
    if t is None:
        return None
    n, per_ms = decoders.count, decoders.age_value_per_ms
    batch = prepared.mixed_batch
    m_row, m_all = np.minimum(batch - 1, n), np.minimum(batch, n)
    if n:
        tables = np.array([decoders.table(w, d).prefix_values for w, d in prepared.mixed_table_shapes])
        rows = prepared.mixed_table_index
        with_prompt, decode_only = tables[rows, m_row], tables[rows, m_all] + m_all * per_ms * t
    else:
        with_prompt, decode_only = np.zeros(len(batch)), np.full(len(batch), -np.inf)
    if prompts.count:
        best = np.array([prompts.values(c).max() for c in prepared.mixed_capacities])
        value = np.maximum(
            best[prepared.mixed_capacity_index] + with_prompt + m_row * per_ms * t, decode_only
        )
    else:
        value = decode_only
    waiting = sel.decision.waiting
    return value / t - 0.5 * t * waiting, np.abs(value) / t + 0.5 * t * abs(waiting)


def mixed_candidates(sel: Selection) -> list[ScoredCandidate]:
    """Every mixed program's decode-only and prompt-row candidates."""
    if not sel.prepared.mixed:  # (a probe's drafted programs)
        return []
    return MixedFamily(sel).candidates()
