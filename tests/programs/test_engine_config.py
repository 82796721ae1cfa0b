"""EngineConfig plans the catalog by the spec's coverage rules and rejects bad configurations."""

import pytest
from absl import flags

from helios_jax.catalog import Allocation, DecodeMode, GraphKind, shipped_catalog
from helios_jax.engine_config import (
    DECODE_MODES,
    DEFAULT_MAX_MODEL_LEN,
    SPECULATION_MODES,
    EngineConfig,
    default_prefill_chunks,
    parse_int_list,
)
from helios_jax.engine_options import EngineOptions
from helios_jax.model import tiny_config

spec = pytest.mark.spec


def _shapes(graphs, kind):
    return sorted(
        (
            g.batch_capacity,
            g.proposal_depth,
            g.token_capacity,
            g.target_capacity,
            g.allocation.value if g.allocation else None,
            g.prefill_capacity,
            g.speculative,
        )
        for g in graphs
        if g.kind is kind
    )


@spec(
    "speculative-coverage/pow2-buckets",
    "speculative-coverage/rectangular-envelope",
    "speculative-coverage/ragged-envelope",
    "speculative-coverage/width-one-competes",
    "speculative-coverage/token-envelope",
    "mixed-execution/catalog-bounded",
    "mixed-execution/planning-same-catalog",
)
def test_reproduces_the_shipped_synthetic_catalog():
    """Concurrency 16, depths 3 and 7, R = 64, adaptive, mixed prefill: every prefill, speculative,
    and mixed shape of synthetic-h200.json (its extra batch-4 snapshot and vision graph are not
    planned: state operations are captured at B = 1, vision needs a vision recipe)."""
    engine = EngineConfig(
        request_slots=16,
        draft_tokens=7,
        proposal_depths=(3, 7),
        speculative_token_capacity=64,
        mixed_prefill=True,
    )
    planned, shipped = engine.catalog("synthetic-h200").graphs, shipped_catalog().graphs
    for kind in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL, GraphKind.SPECULATIVE, GraphKind.MIXED):
        assert _shapes(planned, kind) == _shapes(shipped, kind), kind
    # The D = 7 programs alone: the same shapes with proposal depth 7 or width one.
    seven = EngineConfig(request_slots=16, draft_tokens=7, speculative_token_capacity=64).catalog()
    want = [s for s in _shapes(shipped, GraphKind.SPECULATIVE) if s[1] in (0, 7)]
    assert _shapes(seven.graphs, GraphKind.SPECULATIVE) == want
    assert ("prefix_limit" in {s[4] for s in want}) and (16, 7, 8, 64, "prefix_limit", 0, False) in want


@spec("speculative-coverage/fixed-host-ragged", "speculative-coverage/device-needs-adaptive")
def test_fixed_speculation_binds_ragged_programs_to_host_lengths():
    fixed = EngineConfig(
        request_slots=16, speculation="fixed", draft_tokens=7, speculative_token_capacity=64
    ).catalog()
    ragged = [g for g in fixed.graphs if g.kind is GraphKind.SPECULATIVE and not g.is_rectangular]
    assert [(g.batch_capacity, g.target_capacity) for g in ragged] == [(16, 64)]
    assert all(
        g.allocation is Allocation.QUERY_LENGTH for g in fixed.graphs if g.kind is GraphKind.SPECULATIVE
    )


@spec("intro/mixed-capture-flag", "mixed-execution/ordinary-capture", "mixed-execution/zero-drafts-ordinary")
def test_ordinary_catalog_and_mixed_flag():
    ordinary = EngineConfig(request_slots=4, speculation="off", draft_tokens=0, max_model_len=1024)
    catalog = ordinary.catalog()
    assert catalog.mode == "ordinary"
    assert _shapes(catalog.graphs, GraphKind.DECODE) == [(b, 0, 1, b, None, 0, False) for b in (1, 2, 4)]
    assert not catalog.of_kind(GraphKind.SPECULATIVE, GraphKind.MIXED)
    assert [g.token_capacity for g in catalog.of_kind(GraphKind.PREFILL)] == [64, 128, 256, 512, 1024]
    mixed = ordinary.replace(mixed_prefill=True).catalog()
    widths = {(g.batch_capacity, g.token_capacity, g.speculative) for g in mixed.of_kind(GraphKind.MIXED)}
    assert widths == {(2, 1, False), (4, 1, False)}
    assert {g.kind for g in catalog.graphs} >= {GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE}
    # A burst of arrivals initializes, and captures its prompt-end anchors, in one program each
    # (RESOLUTIONS.md, 31); restores stay single-row.
    assert sorted(g.batch_capacity for g in catalog.of_kind(GraphKind.INITIALIZE)) == [1, 2, 4]
    assert sorted(g.batch_capacity for g in catalog.of_kind(GraphKind.SNAPSHOT)) == [1, 2, 4]
    assert [g.batch_capacity for g in catalog.of_kind(GraphKind.RESTORE)] == [1]


