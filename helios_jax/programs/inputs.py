"""Per-frame program inputs and outputs (plain arrays), and the static shape of each program.

Lanes. Batched programs take B lanes: `slots[b]` names the state row lane b works on, `active[b]`
whether it works at all (inactive lanes read a clipped row and write nothing), and
`page_tables[b]` the row's pages (one pool: the same ids index the target and the MTP cache). A
page table must cover every position the frame may write: up to cursor + W - 1 for the target
and cursor + D - 2 for provisional draft entries. The scheduler reserves the full execution
ceiling at commit, so a queued frame's tables are known before its predecessor completes.

Shapes below: B lanes, W width, D depth, P aggregate target rows, C prompt capacity,
T = C + (B - 1) * W mixed packed extent, N = pages_per_row, R state rows, S request slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.catalog import Allocation, GraphDescriptor, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.programs.processors import ProcessorInputs, processor_input_spec


@dataclasses.dataclass(frozen=True)
class ProgramShape:
    """Static extents of one prepared program: its descriptor plus the engine's sizes."""

    kind: GraphKind
    lanes: int  # B
    width: int  # W target rows per decode lane (1 for prefill/decode); chunk C for prefill
    depth: int  # D proposals
    target_capacity: int  # P (speculative), B (decode), C (prefill), C + (B-1)W (mixed)
    prefill_capacity: int  # C for mixed and prefill, else 0
    allocation: Allocation | None
    maintain_draft: bool  # absorb committed tokens into the MTP draft context
    pages_per_row: int  # N
    state_rows: int  # R
    request_slots: int  # S
    draft_capacity: int  # sidecar columns
    total_pages: int
    steps: int = 1  # K steps per execution (multi-step decode and width-one speculative)
    vocab: int = 0  # V: the token mask's extent (0: unknown, every mask is refused)

    @classmethod
    def of(cls, g: GraphDescriptor, engine: EngineConfig, vocab: int = 0) -> ProgramShape:
        kind = g.kind
        if kind.is_prefill:  # B prompt rows of up to C tokens each, packed by prefix sums
            width, packed, prompt = 1, g.batch_capacity * g.token_capacity, g.token_capacity
        elif kind is GraphKind.MIXED:
            width, packed, prompt = g.token_capacity, g.max_packed_extent, g.prefill_capacity
        elif kind is GraphKind.DECODE:
            width, packed, prompt = 1, g.batch_capacity, 0
        elif kind is GraphKind.SPECULATIVE:
            width, packed, prompt = g.token_capacity, g.target_capacity, 0
        elif kind in (GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE):
            width, packed, prompt = 0, 0, 0
        else:
            raise ValueError(f"graph {g.name}: no program builder for kind {kind.value!r}")
        if kind is GraphKind.SPECULATIVE or (kind is GraphKind.MIXED and g.speculative):
            maintain = True
        elif kind.is_prefill:
            maintain = engine.speculative
        else:
            maintain = False
        return cls(
            kind=kind,
            lanes=g.batch_capacity,
            width=width,
            depth=g.proposal_depth,
            target_capacity=packed,
            prefill_capacity=prompt,
            allocation=g.allocation,
            maintain_draft=maintain,
            pages_per_row=engine.pages_per_row,
            state_rows=engine.state_rows,
            request_slots=engine.request_slots,
            draft_capacity=engine.draft_capacity,
            total_pages=engine.kv_pages,
            steps=g.steps,
            vocab=vocab,
        )

    @property
    def device_allocation(self) -> bool:
        return self.allocation is Allocation.PREFIX_LIMIT

    @property
    def mask_words(self) -> int:
        """ceil(V / 32): int32 words of one lane's token mask (`token_mask.py`)."""
        return (self.vocab + 31) // 32

    @property
    def takes_token_mask(self) -> bool:
        """Every program that samples takes a token mask, except the K-step ones."""
        if self.steps > 1:
            return False
        return self.kind.is_prefill or self.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED)


# -- inputs ------------------------------------------------------------------------------------


