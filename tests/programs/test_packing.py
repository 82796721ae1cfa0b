"""Host input packing (pure numpy, no compile): offsets, one length upload, masks, role validation."""

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import Allocation, GraphDescriptor, GraphKind
from helios_jax.programs.inputs import MixedInputs, ProgramShape, SpeculativeInputs, input_spec
from helios_jax.programs.packing import (
    InputError,
    pack_decode,
    pack_mixed,
    pack_prefill,
    pack_speculative,
    packed_offsets,
    sampling_mask,
)
from helios_jax.programs.row_packing import pack_copy, pack_initialize

from .helpers import MIXED_W4, RAGGED_DEVICE, RAGGED_HOST, RECT, SPECULATIVE_ENGINE, mixed_graph

spec = pytest.mark.spec
ENGINE = SPECULATIVE_ENGINE
N = ENGINE.pages_per_row


def shape_of(graph) -> ProgramShape:
    return ProgramShape.of(graph, ENGINE)


MIXED = shape_of(MIXED_W4)  # B = 4, W = 4, C = 64, T = 76
TABLES = [[0, 1], [2, 3], [4], [5, 6, 7]]


@spec("verification/input-packed-offsets", "mixed-execution/packed-offsets", "mixed-execution/prompt-upload")
def test_prompt_tokens_land_at_the_prompt_rows_packed_offset():
    prompt = list(range(100, 110))
    inputs = pack_mixed(
        MIXED,
        slots=[3, 0, 2],
        page_tables=TABLES[:3],
        query_lengths=[4, 2, 10],
        prefill_row=2,
        prompt_tokens=prompt,
        prompt_ends=True,
    )
    offsets = packed_offsets(inputs.query_lengths)
    assert offsets.tolist() == [0, 4, 6, 16]  # prefix sums of lengths, independent of slot ids
    assert inputs.tokens.shape == (MIXED.target_capacity,)
    assert (
        inputs.tokens[6:16].tolist() == prompt
        and not inputs.tokens[:6].any()
        and not inputs.tokens[16:].any()
    )
    assert inputs.slots.tolist() == [3, 0, 2, 0] and inputs.active.tolist() == [True, True, True, False]
    assert inputs.prefill_row.dtype == np.int32 and inputs.prefill_row.tolist() == [2]
    # The same population with the prompt first moves the offset, not the tokens' content.
    moved = pack_mixed(
        MIXED,
        slots=[2, 3, 0],
        page_tables=TABLES[:3],
        query_lengths=[10, 4, 2],
        prefill_row=0,
        prompt_tokens=prompt,
        prompt_ends=True,
    )
    assert moved.tokens[:10].tolist() == prompt


@spec(
    "verification/input-one-querylength", "mixed-execution/query-length", "mixed-execution/prefill-row-input"
)
def test_one_query_length_upload_per_frame():
    """Lengths are uploaded once (i32[B]); offsets, positions and context lengths are derived on
    the device. No other input field has the lane shape of a length vector except the lane
    identities (slots, active) and the copy lengths of copy proposals."""
    spec_ = input_spec(MIXED)
    lane_vectors = {
        f.name
        for f in dataclasses.fields(MixedInputs)
        if getattr(spec_, f.name).shape == (MIXED.lanes,) and getattr(spec_, f.name).dtype == np.int32
    }
    assert lane_vectors == {"slots", "query_lengths", "copy_lengths"}
    assert spec_.prefill_row.shape == (1,) and spec_.prefill_row.dtype == np.int32
    decode_only = pack_mixed(MIXED, slots=[1, 2], page_tables=TABLES[:2], query_lengths=[4, 1])
    assert decode_only.prefill_row.tolist() == [-1] and decode_only.query_lengths.tolist() == [4, 1, 0, 0]
    spec_inputs = input_spec(shape_of(RECT))
    assert {f.name for f in dataclasses.fields(SpeculativeInputs)} >= {"lane_rows"}
    assert spec_inputs.lane_rows.shape == (RECT.batch_capacity,)


@spec("verification/input-sampling-masks")
def test_row_sampling_masks():
    assert sampling_mask(MIXED, 3, prefill_row=1, prompt_ends=False).tolist() == [True, False, True, False]
    assert sampling_mask(MIXED, 3, prefill_row=1, prompt_ends=True).tolist() == [True, True, True, False]
    assert sampling_mask(MIXED, 2).tolist() == [True, True, False, False]
    prefill = shape_of(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=16))
    assert sampling_mask(prefill, 1, prompt_ends=False).tolist() == [False]
    assert sampling_mask(prefill, 1, prompt_ends=True).tolist() == [True]


