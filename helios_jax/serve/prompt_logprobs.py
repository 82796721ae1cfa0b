"""vLLM's ``prompt_logprobs``: the log-probability of every prompt token, with its alternatives.

``prompt_logprobs: k`` (0..20) asks the engine for its scored prefill (``SamplingParams.
prompt_logprobs``): each prompt token but the first gets its log-probability under the model
given the tokens before it, and the ``k`` most probable alternatives. The answer is vLLM's: a
list with ``null`` for the first token, then per token a dict from token id (a string, as JSON
keys are) to ``{"logprob", "rank", "decoded_token"}`` holding the prompt token and the
alternatives; ``rank`` is the 1-based place among the alternatives, and null for a prompt token
outside them (vLLM computes that rank over the whole vocabulary; the programs return only the
top 20). Completions put the list on each choice, chat on the response, as vLLM does.
Streaming requests are refused (400): vLLM streams them only in its first chunk's choice, a
shape the OpenAI clients do not model. The programs' one top-N serves both the generated and
the prompt tokens, so the engine is asked for the larger of the two counts and each rendering
shows its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from helios_jax.runtime.api import MAX_TOP_LOGPROBS, Tokenizer
from helios_jax.serve.openai_errors import bad_request


def parse(value: int | None, stream: bool) -> int | None:
    if value is None:
        return None
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"'prompt_logprobs' must be from 0 to {MAX_TOP_LOGPROBS}, got {value}", param="prompt_logprobs"
        )
    if stream:
        raise bad_request("prompt_logprobs is not supported with stream", param="prompt_logprobs")
    return value


def sampling_fields(logprobs: bool, top: int, prompt_k: int | None, echo_scores: bool = False) -> dict:
    """SamplingParams' logprob switches for generated logprobs (`logprobs`, `top` alternatives)
    and prompt log-probabilities (`prompt_k` alternatives, or None; `echo_scores`: echo with
    logprobs, which scores the prompt too)."""
    k = max(top, prompt_k or 0)
    return dict(
        prompt_logprobs=echo_scores or prompt_k is not None,
        logprobs=logprobs or k > 0,
        top_logprobs=k,
    )


def render(
    tokenizer: Tokenizer,
    prompt_tokens: Sequence[int],
    values: Sequence[float | None] | None,
    top: Sequence | None,
    k: int,
) -> list:
    """vLLM's ``prompt_logprobs`` list (module docstring) from the engine's first event."""
    values = list(values or [None] * len(prompt_tokens))
    top = list(top or [None] * len(prompt_tokens))
    out: list = []
    for token, value, alternatives in zip(prompt_tokens, values, top, strict=True):
        if value is None:
            out.append(None)
            continue
        alternatives = list(alternatives or ())[:k]
        ranks = {int(t): rank for rank, (t, _) in enumerate(alternatives, 1)}
        entry = {str(token): _entry(tokenizer, token, value, ranks.get(int(token)))}
        for t, v in alternatives:
            entry.setdefault(str(t), _entry(tokenizer, t, v, ranks[int(t)]))
        out.append(entry)
    return out


def _entry(tokenizer: Tokenizer, token: int, value: float, rank: int | None) -> dict:
    return {"logprob": value, "rank": rank, "decoded_token": tokenizer.decode([token])}