@struct.dataclass
class PrefillInputs:
    """B requests' prompt chunks (prefill; scored prefill has B = 1).

    Row b's `length[b]` tokens sit in `tokens` at the exclusive prefix sum of the lengths before
    it (the packed layout of `round.py`); entries past the rows' total are ignored.
    """

    slot: jax.Array  # i32[B] state rows
    tokens: jax.Array  # i32[B * C] packed chunk tokens
    length: jax.Array  # i32[B] valid tokens per row, 0..C (0: the row changes nothing)
    prompt_ends: jax.Array  # bool[B] the row's chunk finishes its prompt: sample the first output
    page_table: jax.Array  # i32[B, N]
    token_mask: jax.Array  # i32[B, ceil(V/32)] allowed tokens of each row's sample (token_mask.py)
    masked: jax.Array  # bool[B] the row's sample is restricted to its token_mask


@struct.dataclass
class DecodeInputs:
    """Ordinary decode: one token per active lane; tokens and cursors come from the state. The
    token mask is None inside multi-step decode (K-step lanes are never masked)."""

    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    page_tables: jax.Array  # i32[B, N]
    token_mask: jax.Array | None = None  # i32[B, ceil(V/32)] (token_mask.py)
    masked: jax.Array | None = None  # bool[B]


@struct.dataclass
class MultiStepInputs:
    """Multi-step decode (K steps): lane b runs at most `steps[b]` steps (its output limit and
    context within K) and stops after a step that emits one of `stop_tokens[b]` (-1: unused)."""

    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    page_tables: jax.Array  # i32[B, N]
    steps: jax.Array  # i32[B] 1..K
    stop_tokens: jax.Array  # i32[B, STOP_CAPACITY]


# Stop tokens a multi-step decode lane can watch for (the tokenizer's end-of-sequence ids).
STOP_CAPACITY = 4
TOP_LOGPROBS = 20  # alternatives every generation program reports per output token (OpenAI's cap)


@struct.dataclass
class SpeculativeInputs:
    """Complete speculative generation.

    `lane_rows` is the binding's value source: exact query lengths (QueryLength, 1..W, summing
    within P) or immutable lane ceilings (SpeculativePrefixLimit, 1..min(D + 1, W); they may sum
    above P). Copy lanes (copy_lengths >= 0) verify supplied proposals instead of drawing.
    """

    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    page_tables: jax.Array  # i32[B, N]
    lane_rows: jax.Array  # i32[B] query lengths or ceilings, per the program's allocation
    copy_tokens: jax.Array  # i32[B, D]
    copy_lengths: jax.Array  # i32[B]; -1: learned proposals
    token_mask: jax.Array  # i32[B, ceil(V/32)] (token_mask.py); a masked lane verifies one row
    masked: jax.Array  # bool[B]


@struct.dataclass
class MixedInputs:
    """Mixed prefill/verification: at most one prompt row plus decode rows at width W.

    `query_lengths` is the one length upload: the prompt row's chunk length and each decode
    row's target rows (1..W). Packed offsets are its exclusive prefix sums over the lanes, so the
    prompt tokens sit in `tokens` at the prompt row's offset; decode rows' tokens (pending and
    proposals) come from the device.
    """

    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    page_tables: jax.Array  # i32[B, N]
    prefill_row: jax.Array  # i32[1] index of the prompt row in the dense active lane list; -1 none
    query_lengths: jax.Array  # i32[B]
    tokens: jax.Array  # i32[T] packed; the prompt at its row's offset, anything elsewhere
    prompt_ends: jax.Array  # bool[1]
    copy_tokens: jax.Array  # i32[B, W-1]
    copy_lengths: jax.Array  # i32[B]
    token_mask: jax.Array  # i32[B, ceil(V/32)] (token_mask.py); a masked decode lane has one row
    masked: jax.Array  # bool[B]