@spec("verification/input-role-validation", "mixed-execution/one-prompt-row", "mixed-execution/max-extent")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(query_lengths=[4, 2, 10], prefill_row=3, prompt_tokens=[1] * 10),
            "outside the dense lane list",
        ),
        (
            dict(query_lengths=[4, 2, 10], prefill_row=-1, prompt_tokens=[1] * 10),
            "outside the dense lane list",
        ),
        (
            dict(query_lengths=[4, 2, 9], prefill_row=2, prompt_tokens=[1] * 10),
            "must equal its 10 prompt tokens",
        ),
        (dict(query_lengths=[4, 2, 65], prefill_row=2, prompt_tokens=[1] * 65), "within 1..64"),
        (
            dict(query_lengths=[5, 2, 10], prefill_row=2, prompt_tokens=[1] * 10),
            "decode row 0: query length 5",
        ),
        (
            dict(query_lengths=[0, 2, 10], prefill_row=2, prompt_tokens=[1] * 10),
            "decode row 0: query length 0",
        ),
        (dict(query_lengths=[4, 2, 10], prompt_tokens=[1] * 10), "prompt tokens without a prompt row"),
    ],
)
def test_mixed_role_validation(kwargs, message):
    with pytest.raises(InputError, match=message):
        pack_mixed(MIXED, slots=[3, 0, 2], page_tables=TABLES[:3], prompt_ends=True, **kwargs)


@spec("verification/input-role-validation", "mixed-execution/max-extent")
def test_mixed_lengths_must_fit_the_packed_extent():
    narrow = ProgramShape.of(mixed_graph(4, 4, 64, True), ENGINE.replace(max_model_len=128))
    assert narrow.target_capacity == 64 + 3 * 4
    pack_mixed(
        narrow,
        slots=[0, 1, 2, 3],
        page_tables=[[]] * 4,
        query_lengths=[64, 4, 4, 4],
        prefill_row=0,
        prompt_tokens=[1] * 64,
    )
    with pytest.raises(InputError, match="exceed the program's batch capacity"):
        pack_mixed(narrow, slots=[0, 1, 2, 3, 4], page_tables=[[]] * 5, query_lengths=[1] * 5)


@spec("verification/input-role-validation")
@pytest.mark.parametrize(
    "slots, message", [([0, 0], "slots repeat"), ([4], "outside 0..3"), ([0, 1, 2], "batch capacity 2")]
)
def test_lane_identities_are_validated(slots, message):
    with pytest.raises(InputError, match=message):
        pack_decode(
            shape_of(GraphDescriptor(GraphKind.DECODE, 2, token_capacity=1, target_capacity=2)),
            slots=slots,
            page_tables=[[0]] * len(slots),
        )


@spec(
    "speculative-coverage/querylength-fits-p",
    "speculative-coverage/prefix-limit-ceilings",
    "speculative-coverage/ceiling-bound",
    "speculative-coverage/ceilings-over-p",
    "speculative-coverage/copy-d",
)
def test_speculative_bindings_and_copy_prefixes():
    host, device = shape_of(RAGGED_HOST), shape_of(RAGGED_DEVICE)  # P = 6 (host), P = 5 (device)
    ok = pack_speculative(host, slots=[0, 1], page_tables=TABLES[:2], query_lengths=[4, 2])
    assert ok.lane_rows.tolist() == [4, 2] and ok.copy_lengths.tolist() == [-1, -1]
    with pytest.raises(InputError, match="sum to 7 > P=6"):
        pack_speculative(host, slots=[0, 1], page_tables=TABLES[:2], query_lengths=[4, 3])
    with pytest.raises(InputError, match="takes query lengths"):
        pack_speculative(host, slots=[0, 1], page_tables=TABLES[:2], ceilings=[4, 3])
    # Ceilings may sum above P; each is bounded by min(D + 1, W).
    over = pack_speculative(device, slots=[0, 1], page_tables=TABLES[:2], ceilings=[4, 4])
    assert over.lane_rows.sum() > device.target_capacity
    with pytest.raises(InputError, match="ceiling 5 outside 1..4"):
        pack_speculative(device, slots=[0, 1], page_tables=TABLES[:2], ceilings=[5, 4])
    with pytest.raises(InputError, match="takes ceilings"):
        pack_speculative(device, slots=[0, 1], page_tables=TABLES[:2], query_lengths=[1, 1])
    copies = pack_speculative(
        host, slots=[0, 1], page_tables=TABLES[:2], query_lengths=[3, 1], copy_proposals=[[7, 8], None]
    )
    assert copies.copy_tokens.tolist() == [[7, 8, 0], [0, 0, 0]] and copies.copy_lengths.tolist() == [2, -1]
    with pytest.raises(InputError, match="copy prefix has 1"):
        pack_speculative(
            host, slots=[0, 1], page_tables=TABLES[:2], query_lengths=[3, 1], copy_proposals=[[7], None]
        )
    with pytest.raises(InputError, match="exceed D=3"):
        pack_speculative(
            host, slots=[0], page_tables=TABLES[:1], query_lengths=[1], copy_proposals=[[1, 2, 3, 4]]
        )


