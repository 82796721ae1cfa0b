"""The choices of one HTTP request: one engine request each, rendered as one answer.

A request asks for ``n`` choices per prompt (``/v1/completions`` also takes a list of prompts):
each choice is its own engine request sharing its prompt, with its own :class:`GenerationRun`
(choice ``index`` = prompt * n + sample, as vLLM numbers them). A non-streaming answer lists
every choice in index order (:func:`full_body`); a streaming one interleaves the choices'
chunks, each carrying its index, as their events arrive. Usage sums the choices: every
prompt's tokens once (OpenAI and vLLM count a prompt once however many samples share it), and
every choice's completion tokens. A failed choice fails the whole non-streaming answer; the
server cancels every unfinished choice whenever the answer ends early.
"""

from __future__ import annotations

import dataclasses

from helios_jax.runtime.api import RequestStream, StreamEvent
from helios_jax.serve import openai_responses as responses
from helios_jax.serve.openai_errors import ApiError
from helios_jax.serve.streaming import GenerationRun


@dataclasses.dataclass
class Choice:
    run: GenerationRun
    stream: RequestStream
    prompt_counted: bool = True  # the first sample of its prompt: its prompt tokens count in usage


def usage(choices: list[Choice]) -> dict:
    prompt = sum(c.run.prompt_tokens for c in choices if c.prompt_counted)
    return responses.usage(prompt, sum(c.run.completion_tokens for c in choices))


def full_body(choices: list[Choice], events: list[list[StreamEvent]]) -> dict:
    """The whole answer: the first choice's body with every choice and the summed usage; raises
    the first failed choice's ApiError (every choice is counted as finished first)."""
    bodies, error = [], None
    for choice, choice_events in zip(choices, events, strict=True):
        try:
            bodies.append(choice.run.full_body(choice_events))
        except ApiError as e:
            error = error or e
    if error is not None:
        raise error
    body = bodies[0]
    body["choices"] = [b["choices"][0] for b in bodies]
    body["usage"] = usage(choices)
    return body


def unfinished(choices: list[Choice]) -> list[Choice]:
    return [c for c in choices if not c.stream.finished]
