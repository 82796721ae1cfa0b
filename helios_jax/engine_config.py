"""The frozen engine configuration shared by `prepare` (the spec's ignition) and the server.

One `EngineConfig` fixes everything that decides *which* programs exist and how large the device
state is: request slots (concurrency), prefill chunk buckets, the speculation mode, the proposal
depths, the speculative token envelope R, mixed capture, the context length, the KV page pool and
the compute dtype. `EngineConfig.catalog()` plans the prepared catalog from it with the spec's
coverage rules ("Speculative graph coverage", "Mixed execution contract"), so planning reports the
same catalog that preparation compiles.

The engine's command line, `EngineOptions` (the flags as given, resolved against a loaded model
into an `EngineConfig`), lives in `helios_jax.engine_options`; it stays importable from here.

Worked example (the shipped synthetic catalog): request_slots 16, proposal depths (3, 7), R 64,
adaptive speculation. Request buckets 1, 2, 4, 8, 16. Per bucket a width-one program (D = 0,
P = B). For D = 3 (W = 4): B*W <= 64 at every bucket, so five rectangular programs (P = 4B).
For D = 7 (W = 8): B = 1..8 are rectangular (P = 8B <= 64); B = 16 would need 128 rows, so it
becomes a ragged program with P = R = 64, bound to the device `prefix_limit` allocation under
adaptive speculation (host `query_length` under fixed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from helios_jax.catalog import (
    MAX_REQUEST_SLOTS,
    PROMPT_ALIGNMENT,
    Allocation,
    Catalog,
    DecodeMode,
    GraphDescriptor,
    GraphKind,
    batch_buckets,
    mixed_shapes,
)

if TYPE_CHECKING:
    from helios_jax.engine_options import EngineOptions as EngineOptions

# The speculation flag's values and the scheduler's decode mode each one selects.
DECODE_MODES = {"off": DecodeMode.ORDINARY, "fixed": DecodeMode.FIXED, "adaptive": DecodeMode.ADAPTIVE}
SPECULATION_MODES = tuple(DECODE_MODES)
DEFAULT_MAX_MODEL_LEN = 4096  # the longest context an unset --max_model_len gives, whatever the model allows
DTYPES = ("float32", "bfloat16")
PROPOSAL_SOURCES = ("learned", "copy", "both")  # who drafts speculative rounds (docs/copy-proposals.md)
MAX_DECODE_STEPS = 64  # the longest scan a decode program may run
_DEFAULT_CHUNKS = tuple(1 << i for i in range(6, 13))  # 64 .. 4096


def default_prefill_chunks(max_model_len: int) -> tuple[int, ...]:
    """Powers of two 64..4096 capped by the context length (the context length itself when it
    is shorter than 64)."""
    chunks = tuple(c for c in _DEFAULT_CHUNKS if c <= max_model_len)
    return chunks or (max_model_len,)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Capacities of one prepared engine.

    Attributes:
      request_slots: concurrency: resident requests (state rows 0..request_slots-1), 1..64.
      prefill_chunks: prefill chunk sizes (one prefill and one scored prefill program each);
        `None` means powers of two 64..4096 capped by `max_model_len`.
      speculation: "off" (ordinary decode), "fixed" (host-allocated speculative programs only)
        or "adaptive" (device allocation where a program is ragged).
      draft_tokens: D, the deepest captured proposal depth (the MTP head's draft count).
      proposal_depths: every captured proposal depth; `None` means `(draft_tokens,)`. Each
        depth d adds width d + 1 programs at every request bucket.
      speculative_token_capacity: R, the aggregate target-row envelope of wider programs.
      mixed_prefill: capture mixed prefill/verification graphs (`catalog.mixed_shapes`).
      max_model_len: longest context a request may reach (prompt + output), in tokens.
      page_size: tokens per KV page.
      kv_pages: pages in the pool shared by the target and the MTP caches; `None` sizes it for
        every state row at full context.
      dtype: parameter, activation and cache dtype ("float32" or "bfloat16").
      snapshot_rows: extra state rows (after the request slots) that snapshots write and
        restores read; `None` means one per request slot, the rows the scheduler's checkpoint
        store assumes. Each owns a fixed run of `pages_per_row` pages at the end of the pool
        (`snapshot_pages`), so a checkpoint of any length fits its row; requests draw from the
        rest (`request_pages`).
      decode_steps: the step counts K of the decode programs: one `decode` program per request
        bucket and K (speculation off), or one width-one speculative program per bucket and K
        (speculation on: each step also keeps the draft context). K > 1 runs K steps in one
        execution (`programs/multistep.py`). `(1,)` is the single-step catalog.
      prefill_batch: the row counts B of the plain prefill programs (powers of two, 1 always
        included): B > 1 prefills B prompts' chunks in one execution, for every chunk C with
        B x C within the largest chunk and at the smallest chunk (scored prefill stays B = 1).
        `(1,)`: one prompt per prefill.
      proposal_source: who drafts speculative rounds: "learned" (the MTP head), "copy" (prompt
        lookup in the request's context, `runtime/lookup.py`; a model without an MTP head can
        only copy) or "both" (each round takes the source its request's estimates favour,
        `scheduler/sources.py`). It changes no program: every speculative program verifies
        either source.
      tensor_parallel: N, the devices every program runs on, sharded over a `tp` mesh axis
        (docs/distributed.md); 1 is the single-device program, with no mesh. It must divide the
        model's heads, KV heads, intermediate size and vocabulary (`build_programs` checks).
    """

    request_slots: int = 4
    prefill_chunks: tuple[int, ...] | None = None
    speculation: str = "adaptive"
    draft_tokens: int = 3
    proposal_depths: tuple[int, ...] | None = None
    speculative_token_capacity: int = 64
    mixed_prefill: bool = False
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    page_size: int = 16
    kv_pages: int | None = None
    dtype: str = "float32"
    snapshot_rows: int | None = None
    decode_steps: tuple[int, ...] = (1,)
    prefill_batch: tuple[int, ...] = (1,)
    proposal_source: str = "learned"
    tensor_parallel: int = 1

    def __post_init__(self):
        def fail(field: str, message: str):
            raise ValueError(f"EngineConfig.{field}: {message}")

        def integer(field: str, value, low: int, high: int | None = None):
            if not isinstance(value, int) or isinstance(value, bool):
                fail(field, f"must be an integer, got {value!r}")
            if value < low or (high is not None and value > high):
                bound = f"{low}..{high}" if high is not None else f">= {low}"
                fail(field, f"must be {bound}, got {value}")

        integer("request_slots", self.request_slots, 1, MAX_REQUEST_SLOTS)
        integer("max_model_len", self.max_model_len, 1)
        integer("page_size", self.page_size, 1)
        integer("speculative_token_capacity", self.speculative_token_capacity, 0)
        integer("tensor_parallel", self.tensor_parallel, 1)
        if self.snapshot_rows is None:
            object.__setattr__(self, "snapshot_rows", self.request_slots)
        integer("snapshot_rows", self.snapshot_rows, 0)
        if self.speculation not in SPECULATION_MODES:
            fail("speculation", f"must be one of {SPECULATION_MODES}, got {self.speculation!r}")
        if self.dtype not in DTYPES:
            fail("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        if self.proposal_source not in PROPOSAL_SOURCES:
            fail("proposal_source", f"must be one of {PROPOSAL_SOURCES}, got {self.proposal_source!r}")
        integer("draft_tokens", self.draft_tokens, 0)
        if self.speculation != "off" and self.draft_tokens < 1:
            fail("draft_tokens", "speculation needs at least one draft token (use speculation='off')")
        chunks = self.prefill_chunks
        if chunks is None:
            object.__setattr__(self, "prefill_chunks", default_prefill_chunks(self.max_model_len))
        else:
            chunks = tuple(chunks)
            if not chunks:
                fail("prefill_chunks", "at least one chunk size is required")
            for c in chunks:
                integer("prefill_chunks", c, 1, self.max_model_len)
            if len(set(chunks)) != len(chunks):
                fail("prefill_chunks", f"chunk sizes repeat: {chunks}")
            object.__setattr__(self, "prefill_chunks", tuple(sorted(chunks)))
        depths = self.proposal_depths
        if depths is None:
            depths = (self.draft_tokens,) if self.speculation != "off" else ()
        depths = tuple(sorted(set(depths)))
        if self.speculation == "off" and depths:
            fail("proposal_depths", "ordinary decoding captures no proposal depths")
        for d in depths:
            integer("proposal_depths", d, 1, self.draft_tokens)
        if self.speculation != "off" and self.draft_tokens not in depths:
            fail("proposal_depths", f"must include draft_tokens={self.draft_tokens}, got {depths}")
        object.__setattr__(self, "proposal_depths", depths)
        self._check_steps_and_rows(fail, integer)
        if self.mixed_prefill and not any(c % PROMPT_ALIGNMENT == 0 for c in self.prefill_chunks):
            fail("mixed_prefill", f"needs a prefill chunk that is a multiple of {PROMPT_ALIGNMENT}")
        if self.kv_pages is None:
            object.__setattr__(self, "kv_pages", self.state_rows * self.pages_per_row)
        else:
            # One full-context request beside the snapshot rows' fixed pages.
            integer("kv_pages", self.kv_pages, self.pages_per_row * (1 + self.snapshot_rows))

    def _check_steps_and_rows(self, fail, integer) -> None:
        """decode_steps (K per decode program) and prefill_batch (rows per prefill program)."""
        steps = tuple(sorted(set(self.decode_steps)))
        if not steps:
            fail("decode_steps", "at least one step count is required")
        for k in steps:
            integer("decode_steps", k, 1, MAX_DECODE_STEPS)
        object.__setattr__(self, "decode_steps", steps)
        rows = tuple(sorted(set(self.prefill_batch) | {1}))
        for b in rows:
            integer("prefill_batch", b, 1, self.request_slots)
            if b & (b - 1):
                fail("prefill_batch", f"row counts are powers of two, got {b}")
        object.__setattr__(self, "prefill_batch", rows)

    # -- derived sizes --------------------------------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.speculation != "off"

    @property
    def decode_mode(self) -> DecodeMode:
        """The scheduler's mode for this config's `speculation`."""
        return DECODE_MODES[self.speculation]

    @property
    def state_rows(self) -> int:
        """Per-slot state rows: request slots first, then snapshot rows."""
        return self.request_slots + self.snapshot_rows

    @property
    def pages_per_row(self) -> int:
        """Page-table width of every program input: ceil(max_model_len / page_size)."""
        return -(-self.max_model_len // self.page_size)

    @property
    def request_pages(self) -> int:
        """The pages requests draw from (the scheduler's pool): the pool before the snapshot rows'."""
        return self.kv_pages - self.snapshot_rows * self.pages_per_row

    def snapshot_pages(self, row: int) -> range:
        """The fixed pages of snapshot row `row` (0-based among the snapshot rows)."""
        if not 0 <= row < self.snapshot_rows:
            raise ValueError(f"snapshot row {row} outside 0..{self.snapshot_rows - 1}")
        start = self.request_pages + row * self.pages_per_row
        return range(start, start + self.pages_per_row)

    @property
    def draft_capacity(self) -> int:
        """Columns of the confidence sidecar [2, request_slots, draft_capacity]: the deepest D."""
        return max(self.proposal_depths, default=0)

    @property
    def padded_concurrency(self) -> int:
        return batch_buckets(self.request_slots)[-1]

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    # -- planning ---------------------------------------------------------------------------
    def speculative_descriptors(self) -> list[GraphDescriptor]:
        """Width-one programs at every bucket (one per step count K of `decode_steps`), then width
        D+1 per captured depth.

        Rectangular (P = B*W) where B*W <= R; otherwise ragged with P = R, bound to the device
        allocation (`prefix_limit`) under adaptive speculation and to host `query_length` under
        fixed. A bucket whose ragged P = R could not even hold one row per lane (R < B) gets no
        wider program.
        """
        if not self.speculative:
            return []
        r = self.speculative_token_capacity
        ragged_binding = (
            Allocation.PREFIX_LIMIT if self.speculation == "adaptive" else Allocation.QUERY_LENGTH
        )
        out = []
        for b in batch_buckets(self.request_slots):
            out.extend(
                GraphDescriptor(
                    GraphKind.SPECULATIVE,
                    b,
                    token_capacity=1,
                    proposal_depth=0,
                    target_capacity=b,
                    allocation=Allocation.QUERY_LENGTH,
                    steps=k,
                )
                for k in self.decode_steps
            )
            for d in self.proposal_depths:
                w = d + 1
                if b * w <= r:
                    out.append(
                        GraphDescriptor(
                            GraphKind.SPECULATIVE,
                            b,
                            token_capacity=w,
                            proposal_depth=d,
                            target_capacity=b * w,
                            allocation=Allocation.QUERY_LENGTH,
                        )
                    )
                elif b <= r:
                    out.append(
                        GraphDescriptor(
                            GraphKind.SPECULATIVE,
                            b,
                            token_capacity=w,
                            proposal_depth=d,
                            target_capacity=r,
                            allocation=ragged_binding,
                        )
                    )
        return out

    def batch_prefill_descriptors(self) -> list[GraphDescriptor]:
        """Multi-prompt prefill (RESOLUTIONS.md, 26): B > 1 rows per chunk C while B x C stays
        within the largest chunk (the packed extent no single-row prefill exceeds), and always at
        the smallest chunk (so every B has a program)."""
        largest = max(self.prefill_chunks)
        return [
            GraphDescriptor(GraphKind.PREFILL, b, token_capacity=c)
            for b in self.prefill_batch
            if b > 1
            for c in self.prefill_chunks
            if b * c <= largest or c == self.prefill_chunks[0]
        ]

    def catalog(self, name: str = "prepared") -> Catalog:
        """The catalog `prepare` compiles, validated by `Catalog`'s constructor.

        Order: prefill and scored prefill per chunk (B = 1); ordinary decode per bucket or the
        speculative programs; mixed graphs (`mixed_shapes`) when `mixed_prefill`; then the state
        operations: initialize and snapshot at every request bucket, restore at B = 1.
        """
        graphs: list[GraphDescriptor] = []
        for c in self.prefill_chunks:
            graphs.append(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=c))
            graphs.append(GraphDescriptor(GraphKind.SCORED_PREFILL, 1, token_capacity=c))
        graphs.extend(self.batch_prefill_descriptors())
        if self.speculative:
            graphs.extend(self.speculative_descriptors())
        else:
            graphs.extend(
                GraphDescriptor(GraphKind.DECODE, b, token_capacity=1, target_capacity=b, steps=k)
                for b in batch_buckets(self.request_slots)
                for k in self.decode_steps
            )
        if self.mixed_prefill:
            shapes = mixed_shapes(
                concurrency=self.request_slots,
                prompt_buckets=[c for c in self.prefill_chunks if c % PROMPT_ALIGNMENT == 0],
                speculative=self.speculative,
                wider_widths=[d + 1 for d in self.proposal_depths],
                speculative_token_capacity=self.speculative_token_capacity,
            )
            graphs.extend(s.descriptor() for s in shapes)
        # Requests often start together: initialize at every request bucket, so a burst of
        # arrivals loads its sampling state in one program instead of one program each. Their
        # prompt-end anchors then come due together: snapshots too (RESOLUTIONS.md, 31: with
        # single-row snapshots the sixteen-request startup trace breaks its gap bound).
        for kind in (GraphKind.INITIALIZE, GraphKind.SNAPSHOT):
            graphs.extend(GraphDescriptor(kind, b) for b in batch_buckets(self.request_slots))
        graphs.append(GraphDescriptor(GraphKind.RESTORE, 1))
        return Catalog(
            name=name,
            mode="speculative" if self.speculative else "ordinary",
            speculative_token_capacity=self.speculative_token_capacity,
            request_slots=self.request_slots,
            graphs=tuple(graphs),
        )


def parse_int_list(values: Sequence[str] | str | None) -> tuple[int, ...] | None:
    """'64,128' or ['64', '128'] -> (64, 128); empty or None -> None (flag helpers)."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [v for v in values.split(",")]
    items = [v.strip() for v in values if v.strip()]
    return tuple(int(v) for v in items) or None


def __getattr__(name: str) -> type[EngineOptions]:
    """`EngineOptions`, re-exported from `helios_jax.engine_options` on first use: that module
    builds on `EngineConfig`, so importing it here at load time would be circular."""
    if name == "EngineOptions":
        from helios_jax.engine_options import EngineOptions

        return EngineOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
