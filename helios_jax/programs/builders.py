"""One builder per program kind: each returns a pure `(params, state, inputs) -> (state, outputs)`.

The generation kinds are thin adapters from their input contract to the shared packed round
(`round.py`); the state operations are direct row and page copies. Builders close over static
values only (the frozen `ModelConfig`, the `ProgramShape`, the `Impl`), so every returned function
can be jitted with the state donated and compiled ahead of time.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from helios_jax.catalog import GraphKind
from helios_jax.kernels.raw_bits import scatter_set
from helios_jax.model import ModelConfig, PagedKVCache
from helios_jax.programs.impls import Impl
from helios_jax.programs.inputs import (
    CopyInputs,
    DecodeInputs,
    InitializeInputs,
    MixedInputs,
    PrefillInputs,
    PrefillOutputs,
    ProgramShape,
    SpeculativeInputs,
)
from helios_jax.programs.multistep import build_multistep_decode
from helios_jax.programs.processors import gather_rows, loaded_rows, select_rows, write_rows
from helios_jax.programs.round import RoundInputs, RoundPlan, packed_round
from helios_jax.programs.state import DeviceState, key_data

ProgramFn = Callable[..., tuple]


def _sidecar_shape(shape: ProgramShape) -> tuple[int, int]:
    return shape.request_slots, shape.draft_capacity


def _no_copies(b: int, d: int):
    return jnp.zeros((b, d), jnp.int32), jnp.full((b,), -1, jnp.int32)


def build_prefill(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Prefill (and scored prefill): B requests' chunks of up to C tokens each into their pages,
    packed into one forward (B = 1: one request's chunk; scored prefill always has B = 1).

    When a row's `prompt_ends`, its chunk's last token samples the first output token with the row's
    settings (it becomes the pending token). Every chunk leaves cursor, h_{c-1} and, under
    speculation, the draft context current, so the next chunk or decode continues seamlessly.
    """
    scored = shape.kind is GraphKind.SCORED_PREFILL
    plan = RoundPlan(
        lanes=shape.lanes,
        width=1,
        depth=0,
        packed=shape.target_capacity,
        prompt_capacity=shape.prefill_capacity,
        maintain_draft=shape.maintain_draft,
        device_allocation=False,
        scored=scored,
    )

    def prefill(params, state: DeviceState, inputs: PrefillInputs):
        copy_tokens, copy_lengths = _no_copies(shape.lanes, 0)
        x = RoundInputs(
            slots=inputs.slot,
            active=inputs.length > 0,
            page_tables=inputs.page_table,
            prompt_lane=jnp.ones((shape.lanes,), bool),
            lane_rows=inputs.length,
            tokens=inputs.tokens,
            prompt_ends=inputs.prompt_ends,
            copy_tokens=copy_tokens,
            copy_lengths=copy_lengths,
            token_mask=inputs.token_mask,
            masked=inputs.masked,
        )
        state, out, prompt_scores = packed_round(
            config, params, state, x, plan, impl, sidecar_shape=_sidecar_shape(shape)
        )
        return state, PrefillOutputs(
            tokens=out.tokens[:, 0],
            counts=out.counts,
            logprobs=out.logprobs[:, 0],
            top_logprobs=out.top_logprobs[:, 0],
            top_tokens=out.top_tokens[:, 0],
            **(prompt_scores or dict(prompt_logprobs=None)),
        )

    return prefill


