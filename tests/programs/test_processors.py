"""Logits processors (`programs/processors.py`, min_p in `sampling.py`) against the numpy oracle.

Each processor alone, then all together, on random logits: B = 3 lanes of W = 3 verification rows,
rows loaded through the host packing (`pack_processors`) and the device load (`loaded_rows`),
output counts built by `count_outputs` from earlier outputs, and row j of a lane following
proposals 0..j-1. The sampling distribution (temperature 0.8, then min_p, top-k, top-p) equals
`reference.sampling` (processed_logits_naive, then sampling_probs_naive, with the row's outputs
= earlier outputs + the proposals before it) within 1e-6; greedy rows take the processed argmax.
Lane 2 has no processors: its distribution is the plain one. With no enabled live lane the
processors' `lax.cond` skips every gather and the logits come back untouched.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.programs.processor_packing import ProcessorSettings, pack_processors
from helios_jax.programs.processors import (
    apply_processors,
    count_outputs,
    init_processors,
    loaded_rows,
    write_rows,
)
from helios_jax.programs.sampling import sampling_probs
from reference.sampling import processed_logits_naive, sampling_probs_naive

B, W, V, R = 3, 3, 70, 5
SLOTS = np.array([3, 0, 1], np.int32)
PROMPTS = ([5, 6, 7, 7, 40], [1, 2, 3])
EARLIER = ([5, 9, 9, 33, 64], [2, 2, 8])  # outputs each processed lane generated before
CASES = {
    "presence": dict(presence_penalty=1.3),
    "frequency": dict(frequency_penalty=0.7),
    "negative_penalties": dict(presence_penalty=-0.5, frequency_penalty=-0.4),
    "repetition": dict(repetition_penalty=1.8),
    "logit_bias": dict(logit_bias=((4, 5.0), (9, -100.0), (69, 2.5))),
    "min_p": dict(min_p=0.2),
    "allowed_token_ids": dict(allowed_token_ids=(1, 5, 9, 33, 60, 64, 65)),
    "bad_words": dict(banned_token_ids=(0, 3, 9, 33)),
    "min_tokens": dict(min_tokens=6, stop_token_ids=(11, 12, 13)),
    "all": dict(
        presence_penalty=0.4,
        frequency_penalty=0.3,
        repetition_penalty=1.3,
        logit_bias=((5, 1.0), (11, 3.0)),
        min_p=0.05,
        banned_token_ids=(2,),
        min_tokens=7,
        stop_token_ids=(11,),
    ),
}
SAMPLING = dict(temperature=0.8, top_k=(0, 20, 0), top_p=(1.0, 1.0, 0.9))


@jax.jit
def _distributions(logits, state, generated, proposals, temperature, top_k, top_p):
    live = jnp.ones((B,), bool)
    processed = apply_processors(logits, state, jnp.asarray(SLOTS), live, generated, proposals)
    min_p = jnp.where(state.enabled[SLOTS], state.min_p[SLOTS], 0.0)
    per_row = [jnp.broadcast_to(jnp.asarray(x)[:, None], (B, W)) for x in (temperature, top_k, top_p, min_p)]
    return processed, sampling_probs(processed, *per_row)


def _state(settings: dict):
    lanes = [ProcessorSettings(prompt=tuple(PROMPTS[i]), **settings) for i in range(2)] + [None]
    rows = loaded_rows(jax.tree_util.tree_map(jnp.asarray, pack_processors(B, V, lanes)), V)
    state = write_rows(init_processors(R, V), jnp.asarray(SLOTS), rows)
    width = max(len(e) for e in EARLIER)
    tokens = np.zeros((B, width), np.int32)
    counts = np.zeros((B,), np.int32)
    for i, earlier in enumerate(EARLIER):
        tokens[i, : len(earlier)], counts[i] = earlier, len(earlier)
    state = count_outputs(
        state, jnp.asarray(SLOTS), jnp.ones((B,), bool), jnp.asarray(tokens), jnp.asarray(counts)
    )
    return state, counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_processed_distribution_equals_the_naive_oracle(case):
    rng = np.random.default_rng(sorted(CASES).index(case))
    logits = rng.normal(scale=3.0, size=(B, W, V)).astype(np.float32)
    proposals = rng.integers(0, V, (B, W - 1)).astype(np.int32)
    proposals[0, 0] = EARLIER[0][1]  # a proposal repeating an earlier output counts twice
    state, generated = _state(CASES[case])
    temperature = np.full((B,), SAMPLING["temperature"], np.float32)
    top_k, top_p = np.asarray(SAMPLING["top_k"], np.int32), np.asarray(SAMPLING["top_p"], np.float32)
    processed, probs = jax.device_get(
        _distributions(logits, state, generated, proposals, temperature, top_k, top_p)
    )
    settings = CASES[case]
    naive_args = dict(
        presence=settings.get("presence_penalty", 0.0),
        frequency=settings.get("frequency_penalty", 0.0),
        repetition=settings.get("repetition_penalty", 1.0),
        logit_bias=dict(settings.get("logit_bias", ())),
        allowed=settings.get("allowed_token_ids"),
        banned=settings.get("banned_token_ids", ()),
        stops=settings.get("stop_token_ids", ()),
        min_tokens=settings.get("min_tokens", 0),
    )
    for b in range(B):
        for j in range(W):
            if b < 2:
                outputs = list(EARLIER[b]) + list(proposals[b, :j])
                want = processed_logits_naive(logits[b, j], outputs=outputs, prompt=PROMPTS[b], **naive_args)
                min_p = settings.get("min_p", 0.0)
            else:
                want, min_p = logits[b, j].astype(np.float64), 0.0
            np.testing.assert_allclose(np.asarray(processed[b, j]), want, rtol=1e-6, atol=1e-5)
            dist = sampling_probs_naive(want, SAMPLING["temperature"], int(top_k[b]), float(top_p[b]), min_p)
            np.testing.assert_allclose(np.asarray(probs[b, j]), dist, atol=1e-6)
            assert int(np.argmax(np.asarray(processed[b, j]))) == int(np.argmax(want))  # greedy rows


def test_no_enabled_live_lane_leaves_the_logits_untouched():
    state, generated = _state(CASES["all"])
    logits = jnp.asarray(np.random.default_rng(9).normal(size=(B, W, V)).astype(np.float32))
    proposals = jnp.zeros((B, W - 1), jnp.int32)
    live = jnp.asarray([False, False, True])  # only the lane without processors
    out = apply_processors(logits, state, jnp.asarray(SLOTS), live, generated, proposals)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(logits))
    jaxpr = jax.make_jaxpr(apply_processors)(logits, state, jnp.asarray(SLOTS), live, generated, proposals)
    (cond,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    skip = cond.params["branches"][0].jaxpr
    assert not skip.eqns  # the skipping branch does nothing at all
