"""Padding never changes state: inactive lanes, unused rows and unused packed capacity mutate nothing.

The KV pools start as NaN. Each case runs a program with fewer active lanes than its batch
capacity (and, for ragged and mixed programs, fewer target rows than P or the packed extent),
then compares the whole state bitwise with a host copy taken before the call:
  - a KV byte may change only at positions an active lane may write: target positions
    c..c+W-1 (c its cursor; the prompt's chunk for a prompt lane) and draft positions
    c-1..c+D+W-1 (the carried pair, provisional proposals, absorbed pairs), in that lane's pages;
  - rows of inactive slots (and snapshot rows) keep every per-row field, PRNG key included.
A frame with no active lane at all changes no bit of the state.
"""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind

from .helpers import (
    DECODE,
    MIXED_ORDINARY,
    MIXED_W4,
    PREFILLS,
    RAGGED_DEVICE,
    RAGGED_HOST,
    RECT,
    WIDTH_ONE,
    Driver,
    as_bits,
)

spec = pytest.mark.spec
PROMPTS = {0: [1, 2, 3, 4, 5, 6, 7], 1: [9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4]}
ROW_FIELDS = ("cursor", "pending", "last_hidden", "temperature", "top_p", "top_k", "rng", "generated")


def _host_copy(state):
    out = {f: np.array(getattr(state, f)) for f in ROW_FIELDS}
    for name in ("target", "draft"):
        cache = getattr(state, name)
        if cache is not None:
            out[name] = (np.array(cache.k), np.array(cache.v))
    return out


def _assert_only_allowed_changes(before, after, d, writes):
    """writes: {slot: (target positions, draft positions)} an active lane may write."""
    page_size = d.engine.page_size
    for name in ("target", "draft"):
        if name not in before:
            continue
        allowed = np.zeros(before[name][0].shape[2:4], bool)  # [pages, page_size]
        for slot, positions in writes.items():
            for pos in positions[0 if name == "target" else 1]:
                if 0 <= pos < d.engine.max_model_len:
                    allowed[d.pages[slot][pos // page_size], pos % page_size] = True
        for old, new in zip(before[name], after[name]):
            same = (as_bits(old) == as_bits(new)).all(axis=(0, 1, 4))  # [pages, page_size]
            assert np.all(same | allowed), (
                f"{name}: unexpected writes at {np.argwhere(~(same | allowed))[:5]}"
            )
    for field in ROW_FIELDS:
        changed = np.flatnonzero(
            np.any((as_bits(before[field]) != as_bits(after[field])).reshape(len(before[field]), -1), axis=1)
        )
        assert set(changed.tolist()) <= set(writes), f"{field}: rows {changed.tolist()} changed"


def _driver(programs, params):
    d = Driver(programs, params, seed=8)
    for slot, prompt in PROMPTS.items():
        d.initialize(slot, temperature=0.7, seed=slot)
        d.prefill(slot, prompt)
    return d


CASES = {
    # name: (engine fixture, graph, host kwargs, active slots)
    "decode": ("ordinary_programs", DECODE, dict(slots=[1]), [1]),
    "width_one": ("spec_programs", WIDTH_ONE, dict(slots=[0], query_lengths=[1]), [0]),
    "rect_one_lane": ("spec_programs", RECT, dict(slots=[1], query_lengths=[3]), [1]),
    "ragged_device_unused_rows": ("spec_programs", RAGGED_DEVICE, dict(slots=[0], ceilings=[4]), [0]),
    "ragged_host_unused_rows": (
        "spec_programs",
        RAGGED_HOST,
        dict(slots=[1, 0], query_lengths=[2, 1]),
        [1, 0],
    ),
    "mixed_prompt_and_decode": (
        "spec_programs",
        MIXED_W4,
        dict(
            slots=[0, 2],
            query_lengths=[2, 5],
            prefill_row=1,
            prompt_tokens=[5, 4, 3, 2, 1],
            prompt_ends=False,
        ),
        [0, 2],
    ),
    "mixed_ordinary": ("ordinary_programs", MIXED_ORDINARY, dict(slots=[1], query_lengths=[1]), [1]),
}


@spec("mixed-execution/inactive-no-mutation", "useful-service/no-service-waste")
@pytest.mark.parametrize("case", sorted(CASES))
def test_inactive_lanes_and_unused_capacity_write_nothing(request, params, case):
    fixture, graph, host, slots = CASES[case]
    d = _driver(request.getfixturevalue(fixture), params)
    if 2 in slots:
        d.initialize(2)
    cursors = {s: d.row(s)["cursor"] for s in slots}
    before = _host_copy(d.state)
    d.run(graph, page_tables=d.tables(host["slots"]), **host)
    after = _host_copy(d.state)
    width, depth = graph.token_capacity, graph.proposal_depth
    writes = {}
    for i, s in enumerate(slots):
        c = cursors[s]
        span = len(host["prompt_tokens"]) if host.get("prefill_row") == i else width
        writes[s] = (range(c, c + span), range(c - 1, c + depth + span))
    _assert_only_allowed_changes(before, after, d, writes)


@spec("mixed-execution/inactive-no-mutation")
@pytest.mark.parametrize(
    "case", ["decode", "rect", "ragged_device", "mixed", "prefill_empty", "snapshot_empty"]
)
def test_a_frame_without_active_lanes_changes_no_bit(request, params, case):
    programs = request.getfixturevalue("ordinary_programs" if case == "decode" else "spec_programs")
    d = _driver(programs, params)
    before = _host_copy(d.state)
    if case == "decode":
        d.run(DECODE, slots=[], page_tables=[])
    elif case == "rect":
        d.run(RECT, slots=[], page_tables=[], query_lengths=[])
    elif case == "ragged_device":
        d.run(RAGGED_DEVICE, slots=[], page_tables=[], ceilings=[])
    elif case == "mixed":
        d.run(MIXED_W4, slots=[], page_tables=[], query_lengths=[])
    elif case == "snapshot_empty":
        d.run(
            d.programs.find(GraphKind.SNAPSHOT).descriptor,
            src_rows=[],
            dst_rows=[],
            src_pages=[],
            dst_pages=[],
        )
    else:  # a prefill with a zero-length chunk, bypassing the packer (which refuses it)
        program = d.program(PREFILLS[0])
        inputs = program.pack(slot=0, tokens=[1], page_table=d.pages[0], prompt_ends=True)
        d.state, out = program(d.params, d.state, inputs.replace(length=np.zeros(1, np.int32)))
        assert int(out.counts[0]) == 0
    after = _host_copy(d.state)
    for key in before:
        olds, news = (x if isinstance(x, tuple) else (x,) for x in (before[key], after[key]))
        for old, new in zip(olds, news):
            np.testing.assert_array_equal(as_bits(old), as_bits(new), key)
