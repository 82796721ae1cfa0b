"""Preemption under slot or page pressure, and the continuation of a preempted request.

The trigger (``Scheduler.preemption_candidate``): the head of the admission queue has waited at
least ``delay_ms`` and is refused for lack of a request slot or KV pages, and retiring one active
decoding request would make it fit; the scheduler picks the best-served one. One preemption is
outstanding at a time: the next waits until the last victim's resources have returned, so one
waiting request never retires several.

The victim's response is not completed (spec: preemption retires a resident execution request
without completing it). Its state is captured first when a snapshot row is obtainable (a terminal
capture of prompt + output[:-1]); it then continues as a new admission of its prompt plus every
token it produced, with ``max_tokens`` reduced by those, queued behind the requests already
waiting. That continuation restores the capture (only the last output token is prefilled), or,
where no capture was taken, recomputes the whole prefix. Its stream, text state and token counts
carry on: the client sees one uninterrupted response.
"""

from __future__ import annotations

import dataclasses

from helios_jax.runtime.api import GenerationRequest
from helios_jax.scheduler.view import Phase

DEFAULT_DELAY_MS = 500.0


def continuation(request: GenerationRequest, output: list[int]) -> GenerationRequest | None:
    """The admission that resumes `request` after `output` (None: nothing is left to generate).

    Prompt scores were delivered with the first event, so the continuation asks for none."""
    left = request.sampling.max_tokens - len(output)
    if left < 1:
        return None
    # min_tokens counts the outputs already produced (the continuation's own count restarts).
    min_tokens = max(0, request.sampling.min_tokens - len(output))
    sampling = dataclasses.replace(
        request.sampling, max_tokens=left, prompt_logprobs=False, min_tokens=min_tokens
    )
    prompt = tuple(request.prompt_tokens) + tuple(output)
    # The presence and frequency penalties count the earlier outputs (`prior_outputs`).
    return dataclasses.replace(request, prompt_tokens=prompt, sampling=sampling, prior_outputs=len(output))


class Preemptions:
    """Decides preemptions for one engine's scheduler (the loop thread's only)."""

    def __init__(self, scheduler, delay_ms: float = DEFAULT_DELAY_MS):
        self.scheduler = scheduler
        self.delay_ms = delay_ms
        self.outstanding: int | None = None  # the last victim's request id, until it is released

    def consider(self, request: GenerationRequest, waited_ms: float):
        """Preempt for the waiting `request` when the trigger holds; returns the victim's handle
        and whether its state is being captured (a continuation then waits for the capture)."""
        if self.outstanding is not None and self.outstanding in self.scheduler.requests:
            return None, False
        self.outstanding = None
        if waited_ms < self.delay_ms:
            return None, False
        s = request.sampling
        victim = self.scheduler.preemption_candidate(len(request.prompt_tokens), s.max_tokens)
        if victim is None:
            return None, False
        self.scheduler.preempt(victim)
        self.outstanding = victim.rid
        resident = self.scheduler.requests.get(victim.rid)
        capturing = resident is not None and resident.phase is Phase.TERMINAL
        return victim, capturing
