"""State operations: initialize, snapshot, restore (one row-and-page copy body).

Snapshot at token t, restore into a fresh slot, and continuing there equals continuing the
original uninterrupted: same tokens (sampled, so the PRNG key and sampling settings travel with
the row), same draft confidences (so the MTP draft context travelled too), and the prompt's
length leaves a partial last page, which must be preserved.
"""

import numpy as np
import pytest

from helios_jax.catalog import GraphKind

from .helpers import PAGE_SIZE, RECT, SPECULATIVE_ENGINE, Driver, emitted

spec = pytest.mark.spec
PROMPT = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]  # 13 tokens: 3 pages + 1 token
SNAPSHOT_ROW = SPECULATIVE_ENGINE.request_slots  # the first snapshot row


def _continue(d, slot, rounds=4):
    """Learned speculative rounds (they read the draft context) in lane 0; tokens and sidecars."""
    tokens, confidences = [], []
    for _ in range(rounds):
        out = d.run(RECT, slots=[slot], page_tables=d.tables([slot]), query_lengths=[4])
        tokens.extend(emitted(out, 0))
        confidences.append(np.asarray(out.sidecar)[:, slot])
    return tokens, np.stack(confidences)


@spec(
    "prerequisites/snapshot-preserves",
    "prerequisites/restore-fresh-generation",
    "prerequisites/logical-request-kept",
    "prerequisites/enabling-kinds",
)
def test_snapshot_restore_continues_like_uninterrupted_decoding(spec_programs, params):
    d = Driver(spec_programs, params, seed=3)
    d.initialize(0, temperature=1.0, top_k=20, seed=123, logprobs=True)
    d.prefill(0, PROMPT)
    for _ in range(2):
        d.run(RECT, slots=[0], page_tables=d.tables([0]), query_lengths=[3])
    cursor = d.row(0)["cursor"]
    if cursor % PAGE_SIZE == 0:  # keep the partial-page case
        d.run(RECT, slots=[0], page_tables=d.tables([0]), query_lengths=[1])
        cursor = d.row(0)["cursor"]
    assert cursor % PAGE_SIZE
    used = -(-cursor // PAGE_SIZE)
    d.run(
        _snapshot(d),
        src_rows=[0],
        dst_rows=[SNAPSHOT_ROW],
        src_pages=[d.pages[0][:used]],
        dst_pages=[d.pages[SNAPSHOT_ROW][:used]],
    )
    saved = {
        k: np.array(getattr(d.state, k)[SNAPSHOT_ROW])
        for k in ("cursor", "pending", "rng", "coupled", "last_hidden")
    }
    assert saved["cursor"] == cursor
    # Uninterrupted continuation in slot 0.
    want_tokens, want_conf = _continue(d, 0)
    # A fresh slot (initialized for some other request first) receives the snapshot.
    d.initialize(2, temperature=0.0, seed=999)
    d.run(
        _restore(d),
        src_rows=[SNAPSHOT_ROW],
        dst_rows=[2],
        src_pages=[d.pages[SNAPSHOT_ROW][:used]],
        dst_pages=[d.pages[2][:used]],
    )
    assert d.row(2)["cursor"] == cursor
    np.testing.assert_array_equal(np.asarray(d.state.rng[2]), saved["rng"])
    assert bool(d.state.coupled[2]) == bool(saved["coupled"])
    assert bool(d.state.logprobs[2])  # the log-probability gate's flag travels with the row
    got_tokens, got_conf = _continue(d, 2)
    assert got_tokens == want_tokens
    np.testing.assert_allclose(got_conf, want_conf, atol=1e-6)
    # Snapshot rows are untouched by the continuation.
    assert int(d.state.cursor[SNAPSHOT_ROW]) == cursor


def _snapshot(d):
    return d.programs.find(GraphKind.SNAPSHOT).descriptor


def _restore(d):
    return d.programs.find(GraphKind.RESTORE).descriptor


@spec("prerequisites/snapshot-preserves")
def test_copy_moves_whole_pages_of_both_pools_and_nothing_else(spec_programs, params):
    d = Driver(spec_programs, params, seed=4)
    d.initialize(1)
    d.prefill(1, PROMPT)
    before = {name: np.array(getattr(d.state, name).k) for name in ("target", "draft")}
    src, dst = d.pages[1][:4], d.pages[SNAPSHOT_ROW][:4]
    d.run(_snapshot(d), src_rows=[1], dst_rows=[SNAPSHOT_ROW], src_pages=[src], dst_pages=[dst])
    for name in ("target", "draft"):
        after = np.asarray(getattr(d.state, name).k)
        np.testing.assert_array_equal(after[:, :, dst], before[name][:, :, src])  # NaN tails included
        others = np.setdiff1d(np.arange(after.shape[2]), dst)
        np.testing.assert_array_equal(
            after[:, :, others].view(np.uint32), before[name][:, :, others].view(np.uint32)
        )


def test_initialize_resets_the_row(spec_programs, params):
    d = Driver(spec_programs, params, seed=5)
    d.initialize(3, temperature=0.5, top_p=0.8, top_k=7, seed=42)
    d.prefill(3, PROMPT[:5])
    assert d.row(3)["cursor"] == 5 and d.row(3)["generated"] == 1
    d.initialize(3, temperature=0.0, seed=1)
    assert d.row(3) == dict(cursor=0, pending=0, generated=0)
    assert float(d.state.temperature[3]) == 0.0 and int(d.state.top_k[3]) == 0


@spec("prerequisites/snapshot-preserves")
def test_a_restore_into_another_request_loads_its_settings_at_the_exact_cursor(spec_programs, params):
    """Prefix reuse: a snapshot of the first 8 prompt tokens (the row ran on to 13: the cursor is
    set, not copied), restored into a request with other sampling settings, then the rest of the
    prompt prefilled there, samples what a cold prefill of the whole prompt samples and keeps
    decoding alike; the restored row carries the new request's settings, a key from its seed and
    a zero generated count."""
    from helios_jax.programs.state import key_data

    d = Driver(spec_programs, params, seed=6)
    d.initialize(0, temperature=1.0, top_k=20, seed=123)
    d.prefill(0, PROMPT)
    keep = 8
    pages = -(-keep // PAGE_SIZE)
    d.run(
        _snapshot(d),
        src_rows=[0],
        dst_rows=[SNAPSHOT_ROW],
        src_pages=[d.pages[0][:pages]],
        dst_pages=[d.pages[SNAPSHOT_ROW][:pages]],
        cursors=[keep],
    )
    assert d.row(SNAPSHOT_ROW)["cursor"] == keep
    d.initialize(2, temperature=0.7, seed=5)
    d.run(
        _restore(d),
        src_rows=[SNAPSHOT_ROW],
        dst_rows=[2],
        src_pages=[d.pages[SNAPSHOT_ROW][:pages]],
        dst_pages=[d.pages[2][:pages]],
        cursors=[keep],
        settings=[(0.0, 0.9, 3, 77, True, True)],
    )
    assert d.row(2)["cursor"] == keep and d.row(2)["generated"] == 0
    assert float(d.state.temperature[2]) == 0.0 and int(d.state.top_k[2]) == 3
    assert float(d.state.top_p[2]) == pytest.approx(0.9) and bool(d.state.coupled[2])
    assert bool(d.state.logprobs[2])
    np.testing.assert_array_equal(np.asarray(d.state.rng[2]), np.asarray(key_data(np.uint32(77))))
    restored, _ = d.prefill(2, PROMPT[keep:])
    d.initialize(3, temperature=0.0)
    cold, _ = d.prefill(3, PROMPT)
    assert restored == cold
    assert _continue(d, 2)[0] == _continue(d, 3)[0]


def test_processors_travel_with_a_snapshot_and_a_restore_loads_the_new_requests(spec_programs, params):
    """A snapshot copies the row's processors and output counts; a restore that loads settings
    loads the destination request's processors (dense bias, zero counts) or none at all."""
    from helios_jax.programs.processor_packing import ProcessorSettings

    d = Driver(spec_programs, params, seed=6)
    d.initialize(0, processors=ProcessorSettings(presence_penalty=0.5, logit_bias=((9, 2.0),)))
    d.prefill(0, PROMPT)
    d.run(RECT, slots=[0], page_tables=d.tables([0]), query_lengths=[1])
    pages = -(-len(PROMPT) // PAGE_SIZE)
    copy = dict(src_pages=[d.pages[0][:pages]], dst_pages=[d.pages[SNAPSHOT_ROW][:pages]])
    d.run(_snapshot(d), src_rows=[0], dst_rows=[SNAPSHOT_ROW], **copy)
    p = d.state.processors
    assert bool(p.enabled[SNAPSHOT_ROW]) and float(p.bias[SNAPSHOT_ROW, 9]) == 2.0
    np.testing.assert_array_equal(np.asarray(p.counts[SNAPSHOT_ROW]), np.asarray(p.counts[0]))
    assert int(np.asarray(p.counts[0]).sum()) == d.row(0)["generated"] == 2
    back = dict(src_pages=copy["dst_pages"], dst_pages=[d.pages[2][:pages]])
    loaded = ProcessorSettings(repetition_penalty=1.5, logit_bias=((4, -1.0),), prompt=(4, 40))
    settings = [(0.0, 1.0, 0, 7, False, False, loaded)]
    d.run(_restore(d), src_rows=[SNAPSHOT_ROW], dst_rows=[2], settings=settings, **back)
    p = d.state.processors
    assert bool(p.enabled[2]) and float(p.repetition[2]) == 1.5 and float(p.presence[2]) == 0.0
    assert float(p.bias[2, 4]) == -1.0 and float(p.bias[2, 9]) == 0.0 and not np.asarray(p.counts[2]).any()
    assert int(p.seen[2, 1]) == 1 << (40 - 32) and int(p.seen[2, 0]) == 1 << 4
    d.run(_restore(d), src_rows=[SNAPSHOT_ROW], dst_rows=[2], settings=[settings[0][:6]], **back)
    assert not bool(d.state.processors.enabled[2])
