"""Per-row logits processors on the device: vLLM's sampling controls inside the prepared programs.

A row's processors turn the target's raw logits into the logits its sample is drawn from, in
vLLM v1's order (`vllm/v1/sample/sampler.py`, `Sampler.forward`):

  1. allowed_token_ids    every other token -inf      (`allowed` words: all set when unused)
  2. bad words            single-token bad words -inf  (cleared from the same `allowed` words)
  3. min_tokens           while fewer than min_tokens outputs were generated, the request's stop
                          tokens (EOS ids unless ignore_eos, plus stop_token_ids) are -inf
     logit_bias           + the row's dense bias
  4. penalties            repetition (tokens seen in the prompt or the output so far: logit / rp
                          if logit > 0 else logit * rp), then frequency (- f * output count) and
                          presence (- p * [output count > 0])
  5. sampling            (`sampling.sampling_probs`) greedy argmax of the processed logits; else
                          temperature, min_p (keep probability >= min_p * max probability),
                          top-k, top-p

Steps 1-4 are `apply_processors`; min_p joins top-k/top-p in `sampling._truncate`. The reported
log-probabilities stay those of the raw model distribution (`scores.py`), like vLLM's default
`raw_logprobs` mode.

State (`RowProcessors`, one entry per state row; `processors_of_rows` loads it from
`ProcessorInputs` at `initialize`, or at a copy lane that loads settings): the settings above,
`seen` (the prompt's tokens as mask words, loaded from the whole prompt: a prefix restored from
a checkpoint is never prefilled, so marking chunks on the device would miss it) and `counts`
(output-token counts, i32[R, V]; zero at load, or a preemption continuation's earlier outputs,
uploaded as up to COUNT_CAPACITY (token, count) pairs). Every program that commits tokens adds them to
`counts` (`count_outputs`): prefill's first output, decode, each step of K-step decode,
speculative and mixed rounds.

Speculative verification: target row j of a lane scores the token after the pending token and
proposals d_0..d_{j-1}, so its counts and output length include those proposals (the
distribution the target would have after accepting them). Accepting d_j under row j's processed
distribution is then exactly what plain decoding would have sampled there, so speculative output
equals non-speculative output with processors on. The draft's proposals ignore the processors:
acceptance is exact for any draft, only its rate changes.

Zero cost when unused: rows carry an `enabled` flag, and the whole of steps 1-4 is one
`lax.cond` that returns the logits untouched when no live lane's row is enabled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from helios_jax.programs.token_mask import mask_words, unpack_token_mask

BIAS_CAPACITY = 1024  # logit_bias entries a row loads (the state's bias itself is dense)
COUNT_CAPACITY = 1024  # distinct earlier output tokens a continuation's row loads counted


@struct.dataclass
class RowProcessors:
    """Per-row processor state (shapes with R = state rows)."""

    enabled: jax.Array  # bool[R] any processor below is active for the row
    presence: jax.Array  # f32[R] presence penalty (0: off)
    frequency: jax.Array  # f32[R] frequency penalty (0: off)
    repetition: jax.Array  # f32[R] repetition penalty (1: off)
    min_p: jax.Array  # f32[R] (0: off)
    min_tokens: jax.Array  # i32[R] stop tokens banned while fewer outputs were generated
    bias: jax.Array  # f32[R, V] logit bias
    allowed: jax.Array  # i32[R, ceil(V/32)] mask words: allowed_token_ids minus bad words
    stops: jax.Array  # i32[R, ceil(V/32)] mask words: the stop tokens min_tokens bans
    seen: jax.Array  # i32[R, ceil(V/32)] mask words: the prompt's tokens
    counts: jax.Array  # i32[R, V] output tokens committed since load


@struct.dataclass
class ProcessorInputs:
    """What `initialize` (and a settings-loading copy lane) loads per lane (B lanes)."""

    enabled: jax.Array  # bool[B]
    presence: jax.Array  # f32[B]
    frequency: jax.Array  # f32[B]
    repetition: jax.Array  # f32[B]
    min_p: jax.Array  # f32[B]
    min_tokens: jax.Array  # i32[B]
    bias_tokens: jax.Array  # i32[B, BIAS_CAPACITY] (-1: unused entry)
    bias_values: jax.Array  # f32[B, BIAS_CAPACITY]
    allowed: jax.Array  # i32[B, ceil(V/32)]
    stops: jax.Array  # i32[B, ceil(V/32)]
    seen: jax.Array  # i32[B, ceil(V/32)]
    count_tokens: jax.Array  # i32[B, COUNT_CAPACITY] earlier output tokens (-1: unused entry)
    count_values: jax.Array  # i32[B, COUNT_CAPACITY] how often each was output


def init_processors(rows: int, vocab: int) -> RowProcessors:
    words = mask_words(vocab)
    return RowProcessors(
        enabled=jnp.zeros((rows,), bool),
        presence=jnp.zeros((rows,), jnp.float32),
        frequency=jnp.zeros((rows,), jnp.float32),
        repetition=jnp.ones((rows,), jnp.float32),
        min_p=jnp.zeros((rows,), jnp.float32),
        min_tokens=jnp.zeros((rows,), jnp.int32),
        bias=jnp.zeros((rows, vocab), jnp.float32),
        allowed=jnp.full((rows, words), -1, jnp.int32),
        stops=jnp.zeros((rows, words), jnp.int32),
        seen=jnp.zeros((rows, words), jnp.int32),
        counts=jnp.zeros((rows, vocab), jnp.int32),
    )


def blank_processor_inputs(lanes: int, vocab: int) -> ProcessorInputs:
    """Host `ProcessorInputs` of `lanes` lanes without processors: every entry at its "off" value
    (the shapes and dtypes every program's processor inputs have; `processor_packing` fills lanes)."""
    words = mask_words(vocab)
    return ProcessorInputs(
        enabled=np.zeros((lanes,), bool),
        presence=np.zeros((lanes,), np.float32),
        frequency=np.zeros((lanes,), np.float32),
        repetition=np.ones((lanes,), np.float32),
        min_p=np.zeros((lanes,), np.float32),
        min_tokens=np.zeros((lanes,), np.int32),
        bias_tokens=np.full((lanes, BIAS_CAPACITY), -1, np.int32),
        bias_values=np.zeros((lanes, BIAS_CAPACITY), np.float32),
        allowed=np.full((lanes, words), -1, np.int32),
        stops=np.zeros((lanes, words), np.int32),
        seen=np.zeros((lanes, words), np.int32),
        count_tokens=np.full((lanes, COUNT_CAPACITY), -1, np.int32),
        count_values=np.zeros((lanes, COUNT_CAPACITY), np.int32),
    )


def processor_input_spec(lanes: int, vocab: int) -> ProcessorInputs:
    """The abstract inputs programs are lowered for: `blank_processor_inputs`' shapes and dtypes."""
    blank = blank_processor_inputs(lanes, vocab)
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), blank)