@struct.dataclass
class InitializeInputs:
    """Reset rows for new requests: cursor 0, sampling settings, a PRNG key from the seed, and
    whether the row's draws are coupled (keyed by seed and position: requests that set a seed,
    RESOLUTIONS.md 30) or advance the key every round (rejection sampling), and whether its
    programs score the tokens they emit (the log-probability gate, `scores.py`)."""

    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    temperature: jax.Array  # f32[B] (0: greedy)
    top_p: jax.Array  # f32[B] in (0, 1]
    top_k: jax.Array  # i32[B] (0: off)
    seed: jax.Array  # u32[B]
    coupled: jax.Array  # bool[B]
    logprobs: jax.Array  # bool[B] the request asked for its generated tokens' scores
    processors: ProcessorInputs  # the request's logits processors (processors.py)


@struct.dataclass
class CopyInputs:
    """Snapshot, restore and copy: per lane, one state row to another plus page contents.

    Page j of lane b copies src_pages[b, j] -> dst_pages[b, j] for j < page_counts[b] in both
    KV pools (whole pages, so a partial last page is preserved); the row's small state
    (cursor, pending token, draft context, sampling settings, PRNG key, counters) follows.

    Two per-lane overrides serve a restore into another request (prefix reuse): `cursor` >= 0
    sets the destination's cursor to the checkpoint's exact token count (a row snapshotted after
    a queued frame ran past its end holds later positions too: validity is only the cursor), and
    `load_settings` loads the destination request's own sampling settings, a key from its seed,
    whether its draws are keyed by that seed and whether it asked for scores (generated count 0)
    instead of copying the source's, as `initialize` would.
    """

    src_rows: jax.Array  # i32[B]
    dst_rows: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    src_pages: jax.Array  # i32[B, N]
    dst_pages: jax.Array  # i32[B, N]
    page_counts: jax.Array  # i32[B]
    cursor: jax.Array  # i32[B]; -1 copies the source row's cursor
    load_settings: jax.Array  # bool[B]
    temperature: jax.Array  # f32[B] (load_settings lanes)
    top_p: jax.Array  # f32[B]
    top_k: jax.Array  # i32[B]
    seed: jax.Array  # u32[B]
    coupled: jax.Array  # bool[B] (load_settings lanes): the request's draws are keyed by seed
    logprobs: jax.Array  # bool[B] (load_settings lanes): the request asked for scores
    processors: ProcessorInputs  # (load_settings lanes) the request's logits processors


# -- outputs -----------------------------------------------------------------------------------


@struct.dataclass
class RoundOutputs:
    """What a generation program (decode, speculative, mixed) reports.

    `tokens[b, :counts[b]]` are lane b's new output tokens (accepted proposals, then the
    replacement or bonus token; a mixed prompt row reports its first output token, count 1, only
    when the chunk ends the prompt). `query_lengths` are the target rows each lane used (the
    device allocation's result under prefix_limit). Sidecar (f32[2, S, draft_capacity], indexed
    by request slot; zeros for lanes not in the cohort and for columns >= D):
      sidecar[0, s, k]  draft confidence of proposal k (the draft model's probability of the
                        produced token at temperature T, T = 1 for greedy lanes)
      sidecar[1, s, k]  joint prefix probability: the product of sidecar[0, s, :k + 1]
    `survival[b, j]` is completion_speculative_survival for the j + 1 evaluated proposals,
    valid for j < query_lengths[b] - 1 (0 beyond).
    `logprobs[b, j]`, `top_logprobs[b, j]` and `top_tokens[b, j]` score output token j (valid for
    j < counts[b]) under log_softmax of the target logits that produced it: the raw model
    distribution, before temperature, top-k and top-p (docs/programs.md, "Log-probabilities").
    They are computed only when some live lane's row asked (its `logprobs` flag); otherwise the
    values are NaN and the tokens 0 (`scores.token_logprobs`).
    """

    tokens: jax.Array  # i32[B, W]
    counts: jax.Array  # i32[B]
    query_lengths: jax.Array  # i32[B]
    sidecar: jax.Array  # f32[2, S, draft_capacity]
    survival: jax.Array  # f32[B, W-1]
    logprobs: jax.Array  # f32[B, W] log p(tokens[b, j]) under the raw model distribution
    top_logprobs: jax.Array  # f32[B, W, N] the N = min(TOP_LOGPROBS, V) most probable tokens' log p
    top_tokens: jax.Array  # i32[B, W, N] those tokens, most probable first


