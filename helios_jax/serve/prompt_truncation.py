"""vLLM's ``truncate_prompt_tokens`` and ``truncation_side``: keep only k tokens of a prompt.

A client that sends more context than it wants served (a long chat history, a document) asks the
server to cut the prompt after tokenizing, as vLLM does: ``k >= 1`` keeps k tokens, ``-1`` keeps
``max_model_len`` (the most the model can hold), ``null`` keeps everything; ``truncation_side``
"left" (the default) cuts from the start and keeps the last k, "right" keeps the first k. A k
above ``max_model_len`` is a 400, as in vLLM. Chat requests are cut after the template renders
the conversation; the message endpoints the scheduler's checkpoints use move with a left cut
(an endpoint inside the cut part is dropped: its prefix no longer exists) and, with a right cut,
those past the kept prompt are dropped. The output budget is checked on the kept prompt
(``openai_protocol._fit_context``).
"""

from __future__ import annotations

from collections.abc import Sequence

from helios_jax.serve.openai_errors import bad_request


def kept_tokens(value: int | None, max_model_len: int) -> int | None:
    """The number of prompt tokens to keep (None: all), or a 400 for a value vLLM refuses."""
    if value is None:
        return None
    if value == -1:
        return max_model_len
    if value < 1:
        raise bad_request(
            f"'truncate_prompt_tokens' must be -1 (the model's context) or at least 1, got {value}",
            param="truncate_prompt_tokens",
        )
    if value > max_model_len:
        raise bad_request(
            f"'truncate_prompt_tokens' ({value}) is greater than the model's context ({max_model_len})",
            param="truncate_prompt_tokens",
        )
    return value


SIDES = ("left", "right")


def side(value: str | None) -> str:
    """vLLM's ``truncation_side``: "left" (the default) or "right"; anything else is a 400."""
    if value is None:
        return "left"
    if value not in SIDES:
        raise bad_request(
            f"'truncation_side' must be 'left' or 'right', got {value!r}", param="truncation_side"
        )
    return value


def truncate(tokens: Sequence[int], keep: int | None, cut: str = "left") -> tuple[int, ...]:
    """`keep` tokens: the last ones for a left cut, the first for a right cut (all when keep is
    None or the prompt is shorter)."""
    tokens = tuple(tokens)
    if keep is None or len(tokens) <= keep:
        return tokens
    return tokens[len(tokens) - keep :] if cut == "left" else tokens[:keep]


def cut_endpoints(endpoints: Sequence[int], before: int, after: int, cut: str) -> tuple[int, ...]:
    """Message endpoints of a prompt of `before` tokens cut to `after` from the `cut` side."""
    if cut == "left":
        return shift_endpoints(endpoints, before - after)
    return tuple(e for e in endpoints if e <= after)


def shift_endpoints(endpoints: Sequence[int], removed: int) -> tuple[int, ...]:
    """Message endpoints (token counts from the prompt's start) after `removed` leading tokens
    were cut: each moves left by `removed`; those at or before the cut are dropped."""
    return tuple(e - removed for e in endpoints if e - removed > 0)