def loaded_rows(inputs: ProcessorInputs, vocab: int) -> RowProcessors:
    """B lanes' processor rows as loaded: the bias and the earlier output counts made dense."""
    b = inputs.enabled.shape[0]
    lanes = jnp.arange(b)[:, None]
    tokens = jnp.where(inputs.bias_tokens >= 0, inputs.bias_tokens, vocab)
    bias = jnp.zeros((b, vocab), jnp.float32).at[lanes, tokens].add(inputs.bias_values, mode="drop")
    earlier = jnp.where(inputs.count_tokens >= 0, inputs.count_tokens, vocab)
    counts = jnp.zeros((b, vocab), jnp.int32).at[lanes, earlier].add(inputs.count_values, mode="drop")
    return RowProcessors(
        enabled=inputs.enabled,
        presence=inputs.presence,
        frequency=inputs.frequency,
        repetition=inputs.repetition,
        min_p=inputs.min_p,
        min_tokens=inputs.min_tokens,
        bias=bias,
        allowed=inputs.allowed,
        stops=inputs.stops,
        seen=inputs.seen,
        counts=counts,
    )


def write_rows(state: RowProcessors, rows: jax.Array, values: RowProcessors) -> RowProcessors:
    """`state` with rows[b] set to lane b's values (rows out of range: dropped)."""
    return jax.tree_util.tree_map(
        lambda array, value: array.at[rows].set(value.astype(array.dtype), mode="drop"), state, values
    )