def build_decode(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Ordinary decode: each active lane feeds its pending token and samples the next (K > 1
    steps: `multistep.build_multistep_decode` scans this body)."""
    if shape.steps > 1:
        return build_multistep_decode(config, shape, impl, build_decode_step)
    return build_decode_step(config, shape, impl)


def build_decode_step(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """One ordinary decode step over the lanes of `shape` (a width-one speculative shape's step
    also absorbs the committed pair into the draft context: `shape.maintain_draft`)."""
    plan = RoundPlan(
        lanes=shape.lanes,
        width=1,
        depth=0,
        packed=shape.lanes,
        prompt_capacity=0,
        maintain_draft=shape.maintain_draft,
        device_allocation=False,
    )

    def decode(params, state: DeviceState, inputs: DecodeInputs):
        b = shape.lanes
        copy_tokens, copy_lengths = _no_copies(b, 0)
        x = RoundInputs(
            slots=inputs.slots,
            active=inputs.active,
            page_tables=inputs.page_tables,
            prompt_lane=jnp.zeros((b,), bool),
            lane_rows=jnp.ones((b,), jnp.int32),
            tokens=jnp.zeros((b,), jnp.int32),
            prompt_ends=jnp.asarray(False),
            copy_tokens=copy_tokens,
            copy_lengths=copy_lengths,
            token_mask=inputs.token_mask,
            masked=inputs.masked,
        )
        state, out, _ = packed_round(
            config, params, state, x, plan, impl, sidecar_shape=_sidecar_shape(shape)
        )
        return state, out

    return decode


def build_speculative(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Complete speculative generation (B, D, W, P, binding): proposals, confidence, allocation,
    packed verification, acceptance and accepted-state commit in one program. Width one (D = 0)
    is a decode that also absorbs the committed pair into the draft context; with K > 1 steps it
    is `multistep.build_multistep_decode` over that step (RESOLUTIONS.md, 25)."""
    if shape.steps > 1:
        if shape.width != 1 or shape.depth != 0:
            raise ValueError(f"a {shape.steps}-step speculative program has width one, not {shape.width}")
        return build_multistep_decode(config, shape, impl, build_decode_step)
    plan = RoundPlan(
        lanes=shape.lanes,
        width=shape.width,
        depth=shape.depth,
        packed=shape.target_capacity,
        prompt_capacity=0,
        maintain_draft=True,
        device_allocation=shape.device_allocation,
    )

    def speculative(params, state: DeviceState, inputs: SpeculativeInputs):
        b = shape.lanes
        x = RoundInputs(
            slots=inputs.slots,
            active=inputs.active,
            page_tables=inputs.page_tables,
            prompt_lane=jnp.zeros((b,), bool),
            lane_rows=inputs.lane_rows,
            tokens=jnp.zeros((shape.target_capacity,), jnp.int32),
            prompt_ends=jnp.asarray(False),
            copy_tokens=inputs.copy_tokens,
            copy_lengths=inputs.copy_lengths,
            token_mask=inputs.token_mask,
            masked=inputs.masked,
        )
        state, out, _ = packed_round(
            config, params, state, x, plan, impl, sidecar_shape=_sidecar_shape(shape)
        )
        return state, out

    return speculative


def build_mixed(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Mixed prefill/verification: one packed target forward shared by the prompt row and the
    decode rows (width W; W > 1 verifies D = W - 1 proposals; the speculative variant keeps the
    draft context at every width)."""
    plan = RoundPlan(
        lanes=shape.lanes,
        width=shape.width,
        depth=shape.depth,
        packed=shape.target_capacity,
        prompt_capacity=shape.prefill_capacity,
        maintain_draft=shape.maintain_draft,
        device_allocation=False,
    )

    def mixed(params, state: DeviceState, inputs: MixedInputs):
        active = inputs.active.astype(bool)
        dense = jnp.cumsum(active.astype(jnp.int32)) - 1  # index in the dense active lane list
        row = inputs.prefill_row[0]
        x = RoundInputs(
            slots=inputs.slots,
            active=active,
            page_tables=inputs.page_tables,
            prompt_lane=active & (row >= 0) & (dense == row),
            lane_rows=inputs.query_lengths,
            tokens=inputs.tokens,
            prompt_ends=inputs.prompt_ends[0],
            copy_tokens=inputs.copy_tokens,
            copy_lengths=inputs.copy_lengths,
            token_mask=inputs.token_mask,
            masked=inputs.masked,
        )
        state, out, _ = packed_round(
            config, params, state, x, plan, impl, sidecar_shape=_sidecar_shape(shape)
        )
        return state, out

    return mixed


def build_initialize(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Reset rows for new requests. Pages need no clearing: validity is the cursor."""
    del config, impl

    def initialize(params, state: DeviceState, inputs: InitializeInputs):
        del params
        rows = jnp.where(inputs.active, jnp.clip(inputs.slots, 0, state.rows - 1), state.rows)

        def put(array, values):
            return array.at[rows].set(jnp.asarray(values).astype(array.dtype), mode="drop")

        b = shape.lanes
        state = state.replace(
            cursor=put(state.cursor, jnp.zeros((b,), jnp.int32)),
            pending=put(state.pending, jnp.zeros((b,), jnp.int32)),
            last_hidden=put(state.last_hidden, jnp.zeros((b, state.last_hidden.shape[1]))),
            temperature=put(state.temperature, inputs.temperature),
            top_p=put(state.top_p, inputs.top_p),
            top_k=put(state.top_k, inputs.top_k),
            rng=put(state.rng, key_data(inputs.seed)),
            coupled=put(state.coupled, inputs.coupled),
            logprobs=put(state.logprobs, inputs.logprobs),
            generated=put(state.generated, jnp.zeros((b,), jnp.int32)),
            processors=write_rows(state.processors, rows, loaded_rows(inputs.processors, vocab_of(state))),
        )
        return state, None

    return initialize


def vocab_of(state: DeviceState) -> int:
    return state.processors.counts.shape[1]


def copy_pages(cache: PagedKVCache, src: jax.Array, dst: jax.Array) -> PagedKVCache:
    """Copies whole pages src[i] -> dst[i] in every layer; dst == total_pages is dropped."""
    src = jnp.clip(src, 0, cache.total_pages - 1)
    return PagedKVCache(
        k=scatter_set(cache.k, (slice(None), slice(None), dst), cache.k[:, :, src]),
        v=scatter_set(cache.v, (slice(None), slice(None), dst), cache.v[:, :, src]),
    )


def build_copy(config: ModelConfig, shape: ProgramShape, impl: Impl) -> ProgramFn:
    """Snapshot, restore and copy share this body: rows and whole pages, both KV pools."""
    del config, impl

    def copy(params, state: DeviceState, inputs: CopyInputs):
        del params
        active = inputs.active.astype(bool)
        src_rows = jnp.clip(inputs.src_rows, 0, state.rows - 1)
        dst_rows = jnp.where(active, jnp.clip(inputs.dst_rows, 0, state.rows - 1), state.rows)
        n = inputs.src_pages.shape[1]
        valid = active[:, None] & (jnp.arange(n)[None, :] < inputs.page_counts[:, None])
        total = state.target.total_pages
        src = inputs.src_pages.reshape(-1)
        dst = jnp.where(valid, inputs.dst_pages, total).reshape(-1)

        def move(array, values=None):
            values = array[src_rows] if values is None else values.astype(array.dtype)
            return array.at[dst_rows].set(values, mode="drop")

        load = inputs.load_settings.astype(bool)

        def setting(array, loaded):  # the destination request's own setting, or the source's
            mask = load.reshape(load.shape + (1,) * (array.ndim - 1))
            return move(array, jnp.where(mask, loaded.astype(array.dtype), array[src_rows]))

        cursor = jnp.where(inputs.cursor >= 0, inputs.cursor, state.cursor[src_rows])
        state = state.replace(
            target=copy_pages(state.target, src, dst),
            draft=None if state.draft is None else copy_pages(state.draft, src, dst),
            cursor=move(state.cursor, cursor),
            pending=move(state.pending),
            last_hidden=move(state.last_hidden),
            temperature=setting(state.temperature, inputs.temperature),
            top_p=setting(state.top_p, inputs.top_p),
            top_k=setting(state.top_k, inputs.top_k),
            rng=setting(state.rng, key_data(inputs.seed)),
            coupled=setting(state.coupled, inputs.coupled),
            logprobs=setting(state.logprobs, inputs.logprobs),
            generated=setting(state.generated, jnp.zeros_like(inputs.top_k)),
            processors=write_rows(
                state.processors,
                dst_rows,
                select_rows(
                    load,
                    loaded_rows(inputs.processors, vocab_of(state)),
                    gather_rows(state.processors, src_rows),
                ),
            ),
        )
        return state, None

    return copy


BUILDERS: dict[GraphKind, Callable[[ModelConfig, ProgramShape, Impl], ProgramFn]] = {
    GraphKind.PREFILL: build_prefill,
    GraphKind.SCORED_PREFILL: build_prefill,
    GraphKind.DECODE: build_decode,
    GraphKind.SPECULATIVE: build_speculative,
    GraphKind.MIXED: build_mixed,
    GraphKind.INITIALIZE: build_initialize,
    GraphKind.SNAPSHOT: build_copy,
    GraphKind.RESTORE: build_copy,
}
