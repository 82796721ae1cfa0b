"""Multi-step decode: K ordinary decode steps in one prepared execution (`lax.scan`).

Each step is exactly the single-step decode program's round (`builders.build_decode`) over the
lanes still running, so a lane's state, cache writes and randomness advance as K separate
single-step executions would advance them: its PRNG key is split once per step it takes (a
coupled row keeps its seed's key and draws by position), and greedy and seeded output are
identical. A lane runs at most `steps[b]` steps (the host's bound:
K, the output limit and the context left) and stops after the step that emits one of its stop
tokens; from then on it is an inactive lane, so it commits nothing and writes no state: no
request receives a token, or a cursor, past its end.

Outputs: `RoundOutputs` with `tokens` i32[B, K] (lane b's output is `tokens[b, :counts[b]]`,
zeros beyond), `counts` i32[B] (the steps it took), `query_lengths` ones (one target row per
step, no proposals), each step's log-probabilities as columns of `logprobs`, `top_logprobs` and
`top_tokens`, and the last step's empty sidecar and survival rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from helios_jax.model import ModelConfig
from helios_jax.programs.impls import Impl
from helios_jax.programs.inputs import DecodeInputs, MultiStepInputs, ProgramShape, RoundOutputs
from helios_jax.programs.state import DeviceState


def build_multistep_decode(config: ModelConfig, shape: ProgramShape, impl: Impl, single_step):
    """K = `shape.steps` decode steps of `single_step` (the one-step decode body) in one scan."""
    k = shape.steps
    step_fn = single_step(config, shape, impl)

    def multistep(params, state: DeviceState, inputs: MultiStepInputs):
        active = inputs.active.astype(bool)

        def body(carry, j):
            state, running = carry
            lanes = running & (j < inputs.steps)
            state, out = step_fn(
                params, state, DecodeInputs(slots=inputs.slots, active=lanes, page_tables=inputs.page_tables)
            )
            token = out.tokens[:, 0]
            stopped = jnp.any(token[:, None] == inputs.stop_tokens, axis=1)
            return (state, lanes & ~stopped), (jnp.where(lanes, token, 0), lanes, out)

        (state, _), (tokens, emitted, outs) = jax.lax.scan(body, (state, active), jnp.arange(k))
        last = jax.tree_util.tree_map(lambda x: x[-1], outs)
        outputs = RoundOutputs(
            tokens=tokens.T.astype(jnp.int32),
            counts=jnp.sum(emitted, axis=0).astype(jnp.int32),
            query_lengths=active.astype(jnp.int32),
            sidecar=last.sidecar,
            survival=last.survival,
            logprobs=outs.logprobs[:, :, 0].T,  # [K, B, 1] per step -> [B, K]
            top_logprobs=jnp.swapaxes(outs.top_logprobs[:, :, 0], 0, 1),  # [K, B, 1, N] -> [B, K, N]
            top_tokens=jnp.swapaxes(outs.top_tokens[:, :, 0], 0, 1),
        )
        return state, outputs

    return multistep