def select_rows(load: jax.Array, loaded: RowProcessors, copied: RowProcessors) -> RowProcessors:
    """Per lane, `loaded` where `load` (bool[B]) else `copied`."""

    def pick(a, b):
        return jnp.where(load.reshape(load.shape + (1,) * (a.ndim - 1)), a, b.astype(a.dtype))

    return jax.tree_util.tree_map(pick, loaded, copied)


def gather_rows(state: RowProcessors, slots: jax.Array) -> RowProcessors:
    return jax.tree_util.tree_map(lambda array: array[slots], state)


def apply_processors(
    logits: jax.Array,  # f32[B, W, V] the lanes' target sample rows
    state: RowProcessors,
    slots: jax.Array,  # i32[B] the lanes' state rows
    live: jax.Array,  # bool[B] lanes whose results are used
    generated: jax.Array,  # i32[B] outputs the row generated before this round
    proposals: jax.Array,  # i32[B, W-1] row j follows proposals 0..j-1
) -> jax.Array:
    """Steps 1-4 of the module docstring on enabled live lanes; the logits untouched (one
    `lax.cond`, nothing gathered) when there are none."""
    enabled = state.enabled[slots] & live

    def process(logits):
        b, w, v = logits.shape
        row = gather_rows(state, slots)
        out = jnp.where(unpack_token_mask(row.allowed, v)[:, None], logits, -jnp.inf)  # 1, 2
        before = generated[:, None] + jnp.arange(w)[None, :]  # i32[B, W] outputs before row j
        early = (before < row.min_tokens[:, None])[..., None]
        out = jnp.where(early & unpack_token_mask(row.stops, v)[:, None], -jnp.inf, out)  # 3
        out = out + row.bias[:, None]
        steps = jax.nn.one_hot(proposals, v, dtype=jnp.int32)  # i32[B, W-1, V]
        prior = jnp.concatenate([jnp.zeros((b, 1, v), jnp.int32), jnp.cumsum(steps, axis=1)], axis=1)
        counts = row.counts[:, None] + prior  # i32[B, W, V] outputs before row j
        seen = unpack_token_mask(row.seen, v)[:, None] | (counts > 0)
        rp = row.repetition[:, None, None]
        out = jnp.where(seen, jnp.where(out > 0, out / rp, out * rp), out)  # 4
        out = out - row.frequency[:, None, None] * counts
        out = out - row.presence[:, None, None] * (counts > 0)
        return jnp.where(enabled[:, None, None], out, logits)

    return jax.lax.cond(jnp.any(enabled), process, lambda logits: logits, logits)


def count_outputs(
    state: RowProcessors,
    slots: jax.Array,  # i32[B]
    active: jax.Array,  # bool[B]
    tokens: jax.Array,  # i32[B, W] emitted tokens
    counts: jax.Array,  # i32[B] how many of them each lane emitted
) -> RowProcessors:
    """`state` with each enabled active lane's emitted tokens added to its row's output counts
    (a scatter of B * W entries; rows without processors are skipped)."""
    rows = jnp.where(active & state.enabled[slots], slots, state.counts.shape[0])
    emitted = (jnp.arange(tokens.shape[1])[None, :] < counts[:, None]).astype(jnp.int32)
    added = state.counts.at[rows[:, None], tokens].add(emitted, mode="drop")
    return state.replace(counts=added)
