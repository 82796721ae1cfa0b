"""Generated tokens' log-probabilities, from a program's outputs to a request's stream events.

Every generation program reports, per output token, its log-probability and the TOP_LOGPROBS
most probable alternatives under the raw model distribution (``scores.token_logprobs``;
docs/programs.md, "Log-probabilities"). A lane's values are aligned with its completion
record's tokens; the scheduler publishes a prefix of them (a stop token or the output limit may
cut the rest), so an event takes the first ``len(tokens)`` entries.

A request that asked for prompt scores (echo with logprobs) is prefilled by the scored prefill
program, chunk by chunk; :class:`PromptScores` collects each chunk's values and alternatives by
prompt position and hands them to the request's first event.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from helios_jax.scheduler.plan import ScheduledPlan


@dataclasses.dataclass(frozen=True)
class LaneLogprobs:
    """One lane's scores, row j for its j-th output token of the frame."""

    logprobs: np.ndarray  # f32[W]
    top_logprobs: np.ndarray  # f32[W, N]
    top_tokens: np.ndarray  # i32[W, N]

    def event_fields(self, n: int, top: int) -> dict:
        """StreamEvent fields for the first `n` tokens, with `top` alternatives each."""
        if n > len(self.logprobs):
            raise ValueError(f"{n} tokens published, {len(self.logprobs)} scored")
        if not np.isfinite(self.logprobs[:n]).all():  # NaN: the frame skipped scoring (scores.py)
            raise ValueError("tokens published unscored: the request's row has no logprobs flag")
        values = tuple(float(v) for v in self.logprobs[:n])
        if top <= 0:
            return dict(token_logprobs=values)
        alternatives = tuple(
            tuple((int(t), float(v)) for t, v in zip(self.top_tokens[j, :top], self.top_logprobs[j, :top]))
            for j in range(n)
        )
        return dict(token_logprobs=values, top_logprobs=alternatives)


@dataclasses.dataclass
class PromptScores:
    """A request's prompt scores, filled chunk by chunk: position i's log-probability and its
    `top` most probable alternatives (None until scored; position 0 never is)."""

    length: int
    top: int = 0
    values: list = dataclasses.field(init=False)
    alternatives: list = dataclasses.field(init=False)
    sent: bool = False

    def __post_init__(self):
        self.values = [None] * self.length
        self.alternatives = [None] * self.length

    def collect(self, start: int, count: int, outputs) -> None:
        """Records a scored prefill chunk of `count` tokens at prompt position `start` from its
        outputs (`PrefillOutputs`: prompt_logprobs f32[C], prompt_top_* [C, N])."""
        values = np.asarray(outputs.prompt_logprobs)[:count]
        top_values = top_ids = None
        if self.top > 0 and outputs.prompt_top_logprobs is not None:
            top_values = np.asarray(outputs.prompt_top_logprobs)[:count, : self.top]
            top_ids = np.asarray(outputs.prompt_top_tokens)[:count, : self.top]
        for i, v in enumerate(values):
            pos = start + i
            if not (0 < pos < self.length and np.isfinite(v)):
                continue
            self.values[pos] = float(v)
            if top_values is not None:
                self.alternatives[pos] = tuple(
                    (int(t), float(a)) for t, a in zip(top_ids[i], top_values[i], strict=True)
                )

    def first_event_fields(self) -> dict:
        """StreamEvent fields for the request's first event; nothing after it."""
        if self.sent:
            return {}
        self.sent = True
        fields = dict(prompt_logprobs=tuple(self.values))
        if self.top > 0:
            fields["prompt_top_logprobs"] = tuple(self.alternatives)
        return fields


def lane_logprobs(plan: ScheduledPlan, outputs) -> dict[int, LaneLogprobs]:
    """Request id -> its lane's scores (empty for programs without generated tokens)."""
    if outputs is None or plan.graph.kind.is_state_operation or getattr(outputs, "logprobs", None) is None:
        return {}
    values = np.asarray(outputs.logprobs)
    top = np.asarray(outputs.top_logprobs)
    ids = np.asarray(outputs.top_tokens)
    if plan.graph.kind.is_prefill:  # one lane, one output token: [1] -> [1, 1]
        values, top, ids = values[:, None], top[:, None], ids[:, None]
    return {lane.handle.rid: LaneLogprobs(values[b], top[b], ids[b]) for b, lane in enumerate(plan.lanes)}