def test_page_tables_pad_with_an_out_of_range_page():
    inputs = pack_prefill(
        shape_of(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=16)),
        slot=2,
        tokens=[1, 2, 3],
        page_table=[9, 4],
        prompt_ends=False,
    )
    assert inputs.page_table.shape == (1, N)
    assert inputs.page_table[0, :2].tolist() == [9, 4] and (inputs.page_table[0, 2:] == ENGINE.kv_pages).all()
    assert inputs.tokens[:3].tolist() == [1, 2, 3] and inputs.length.tolist() == [3]
    with pytest.raises(InputError, match="page ids outside"):
        pack_prefill(
            shape_of(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=16)),
            slot=0,
            tokens=[1],
            page_table=[ENGINE.kv_pages],
            prompt_ends=False,
        )
    with pytest.raises(InputError, match="outside 1..16"):
        pack_prefill(
            shape_of(GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=16)),
            slot=0,
            tokens=list(range(17)),
            page_table=[0],
            prompt_ends=False,
        )


@spec("prerequisites/snapshot-preserves")
def test_copy_roles():
    snap = shape_of(GraphDescriptor(GraphKind.SNAPSHOT, 1))
    row = ENGINE.request_slots  # first snapshot row
    inputs = pack_copy(
        snap, src_rows=[1], dst_rows=[row], src_pages=[[3, 4, 5]], dst_pages=[[10, 11, 12]], role="snapshot"
    )
    assert inputs.page_counts.tolist() == [3]
    with pytest.raises(InputError, match="a snapshot copies a request slot"):
        pack_copy(snap, src_rows=[row], dst_rows=[1], src_pages=[[1]], dst_pages=[[2]], role="snapshot")
    with pytest.raises(InputError, match="a restore copies a snapshot row"):
        pack_copy(snap, src_rows=[1], dst_rows=[2], src_pages=[[1]], dst_pages=[[2]], role="restore")
    with pytest.raises(InputError, match="distinct and disjoint"):
        pack_copy(snap, src_rows=[1], dst_rows=[2], src_pages=[[1, 2]], dst_pages=[[2, 3]])


def test_initialize_validation():
    init = shape_of(GraphDescriptor(GraphKind.INITIALIZE, 1))
    inputs = pack_initialize(init, slots=[2], temperature=[0.5], top_p=[0.9], top_k=[5], seeds=[2**40 + 3])
    assert inputs.seed.dtype == np.uint32 and inputs.seed.tolist() == [3]
    assert inputs.coupled.dtype == bool and not inputs.coupled.any()  # no coupled flags: rejection
    coupled = pack_initialize(
        init, slots=[2], temperature=[0.5], top_p=[0.9], top_k=[5], seeds=[7], coupled=[True]
    )
    assert coupled.coupled.tolist() == [True]
    with pytest.raises(InputError, match="coupled"):
        pack_initialize(init, slots=[2], temperature=[0.5], top_p=[0.9], top_k=[5], seeds=[7], coupled=[])
    for field, value in (("temperature", -1.0), ("top_p", 0.0), ("top_k", -2)):
        kwargs = dict(slots=[0], temperature=[0.0], top_p=[1.0], top_k=[0], seeds=[0])
        kwargs[field] = [value]
        with pytest.raises(InputError, match=field):
            pack_initialize(init, **kwargs)


def test_program_shape_extents():
    assert shape_of(RECT).target_capacity == 8 and shape_of(RECT).allocation is Allocation.QUERY_LENGTH
    assert shape_of(RAGGED_DEVICE).device_allocation
    assert MIXED.target_capacity == MIXED_W4.max_packed_extent == 76 and MIXED.depth == 3