def test_small_envelope_skips_buckets_a_ragged_program_cannot_hold():
    catalog = EngineConfig(request_slots=8, draft_tokens=3, speculative_token_capacity=4).catalog()
    wide = [
        (g.batch_capacity, g.target_capacity)
        for g in catalog.of_kind(GraphKind.SPECULATIVE)
        if g.token_capacity > 1
    ]
    assert wide == [(1, 4), (2, 4), (4, 4)]  # B = 8 would need P = R = 4 < B
    assert len([g for g in catalog.of_kind(GraphKind.SPECULATIVE) if g.token_capacity == 1]) == 4


def test_derived_sizes():
    e = EngineConfig(request_slots=3, max_model_len=100, page_size=16, snapshot_rows=2, draft_tokens=5)
    assert e.pages_per_row == 7 and e.state_rows == 5 and e.kv_pages == 35
    assert e.prefill_chunks == (64,) and e.padded_concurrency == 4 and e.draft_capacity == 5
    assert default_prefill_chunks(32) == (32,) and default_prefill_chunks(4096)[-1] == 4096
    assert parse_int_list("64, 128") == (64, 128) and parse_int_list([]) is None


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(request_slots=0), "request_slots"),
        (dict(request_slots=65), "request_slots"),
        (dict(speculation="sometimes"), "speculation"),
        (dict(draft_tokens=0), "at least one draft token"),
        (dict(draft_tokens=-1), "draft_tokens"),
        (dict(proposal_depths=(2,)), "must include draft_tokens"),
        (dict(proposal_depths=(5,)), "proposal_depths"),
        (dict(speculation="off", draft_tokens=0, proposal_depths=(1,)), "no proposal depths"),
        (dict(prefill_chunks=()), "at least one chunk"),
        (dict(prefill_chunks=(64, 64)), "repeat"),
        (dict(prefill_chunks=(8192,)), "prefill_chunks"),
        (dict(mixed_prefill=True, prefill_chunks=(100,)), "multiple of 64"),
        (dict(kv_pages=3), "kv_pages"),
        (dict(dtype="float16"), "dtype"),
        (dict(page_size=0), "page_size"),
        (dict(speculative_token_capacity=-1), "speculative_token_capacity"),
        (dict(max_model_len=1.5), "max_model_len"),
    ],
)
def test_rejects_bad_configs(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


def test_speculation_names_map_to_one_decode_mode_each():
    assert {
        name: EngineConfig(speculation=name, **({"draft_tokens": 0} if name == "off" else {})).decode_mode
        for name in SPECULATION_MODES
    } == DECODE_MODES
    assert set(DECODE_MODES.values()) == set(DecodeMode)


def test_options_resolve_against_the_model():
    """Unset --max_model_len: the model's limit, at most 4096; unset --dtype: the model's; a model
    without an MTP head speculates with copy proposals, or decodes ordinarily when learned
    proposals, which it cannot draft, are asked for."""
    long_model = tiny_config(mtp_num_layers=1, max_position_embeddings=40_960, dtype="bfloat16")
    config = EngineOptions().engine_config(long_model)
    assert (config.max_model_len, config.dtype, config.speculation) == (
        DEFAULT_MAX_MODEL_LEN,
        "bfloat16",
        "adaptive",
    )
    short = EngineOptions(dtype="float32").engine_config(
        tiny_config(mtp_num_layers=0, max_position_embeddings=256)
    )
    assert (short.max_model_len, short.dtype, short.speculation, short.proposal_source) == (
        256,
        "float32",
        "adaptive",
        "copy",
    )
    no_mtp = tiny_config(mtp_num_layers=0, max_position_embeddings=256)
    assert EngineOptions(proposal_source="both").engine_config(no_mtp).proposal_source == "copy"
    learned = EngineOptions(proposal_source="learned").engine_config(no_mtp)
    assert (learned.speculation, learned.draft_tokens) == ("off", 0)
    assert EngineOptions(proposal_source="both").engine_config(long_model).proposal_source == "both"
    with pytest.raises(ValueError, match="proposal_source"):
        EngineOptions(proposal_source="mtp")
    with pytest.raises(ValueError, match="proposal_source"):
        EngineConfig(proposal_source="mtp")
    assert EngineOptions(max_model_len=512).engine_config(long_model).max_model_len == 512
    # planning without a model: the config's defaults, but for the options' prefill rows and steps
    assert EngineOptions().engine_config() == EngineConfig(prefill_batch=(1, 4), decode_steps=(1, 4, 8))


def test_one_flag_definition_for_every_command():
    """prepare's flags are the server's engine flags less the scheduler policy; both parse alike."""
    serve_like, prepare_like = flags.FlagValues(), flags.FlagValues()
    EngineOptions.define_flags(serve_like)
    EngineOptions.define_flags(prepare_like, policy=False)
    args = ["x", "--concurrency=8", "--prefill_chunks=64,128", "--proposal_depths=1,3", "--dtype=bfloat16"]
    serve_like(args)
    prepare_like(args)
    assert (
        EngineOptions.from_flags(serve_like)
        == EngineOptions.from_flags(prepare_like)
        == EngineOptions(concurrency=8, prefill_chunks=(64, 128), proposal_depths=(1, 3), dtype="bfloat16")
    )
    assert "scheduler_policy" in serve_like and "scheduler_policy" not in prepare_like
