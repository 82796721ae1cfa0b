"""Prepared programs: one pure, jitted, ahead-of-time compiled function per catalog graph.

Every program is `(params, state, inputs) -> (state, outputs)` with the device state donated
(`state.DeviceState`: paged target and MTP caches plus per-row cursor, pending token, draft
context, sampling settings and PRNG key). Modules, leaf first:

  state       DeviceState, init_state, state_shapes
  sampling    per-row sampling distributions (greedy, temperature, top-k, top-p), inverse-CDF draws
  acceptance  greedy and rejection-sampling acceptance, survival products
  impls       the one place choosing the attention and prefix-allocation implementations
  proposals   D sequential MTP proposals (learned or copy) with draft confidence
  inputs      ProgramShape, per-kind input and output structures, input specs
  round       the shared packed round: propose, allocate, verify, accept, commit, absorb
  builders    one builder per kind: prefill, scored prefill, decode, speculative, mixed,
              initialize, snapshot/restore (copy)
  packing     host data -> program inputs, with role validation
  program_set Program, ProgramSet, build_programs

docs/programs.md describes the state layout, each program's inputs and outputs, the sidecar
layout and the acceptance rule.
"""

from helios_jax.programs.acceptance import Acceptance, accept_proposals
from helios_jax.programs.impls import DEFAULT_IMPL, Impl
from helios_jax.programs.inputs import (
    CopyInputs,
    DecodeInputs,
    InitializeInputs,
    MixedInputs,
    PrefillInputs,
    PrefillOutputs,
    ProgramShape,
    RoundOutputs,
    SpeculativeInputs,
    input_spec,
)
from helios_jax.programs.packing import InputError, packed_offsets, sampling_mask
from helios_jax.programs.program_set import Program, ProgramSet, build_program, build_programs
from helios_jax.programs.sampling import sample_inverse_cdf, sampling_probs
from helios_jax.programs.state import DeviceState, init_state, state_bytes, state_shapes

__all__ = [
    "Acceptance",
    "CopyInputs",
    "DEFAULT_IMPL",
    "DecodeInputs",
    "DeviceState",
    "Impl",
    "InitializeInputs",
    "InputError",
    "MixedInputs",
    "PrefillInputs",
    "PrefillOutputs",
    "Program",
    "ProgramSet",
    "ProgramShape",
    "RoundOutputs",
    "SpeculativeInputs",
    "accept_proposals",
    "build_program",
    "build_programs",
    "init_state",
    "input_spec",
    "packed_offsets",
    "sample_inverse_cdf",
    "sampling_mask",
    "sampling_probs",
    "state_bytes",
    "state_shapes",
]