@struct.dataclass
class PrefillOutputs:
    tokens: jax.Array  # i32[B] each row's first output token when its chunk ends the prompt, else 0
    counts: jax.Array  # i32[B] 1 or 0
    prompt_logprobs: jax.Array | None  # f32[C] scored prefill: log p(token j | prefix); NaN for
    #                                    the request's first token and past the chunk length
    logprobs: jax.Array | None = None  # f32[B] the first output token's (RoundOutputs.logprobs)
    top_logprobs: jax.Array | None = None  # f32[B, N]
    top_tokens: jax.Array | None = None  # i32[B, N]
    prompt_top_logprobs: jax.Array | None = None  # f32[C, N] scored prefill: the N most probable
    #                                    tokens' log p at each prompt token (NaN where undefined)
    prompt_top_tokens: jax.Array | None = None  # i32[C, N] those tokens, most probable first


def input_spec(shape: ProgramShape):
    """The program's input pytree as `jax.ShapeDtypeStruct`s."""
    i32, b8 = jnp.int32, jnp.bool_
    s = jax.ShapeDtypeStruct
    b, n = shape.lanes, shape.pages_per_row
    kind = shape.kind
    mask = dict(token_mask=s((b, shape.mask_words), i32), masked=s((b,), b8))
    if kind.is_prefill:
        c = shape.prefill_capacity
        lanes = (s((b,), i32), s((b * c,), i32), s((b,), i32), s((b,), b8), s((b, n), i32))
        return PrefillInputs(*lanes, **mask)
    if shape.steps > 1:  # K-step decode or width-one speculative (`multistep.py`)
        return MultiStepInputs(
            s((b,), i32), s((b,), b8), s((b, n), i32), s((b,), i32), s((b, STOP_CAPACITY), i32)
        )
    if kind is GraphKind.DECODE:
        return DecodeInputs(s((b,), i32), s((b,), b8), s((b, n), i32), **mask)
    if kind is GraphKind.SPECULATIVE:
        return SpeculativeInputs(
            s((b,), i32),
            s((b,), b8),
            s((b, n), i32),
            s((b,), i32),
            s((b, shape.depth), i32),
            s((b,), i32),
            **mask,
        )
    if kind is GraphKind.MIXED:
        return MixedInputs(
            s((b,), i32),
            s((b,), b8),
            s((b, n), i32),
            s((1,), i32),
            s((b,), i32),
            s((shape.target_capacity,), i32),
            s((1,), b8),
            s((b, shape.width - 1), i32),
            s((b,), i32),
            **mask,
        )
    return _row_spec(shape)


def _row_spec(shape: ProgramShape):
    """The input pytree of `initialize` and the copy programs."""
    i32, f32, b8, u32 = jnp.int32, jnp.float32, jnp.bool_, jnp.uint32
    s = jax.ShapeDtypeStruct
    b, n = shape.lanes, shape.pages_per_row
    if shape.kind is GraphKind.INITIALIZE:
        return InitializeInputs(
            s((b,), i32),
            s((b,), b8),
            s((b,), f32),
            s((b,), f32),
            s((b,), i32),
            s((b,), u32),
            s((b,), b8),
            s((b,), b8),
            processor_input_spec(b, shape.vocab),
        )
    return CopyInputs(
        s((b,), i32),
        s((b,), i32),
        s((b,), b8),
        s((b, n), i32),
        s((b, n), i32),
        s((b,), i32),
        s((b,), i32),
        s((b,), b8),
        s((b,), f32),
        s((b,), f32),
        s((b,), i32),
        s((b,), u32),
        s((b,), b8),
        s((b,), b8),
        processor_input_spec(b, shape.vocab),
    )
