"""vLLM's ``truncate_prompt_tokens``: keep only the last k tokens of a prompt.

A client that sends more context than it wants served (a long chat history, a document) asks the
server to cut the prompt from the left after tokenizing, as vLLM does: ``k >= 1`` keeps the last
k tokens, ``-1`` keeps the last ``max_model_len`` (the most the model can hold), ``null`` keeps
everything. A k above ``max_model_len`` is a 400, as in vLLM. Chat requests are cut after the
template renders the conversation; the message endpoints the scheduler's checkpoints use move
with the cut, and an endpoint inside the cut part is dropped (its prefix no longer exists).
The output budget is checked on the kept prompt (``openai_protocol._fit_context``).
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


def truncate(tokens: Sequence[int], keep: int | None) -> tuple[int, ...]:
    """The last `keep` tokens (all when keep is None or the prompt is shorter)."""
    tokens = tuple(tokens)
    return tokens if keep is None or len(tokens) <= keep else tokens[len(tokens) - keep :]


def shift_endpoints(endpoints: Sequence[int], removed: int) -> tuple[int, ...]:
    """Message endpoints (token counts from the prompt's start) after `removed` leading tokens
    were cut: each moves left by `removed`; those at or before the cut are dropped."""
    return tuple(e - removed for e in endpoints if e - removed > 0)
