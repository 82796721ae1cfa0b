"""Host packing of a request's logits processors (`processors.py`) for `initialize` and copies.

`ProcessorSettings` is the plain host form of one request's controls; `pack_processors` turns a
lane list of them (None: no processors) into the `ProcessorInputs` arrays, validating every id
against the vocabulary (a ValueError naming the lane and the field). A preemption continuation's
earlier outputs (`outputs`) load as its row's output counts, so the presence and frequency
penalties go on counting them; past COUNT_CAPACITY distinct tokens the most frequent load.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from helios_jax.programs.processors import (
    BIAS_CAPACITY,
    COUNT_CAPACITY,
    ProcessorInputs,
    blank_processor_inputs,
)
from helios_jax.programs.token_mask import words_of


@dataclasses.dataclass(frozen=True)
class ProcessorSettings:
    """One request's logits processors (vLLM's semantics; neutral defaults)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    allowed_token_ids: tuple[int, ...] | None = None  # None: every token
    banned_token_ids: tuple[int, ...] = ()  # single-token bad words
    stop_token_ids: tuple[int, ...] = ()  # banned while fewer than min_tokens outputs exist
    prompt: tuple[int, ...] = ()  # the tokens the repetition penalty sees before any output
    outputs: tuple[int, ...] = ()  # earlier outputs (a continuation) the penalties count

    @property
    def enabled(self) -> bool:
        """Whether any processor changes a logit (min_p counts: it filters the distribution)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.min_p > 0
            or (self.min_tokens > 0 and self.stop_token_ids)
            or any(bias for _, bias in self.logit_bias)
            or self.allowed_token_ids is not None
            or self.banned_token_ids
        )


def check_processors(settings: ProcessorSettings, vocab: int) -> None:
    """ValueError naming the field for values or ids a program cannot take."""
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
        if not math.isfinite(getattr(settings, name)):
            raise ValueError(f"{name} must be finite, got {getattr(settings, name)}")
    if settings.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {settings.repetition_penalty}")
    if not 0 <= settings.min_p <= 1:
        raise ValueError(f"min_p must lie in [0, 1], got {settings.min_p}")
    if settings.min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0, got {settings.min_tokens}")
    if len(settings.logit_bias) > BIAS_CAPACITY:
        raise ValueError(f"logit_bias: at most {BIAS_CAPACITY} entries, got {len(settings.logit_bias)}")
    if not all(math.isfinite(bias) for _, bias in settings.logit_bias):
        raise ValueError("logit_bias values must be finite")
    if settings.allowed_token_ids is not None and not set(settings.allowed_token_ids) - set(
        settings.banned_token_ids
    ):
        raise ValueError("allowed_token_ids must allow a token that is not a bad word")
    listed = ("allowed_token_ids", "banned_token_ids", "stop_token_ids", "prompt", "outputs")
    for name in ("logit_bias", *listed):
        value = getattr(settings, name) or ()
        ids = [t for t, _ in value] if name == "logit_bias" else list(value)
        bad = next((t for t in ids if not 0 <= int(t) < vocab), None)
        if bad is not None:
            raise ValueError(f"{name}: token id {bad} outside the vocabulary 0..{vocab - 1}")


def pack_processors(
    lanes: int, vocab: int, settings: Sequence[ProcessorSettings | None] | None
) -> ProcessorInputs:
    """The `ProcessorInputs` of `lanes` lanes from the first len(settings) lanes' settings."""
    out = blank_processor_inputs(lanes, vocab)
    for i, each in enumerate(settings or ()):
        if each is None or not each.enabled:
            continue
        try:
            check_processors(each, vocab)
        except ValueError as error:
            raise ValueError(f"lane {i}: {error}") from None
        _fill(out, i, each, vocab)
    return out


def _fill(out: ProcessorInputs, i: int, s: ProcessorSettings, vocab: int) -> None:
    out.enabled[i] = True
    out.presence[i], out.frequency[i] = s.presence_penalty, s.frequency_penalty
    out.repetition[i], out.min_p[i], out.min_tokens[i] = s.repetition_penalty, s.min_p, s.min_tokens
    for j, (token, bias) in enumerate(s.logit_bias):
        out.bias_tokens[i, j], out.bias_values[i, j] = int(token), float(bias)
    allowed = range(vocab) if s.allowed_token_ids is None else s.allowed_token_ids
    out.allowed[i] = words_of(set(allowed) - set(s.banned_token_ids), vocab)
    out.stops[i] = words_of(s.stop_token_ids, vocab)
    if s.repetition_penalty != 1.0:  # the prompt matters to the repetition penalty alone
        out.seen[i] = words_of(set(s.prompt), vocab)
    if s.presence_penalty or s.frequency_penalty:  # the only processors output counts change
        for j, (token, count) in enumerate(collections.Counter(s.outputs).most_common(COUNT_CAPACITY)):
            out.count_tokens[i, j], out.count_values[i, j] = int(token), count
