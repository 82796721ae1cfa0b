"""Host side of log-probabilities (`runtime/logprobs.py`), on hand-made program outputs.

A 5-token prompt scored in chunks of 3 and 2 tokens: position 0 has no score (NaN from the
program), positions 1..4 score -1..-4, and position i's alternatives are ids (10 i, 10 i + 1)
at (-0.5 i, -0.5 i - 1), with a third column that top = 2 leaves out.
"""

import dataclasses

import numpy as np
import pytest

from helios_jax.runtime.logprobs import LaneLogprobs, PromptScores


@dataclasses.dataclass
class _Chunk:
    prompt_logprobs: np.ndarray
    prompt_top_logprobs: np.ndarray
    prompt_top_tokens: np.ndarray


def _chunk(positions, capacity=4) -> _Chunk:
    values = np.full((capacity,), np.nan, np.float32)
    top = np.full((capacity, 3), np.nan, np.float32)
    ids = np.zeros((capacity, 3), np.int32)
    for j, i in enumerate(positions):
        if i > 0:
            values[j] = -i
            top[j] = [-0.5 * i, -0.5 * i - 1, -0.5 * i - 2]
            ids[j] = [10 * i, 10 * i + 1, 10 * i + 2]
    return _Chunk(values, top, ids)


def test_prompt_scores_are_collected_by_position_and_sent_once():
    scores = PromptScores(5, top=2)
    scores.collect(3, 2, _chunk([3, 4]))  # chunks may complete in any order of positions
    scores.collect(0, 3, _chunk([0, 1, 2]))
    fields = scores.first_event_fields()
    assert fields["prompt_logprobs"] == (None, -1.0, -2.0, -3.0, -4.0)
    assert fields["prompt_top_logprobs"] == (None,) + tuple(
        ((10 * i, -0.5 * i), (10 * i + 1, -0.5 * i - 1)) for i in range(1, 5)
    )
    assert scores.first_event_fields() == {}


def test_prompt_scores_without_alternatives_send_values_only():
    scores = PromptScores(3)
    scores.collect(0, 3, _chunk([0, 1, 2]))
    assert scores.first_event_fields() == dict(prompt_logprobs=(None, -1.0, -2.0))


def test_unscored_tokens_are_an_error_not_nan():
    lane = LaneLogprobs(np.array([-1.0, np.nan], np.float32), np.zeros((2, 1)), np.zeros((2, 1), np.int32))
    assert lane.event_fields(1, 0) == dict(token_logprobs=(-1.0,))
    with pytest.raises(ValueError, match="unscored"):
        lane.event_fields(2, 0)
