"""A request's logits processors in the programs' host form (`programs.processor_packing`).

The engine builds one `ProcessorSettings` per admitted request from its `SamplingParams`: the
penalties, logit_bias, min_p, allowed_token_ids and single-token bad words as given; min_tokens
with the request's stop ids (`api.request_stop_ids`: EOS unless ignore_eos, plus
stop_token_ids), which the programs ban until that many outputs exist (vLLM's min_tokens; stop
strings are matched on the host and are not banned); and the prompt, which the repetition
penalty counts as seen. A preemption continuation's earlier outputs (the last
`prior_outputs` prompt tokens) are also loaded as output counts for the presence and frequency
penalties, so its text is that of the uninterrupted request. A request with no processor gets
None: its rows run today's sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

from helios_jax.programs.processor_packing import ProcessorSettings
from helios_jax.programs.processors import BIAS_CAPACITY
from helios_jax.runtime.api import MAX_LOGIT_BIAS, GenerationRequest

assert MAX_LOGIT_BIAS == BIAS_CAPACITY, "the request limit must equal the programs' capacity"


def processor_settings(request: GenerationRequest, stop_ids: Sequence[int]) -> ProcessorSettings | None:
    """The programs' settings for a request (None: no processor changes its sampling)."""
    sampling, prompt = request.sampling, tuple(request.prompt_tokens)
    penalised = sampling.presence_penalty or sampling.frequency_penalty
    earlier = prompt[len(prompt) - request.prior_outputs :] if penalised and request.prior_outputs else ()
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
        prompt=prompt if sampling.repetition_penalty != 1.0 else (),
        outputs=earlier,
    )
    return settings if settings.enabled else None
