"""Logits processors through the prepared programs, against a plain step-by-step oracle.

The oracle is a numpy loop over the cache-free full forward: at each step the last position's
logits go through `reference.sampling.processed_logits_naive` with the outputs so far, and the
argmax is the next token (greedy rows apply processors before the argmax). Slot 0 carries every
penalty, a logit bias, a single-token bad word and min_tokens with a stop token; slot 2 beside
it has none and must follow plain greedy decoding. Prefill's first output, single-step decode,
K-step decode, speculative rounds (fixed query lengths and adaptive device allocation) and mixed
rounds must all give the oracle's tokens: speculative output equals non-speculative output with
penalties on because verification row j counts proposals 0..j-1 as output. The speculative and
mixed rounds verify the oracle's own next tokens as copy proposals, so every one of a lane's four
rows decides an emitted token (all four are accepted only if each row's processed argmax is the
oracle's). Compared over the prefix whose processed top-2 margin exceeds MARGIN_TOL.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.programs.processor_packing import ProcessorSettings
from reference.sampling import processed_logits_naive

from .helpers import (
    DECODE,
    DECODE_K,
    MAX_LEN,
    MIXED_W4,
    MODEL,
    MULTISTEP_K,
    RAGGED_DEVICE,
    RECT,
    Driver,
    _full_logits,
    emitted,
    greedy_reference,
    reliable_prefix,
)

PROMPTS = {0: [5, 9, 17, 3, 3, 41, 7, 5, 9], 2: [11, 2, 60, 9, 1, 33, 8, 19]}
N = 14


def _settings(plain_first: int) -> ProcessorSettings:
    return ProcessorSettings(
        presence_penalty=0.8,
        frequency_penalty=0.6,
        repetition_penalty=1.7,
        logit_bias=((7, 1.5), (40, -3.0)),
        banned_token_ids=(41,),
        min_tokens=3,
        stop_token_ids=(plain_first,),  # greedy's own first token, banned for three outputs
        prompt=tuple(PROMPTS[0]),
    )


def _oracle(params, settings: ProcessorSettings, steps: int):
    prompt, outputs, margins = PROMPTS[0], [], []
    for _ in range(steps):
        context = list(prompt) + outputs
        padded = np.zeros((MAX_LEN,), np.int32)
        padded[: len(context)] = context
        logits = np.asarray(_full_logits(MODEL, params, jnp.asarray(padded)))[len(context) - 1]
        processed = processed_logits_naive(
            logits,
            outputs=outputs,
            prompt=prompt,
            presence=settings.presence_penalty,
            frequency=settings.frequency_penalty,
            repetition=settings.repetition_penalty,
            logit_bias=dict(settings.logit_bias),
            banned=settings.banned_token_ids,
            stops=settings.stop_token_ids,
            min_tokens=settings.min_tokens,
        )
        top2 = np.sort(processed)[-2:]
        margins.append(float(top2[1] - top2[0]))
        outputs.append(int(np.argmax(processed)))
    return outputs, margins


@pytest.fixture(scope="module")
def expected(params):
    plain0, _ = greedy_reference(params, PROMPTS[0], N)
    settings = _settings(plain0[0])
    want, margins = _oracle(params, settings, N)
    n = reliable_prefix(margins)
    assert n >= 10 and want[:n] != plain0[:n]  # the processors change this continuation
    plain2, margins2 = greedy_reference(params, PROMPTS[2], N)
    return settings, {0: want[:n], 2: plain2[: reliable_prefix(margins2)]}


ROUNDS = {
    "decode": ("ordinary", DECODE, {}),
    "k_step_decode": ("multistep", DECODE_K, {}),
    "speculative_fixed": ("spec", RECT, dict(query_lengths=[4, 4])),
    "speculative_adaptive": ("spec", RAGGED_DEVICE, dict(ceilings=[4, 4])),
    "mixed": ("spec", MIXED_W4, dict(query_lengths=[4, 4])),
}


def _copies(kind, streams, want):
    """Speculative and mixed rounds verify copy proposals: slot 0's next three oracle tokens
    (every row of a round then decides a token), slot 2 learned proposals."""
    if ROUNDS[kind][0] != "spec":
        return {}
    ahead = want[0][len(streams[0]) : len(streams[0]) + 3]
    return dict(copy_proposals=[ahead if len(ahead) == 3 else None, None])


@pytest.mark.parametrize("kind", sorted(ROUNDS))
def test_greedy_output_with_processors_equals_the_step_by_step_oracle(
    ordinary_programs, spec_programs, multistep_programs, params, expected, kind
):
    settings, want = expected
    family, graph, lengths = ROUNDS[kind]
    programs = {"ordinary": ordinary_programs, "spec": spec_programs, "multistep": multistep_programs}[family]
    d = Driver(programs, params, seed=5)
    streams = {}
    for slot, prompt in PROMPTS.items():
        d.initialize(slot, processors=settings if slot == 0 else None)
        streams[slot] = [d.prefill(slot, prompt)[0]]  # the prefill program's first output
    slots = sorted(PROMPTS)
    accepted = 0
    while min(len(s) for s in streams.values()) < N:
        out = d.run(
            graph, slots=slots, page_tables=d.tables(slots), **lengths, **_copies(kind, streams, want)
        )
        accepted = max(accepted, int(out.counts[0]))
        for lane, slot in enumerate(slots):
            streams[slot].extend(emitted(out, lane))
    for slot in slots:
        assert streams[slot][: len(want[slot])] == want[slot], slot
    # Whole rounds emitted (the adaptive program's device allocation may grant fewer rows).
    assert (
        accepted
        >= {"ordinary": 1, "multistep": MULTISTEP_K, "spec": 4 if kind != "speculative_adaptive" else 2}[
            family
        ]
    )
    counts = np.asarray(d.state.processors.counts)
    assert counts[0].sum() == int(d.state.generated[0]) and not counts[2].any()  # only slot 0 counts


@pytest.fixture(scope="module")
def uninterrupted(params, expected):
    """The oracle's tokens with presence and frequency penalties alone among the penalties (the
    repetition penalty would already keep the earlier outputs from repeating)."""
    settings = dataclasses.replace(expected[0], repetition_penalty=1.0)
    want, margins = _oracle(params, settings, N)
    return settings, want[: reliable_prefix(margins)]


def test_a_continuation_loaded_with_its_earlier_outputs_samples_the_uninterrupted_tokens(
    ordinary_programs, params, uninterrupted
):
    """A preemption continuation's row (prompt plus the first K outputs, min_tokens lowered, the
    outputs loaded as its counts) goes on with the uninterrupted row's tokens; with counts
    restarting from zero the presence and frequency penalties would change them."""
    settings, want = uninterrupted
    k = 5
    assert len(want) >= k + 5
    resumed = dataclasses.replace(
        settings,
        min_tokens=max(0, settings.min_tokens - k),
        prompt=tuple(PROMPTS[0]) + tuple(want[:k]),
        outputs=tuple(want[:k]),
    )
    d = Driver(ordinary_programs, params, seed=5)
    d.initialize(1, processors=resumed)
    stream = [d.prefill(1, list(resumed.prompt))[0]]
    while len(stream) < len(want) - k:
        stream.extend(emitted(d.run(DECODE, slots=[1], page_tables=d.tables([1])), 0))
    assert stream == want[k:]
