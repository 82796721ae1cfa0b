"""Multi-step decode: K ordinary decode steps in one prepared execution (`lax.scan`).

Each step is exactly the single-step decode program's round (`builders.build_decode`) over the
lanes still running, so a lane's state, cache writes and randomness advance as K separate
single-step executions would advance them: its PRNG key is split once per step it takes (a
coupled row keeps its seed's key and draws by position), and greedy and seeded output are
identical. A lane runs at most `steps[b]` steps (the host's bound:
K, the output limit and the context left) and stops after the step that emits one of its stop
tokens; from then on it is an inactive lane, so it commits nothing and writes no state: no
request receives a token, or a cursor, past its end.

A width-one speculative program (`shape.maintain_draft`) keeps the draft (MTP) context as K
width-one rounds would, but absorbs the K committed pairs after the scan in **one** packed MTP
forward (lane b's pairs (h_{c+j-1}, x_{c+j}), j < counts[b], at positions c+j-1, causal among
themselves as in a round that commits several tokens), not one MTP forward per step: the draft
head's weights are read once for the K x B pairs instead of K times for B. The draft context's
entries are the same (within rounding: the products run over more rows at once), and nothing a
step samples reads the draft context, so tokens, rows and the target cache are unchanged.

Outputs: `RoundOutputs` with `tokens` i32[B, K] (lane b's output is `tokens[b, :counts[b]]`,
zeros beyond), `counts` i32[B] (the steps it took), `query_lengths` ones (one target row per
step, no proposals), each step's log-probabilities as columns of `logprobs`, `top_logprobs` and
`top_tokens`, and the last step's empty sidecar and survival rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from helios_jax.model import ModelConfig
from helios_jax.programs.impls import Impl
from helios_jax.programs.inputs import DecodeInputs, MultiStepInputs, ProgramShape, RoundOutputs
from helios_jax.programs.round import absorb_pairs
from helios_jax.programs.state import DeviceState


def build_multistep_decode(config: ModelConfig, shape: ProgramShape, impl: Impl, single_step):
    """K = `shape.steps` decode steps of `single_step` (the one-step decode body) in one scan;
    a width-one speculative shape's draft upkeep runs once after it (`_absorb_steps`)."""
    k = shape.steps
    deferred = shape.maintain_draft and config.has_mtp
    step_shape = dataclasses.replace(shape, maintain_draft=False) if deferred else shape
    step_fn = single_step(config, step_shape, impl)

    def multistep(params, state: DeviceState, inputs: MultiStepInputs):
        active = inputs.active.astype(bool)
        slots = jnp.clip(inputs.slots, 0, state.rows - 1)
        start = state.cursor[slots]  # c: step j of a lane that takes it reads position c + j

        def body(carry, j):
            state, running = carry
            lanes = running & (j < inputs.steps)
            # The pair this step commits to the draft context: (h_{c+j-1}, x_{c+j}).
            pair = (state.pending[slots], state.last_hidden[slots])
            state, out = step_fn(
                params, state, DecodeInputs(slots=inputs.slots, active=lanes, page_tables=inputs.page_tables)
            )
            token = out.tokens[:, 0]
            stopped = jnp.any(token[:, None] == inputs.stop_tokens, axis=1)
            return (state, lanes & ~stopped), (jnp.where(lanes, token, 0), lanes, out, pair)

        (state, _), (tokens, emitted, outs, pairs) = jax.lax.scan(body, (state, active), jnp.arange(k))
        counts = jnp.sum(emitted, axis=0).astype(jnp.int32)
        if deferred and state.draft is not None:
            draft = _absorb_steps(config, params, state.draft, pairs, start, counts, inputs, impl)
            state = state.replace(draft=draft)
        last = jax.tree_util.tree_map(lambda x: x[-1], outs)
        outputs = RoundOutputs(
            tokens=tokens.T.astype(jnp.int32),
            counts=counts,
            query_lengths=active.astype(jnp.int32),
            sidecar=last.sidecar,
            survival=last.survival,
            logprobs=outs.logprobs[:, :, 0].T,  # [K, B, 1] per step -> [B, K]
            top_logprobs=jnp.swapaxes(outs.top_logprobs[:, :, 0], 0, 1),  # [K, B, 1, N] -> [B, K, N]
            top_tokens=jnp.swapaxes(outs.top_tokens[:, :, 0], 0, 1),
        )
        return state, outputs

    return multistep


def _absorb_steps(
    config: ModelConfig, params, draft_cache, pairs, start, counts, inputs: MultiStepInputs, impl: Impl
):
    """The draft upkeep of every step taken, as one packed MTP forward (`round.absorb_pairs`, what
    a round that commits several tokens runs): lane b's packed block [b*K, b*K + counts[b]) holds
    its steps' tokens x_{c+j} at positions c + j, each paired with h_{c+j-1}."""
    pending, hidden = pairs  # [K, B], [K, B, H]: each step's row before it ran
    k, b = pending.shape
    layout = (
        pending.T.reshape(b * k),
        (start[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]).reshape(b * k),
        inputs.page_tables,
        jnp.arange(b, dtype=jnp.int32) * k,
    )
    hidden_in = jnp.swapaxes(hidden, 0, 1).reshape(b * k, hidden.shape[-1])
    return absorb_pairs(
        config, params, draft_cache, hidden_in, layout, start, counts, attention=impl.attention_kernel()
    )
