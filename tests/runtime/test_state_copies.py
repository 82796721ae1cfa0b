"""Snapshot and restore lanes in device terms, preemption continuations, and a rebuilt state's
checkpoints, without a model (``runtime/state_copies.py``, ``runtime/preemption.py``).

Worked geometry (the engine below): 2 request slots, 2 snapshot rows, max_model_len 64, page
size 16: 4 pages per row, 16 pages in all; requests draw from pages 0..7, snapshot row 0 owns
pages 8..11 (state row 2) and row 1 pages 12..15 (state row 3)."""

import types

import pytest

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.executor import RequestInputs
from helios_jax.runtime.preemption import continuation
from helios_jax.runtime.sampling_controls import processor_settings
from helios_jax.runtime.state_copies import CheckpointStats, StateCopies, forget_stored
from helios_jax.scheduler.checkpoints import CheckpointStore, Role
from helios_jax.scheduler.plan import Handle, PlanLane
from helios_jax.scheduler.view import LaneRole

ENGINE = EngineConfig(request_slots=2, speculation="off", draft_tokens=0, max_model_len=64, page_size=16)


def _plan(kind, lanes):
    return types.SimpleNamespace(graph=types.SimpleNamespace(kind=kind, name=kind.value), lanes=tuple(lanes))


def _lane(rid, slot, row, role=LaneRole.PREREQUISITE):
    return PlanLane(Handle(rid, 0), slot, 0, role, snapshot_row=row)


def _store(tokens):
    store = CheckpointStore(ENGINE.snapshot_rows)
    row = store.arm(7, tokens, Role.ANCHOR, 0)
    return store, row


INFO = {
    1: RequestInputs(
        (1,) * 40, (5, 2, 7), temperature=0.5, top_p=0.8, top_k=4, seed=9, coupled=True, logprobs=True
    ),
}


def test_the_geometry_puts_snapshot_rows_after_the_request_pages():
    assert ENGINE.snapshot_rows == 2 and ENGINE.kv_pages == 16 and ENGINE.request_pages == 8
    assert list(ENGINE.snapshot_pages(0)) == [8, 9, 10, 11] and list(ENGINE.snapshot_pages(1)) == [
        12,
        13,
        14,
        15,
    ]
    with pytest.raises(ValueError, match="kv_pages"):
        EngineConfig(request_slots=2, speculation="off", draft_tokens=0, max_model_len=64, kv_pages=8)


def test_a_snapshot_copies_the_checkpoints_pages_with_its_exact_length():
    store, row = _store((3,) * 37)  # 37 tokens: three pages, the last one partial
    (lane,) = StateCopies(ENGINE, store).lanes(_plan(GraphKind.SNAPSHOT, [_lane(1, 1, row)]), INFO)
    held = tuple(ENGINE.snapshot_pages(row))[:3]
    assert (lane.src_row, lane.dst_row, lane.src_pages, lane.dst_pages) == (1, 2 + row, (5, 2, 7), held)
    assert lane.tokens == 37 and lane.settings is None  # the owner's row state is copied whole


def test_a_restore_loads_the_new_requests_settings():
    store, row = _store((3,) * 20)
    (lane,) = StateCopies(ENGINE, store).lanes(_plan(GraphKind.RESTORE, [_lane(1, 0, row)]), INFO)
    assert (lane.src_row, lane.dst_row, lane.dst_pages) == (2 + row, 0, (5, 2))
    assert lane.tokens == 20 and lane.settings == (0.5, 0.8, 4, 9, True, True, None)  # seeded, scored: kept


def test_a_checkpoint_longer_than_the_reservation_is_refused():
    store, row = _store((3,) * 60)
    with pytest.raises(ValueError, match="reserves 3 pages"):
        StateCopies(ENGINE, store).lanes(_plan(GraphKind.RESTORE, [_lane(1, 0, row)]), INFO)


def test_stats_count_restored_tokens_and_snapshots_by_role():
    store, row = _store((3,) * 20)
    stats = CheckpointStats()
    stats.observe(_plan(GraphKind.SNAPSHOT, [_lane(1, 0, row, LaneRole.TERMINAL)]), store)
    stats.observe(_plan(GraphKind.RESTORE, [_lane(1, 0, row)]), store)
    stats.observe(_plan(GraphKind.DECODE, [PlanLane(Handle(1, 0), 0, 0, LaneRole.DECODE)]), store)
    assert stats.snapshots == {"anchor": 1} and stats.restores == 1 and stats.restored_tokens == 20


def test_a_rebuilt_state_forgets_stored_checkpoints_but_not_pinned_ones():
    store = CheckpointStore(2)
    stored = store.arm(1, (1, 2), Role.ANCHOR, 0)
    store.captured(stored, 0)
    restoring = store.arm(2, (1, 2, 3), Role.ANCHOR, 0)
    store.captured(restoring, 0)
    store.pin(restoring, 0)
    assert forget_stored(store) == 1
    assert store.lookup((1, 2, 9)) is None and store.lookup((1, 2, 3, 4)) is not None


def test_a_continuation_is_the_prompt_plus_the_output_with_the_remaining_budget():
    request = GenerationRequest(
        "r", (1, 2, 3), SamplingParams(max_tokens=5, temperature=0.0, prompt_logprobs=True), (2,)
    )
    resumed = continuation(request, [7, 8])
    assert resumed.prompt_tokens == (1, 2, 3, 7, 8) and resumed.sampling.max_tokens == 3
    assert not resumed.sampling.prompt_logprobs and resumed.message_endpoints == (2,)
    assert continuation(request, [7] * 5) is None
    assert resumed.prior_outputs == 2 and processor_settings(resumed, ()) is None


def test_a_penalised_continuation_loads_its_earlier_outputs_as_output_counts():
    sampling = SamplingParams(max_tokens=9, temperature=0.0, frequency_penalty=0.5)
    resumed = continuation(GenerationRequest("r", (1, 2), sampling), [7, 8, 7])
    assert processor_settings(resumed, ()).outputs == (7, 8, 7)
