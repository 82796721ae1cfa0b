"""A request's logits processors in the programs' host form (`programs.processor_packing`).

The engine builds one `ProcessorSettings` per admitted request from its `SamplingParams`: the
penalties, logit_bias, min_p, allowed_token_ids and single-token bad words as given; min_tokens
with the request's stop ids (`api.request_stop_ids`: EOS unless ignore_eos, plus
stop_token_ids), which the programs ban until that many outputs exist (vLLM's min_tokens; stop
strings are matched on the host and are not banned); and the prompt, which the repetition
penalty counts as seen. A request with no processor gets None: its rows run today's sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

from helios_jax.programs.processor_packing import ProcessorSettings
from helios_jax.programs.processors import BIAS_CAPACITY
from helios_jax.runtime.api import MAX_LOGIT_BIAS, SamplingParams

assert MAX_LOGIT_BIAS == BIAS_CAPACITY, "the request limit must equal the programs' capacity"


def processor_settings(
    sampling: SamplingParams, stop_ids: Sequence[int], prompt: Sequence[int]
) -> ProcessorSettings | None:
    """The programs' settings for a request (None: no processor changes its sampling)."""
    settings = ProcessorSettings(
        presence_penalty=float(sampling.presence_penalty),
        frequency_penalty=float(sampling.frequency_penalty),
        repetition_penalty=float(sampling.repetition_penalty),
        min_p=float(sampling.min_p),
        min_tokens=sampling.min_tokens,
        logit_bias=tuple((int(t), float(b)) for t, b in sampling.logit_bias),
        allowed_token_ids=sampling.allowed_token_ids,
        banned_token_ids=sampling.bad_token_ids,
        stop_token_ids=tuple(stop_ids),
        prompt=tuple(prompt) if sampling.repetition_penalty != 1.0 else (),
    )
    return settings if settings.enabled else None
