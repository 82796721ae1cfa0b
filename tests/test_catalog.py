"""Catalog descriptors, shape contracts, JSON round trips and mixed capacity planning."""

import dataclasses
import json
import re

import pytest

from helios_jax.catalog import (
    Allocation,
    Catalog,
    DecodeMode,
    GraphDescriptor,
    GraphKind,
    MixedShape,
    batch_buckets,
    mixed_shapes,
    shipped_catalog,
    validate,
    wider_prompt_bucket,
)

spec = pytest.mark.spec
R = 64


def check(**fields):
    validate(GraphDescriptor(**fields), speculative_token_capacity=R)


@spec("intro/native-catalog-kinds")
def test_every_kind_the_spec_names_loads():
    kinds = {g.kind for g in shipped_catalog().graphs} | {
        g.kind for g in shipped_catalog("synthetic-h200-ordinary").graphs
    }
    assert kinds == set(GraphKind)


@spec(
    "speculative-coverage/bdwp-identity",
    "speculative-coverage/wp-not-imply-d",
    "duration-estimates/cost-key",
    "duration-estimates/no-relabel",
)
def test_speculative_identity_is_all_four_extents():
    a = GraphDescriptor(
        GraphKind.SPECULATIVE,
        4,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=16,
        allocation=Allocation.QUERY_LENGTH,
    )
    deeper = dataclasses.replace(a, proposal_depth=7)  # same W and P, a deeper producer
    assert a.key != deeper.key
    check(**{f.name: getattr(deeper, f.name) for f in dataclasses.fields(deeper)})
    assert {a.key.batch_capacity, a.key.proposal_depth, a.key.token_capacity, a.key.target_capacity} == {
        4,
        3,
        16,
    }


@spec("speculative-coverage/extents-explicit")
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("field", ["batch_capacity", "token_capacity", "proposal_depth", "target_capacity"])
def test_a_speculative_entry_declares_all_four_extents(width, field):
    """Loading refuses a speculative entry that leaves out B, W, D or P, naming the graph and the
    field; even width one's D = 0 is declared, never defaulted."""
    obj = shipped_catalog().to_json()
    entry = next(
        g
        for g in obj["graphs"]
        if g["kind"] == "speculative" and g["batch_capacity"] == 2 and g["token_capacity"] == width
    )
    assert {"batch_capacity", "token_capacity", "proposal_depth", "target_capacity"} <= set(entry)
    shown = {
        f: ("?" if f == field else entry[f])
        for f in ("batch_capacity", "token_capacity", "proposal_depth", "target_capacity")
    }
    name = (
        f"speculative[B={shown['batch_capacity']},W={shown['token_capacity']},"
        f"D={shown['proposal_depth']},C=0,P={shown['target_capacity']}]"
    )
    del entry[field]
    with pytest.raises(ValueError, match=rf"graph {re.escape(name)}: field '{field}': .*all four extents"):
        Catalog.from_json(obj)


@spec("speculative-coverage/extents-explicit")
def test_saved_catalogs_declare_every_speculative_extent(tmp_path):
    width_one = GraphDescriptor(
        GraphKind.SPECULATIVE,
        2,
        token_capacity=1,
        proposal_depth=0,
        target_capacity=2,
        allocation=Allocation.QUERY_LENGTH,
    )
    cat = Catalog("w1", "speculative", 8, 2, (width_one,))
    cat.save(tmp_path / "w1.json")
    entry = json.loads((tmp_path / "w1.json").read_text())["graphs"][0]
    assert (
        entry["batch_capacity"],
        entry["token_capacity"],
        entry["proposal_depth"],
        entry["target_capacity"],
    ) == (2, 1, 0, 2)
    assert Catalog.load(tmp_path / "w1.json") == cat


@spec(
    "speculative-coverage/rectangular-p",
    "speculative-coverage/rectangular-envelope",
    "speculative-coverage/ragged-envelope",
    "speculative-coverage/token-envelope",
)
@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(batch_capacity=16, token_capacity=8, proposal_depth=7, target_capacity=128), "target_capacity"),
        (
            dict(
                batch_capacity=16,
                token_capacity=8,
                proposal_depth=7,
                target_capacity=65,
                allocation=Allocation.PREFIX_LIMIT,
            ),
            "target_capacity",
        ),
        (dict(batch_capacity=4, token_capacity=4, proposal_depth=3, target_capacity=3), "target_capacity"),
    ],
)
def test_envelope_violations_name_graph_and_field(fields, field):
    fields.setdefault("allocation", Allocation.QUERY_LENGTH)
    with pytest.raises(ValueError, match=rf"graph speculative\[B=.*field '{field}'"):
        check(kind=GraphKind.SPECULATIVE, **fields)


@spec("speculative-coverage/width-one-d-zero", "speculative-coverage/pow2-buckets")
def test_width_one_and_pow2_contracts():
    with pytest.raises(ValueError, match="proposal_depth"):
        check(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=2,
            token_capacity=1,
            proposal_depth=1,
            target_capacity=2,
            allocation=Allocation.QUERY_LENGTH,
        )
    with pytest.raises(ValueError, match="batch_capacity"):
        check(kind=GraphKind.DECODE, batch_capacity=3, token_capacity=1)
    # width one is exempt from the envelope: B=64 width-one programs need no R
    validate(
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            64,
            token_capacity=1,
            target_capacity=64,
            allocation=Allocation.QUERY_LENGTH,
        ),
        speculative_token_capacity=0,
    )


@spec(
    "mixed-execution/batch-range",
    "mixed-execution/width-range",
    "mixed-execution/prompt-aligned",
    "mixed-execution/others-zero",
    "mixed-execution/prompt-ge-width",
    "mixed-execution/max-extent",
    "mixed-execution/declared-capacities",
)
@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(batch_capacity=1, token_capacity=1, prefill_capacity=64), "batch_capacity"),
        (dict(batch_capacity=128, token_capacity=1, prefill_capacity=64), "batch_capacity"),
        (dict(batch_capacity=6, token_capacity=1, prefill_capacity=64), "batch_capacity"),
        (
            dict(batch_capacity=2, token_capacity=9, proposal_depth=8, prefill_capacity=64, speculative=True),
            "token_capacity",
        ),
        (dict(batch_capacity=2, token_capacity=1, prefill_capacity=96), "prefill_capacity"),
        (dict(batch_capacity=2, token_capacity=1, prefill_capacity=0), "prefill_capacity"),
        (
            dict(batch_capacity=2, token_capacity=1, prefill_capacity=64, target_capacity=64),
            "target_capacity",
        ),
    ],
)
def test_mixed_contracts(fields, field):
    fields.setdefault(
        "target_capacity",
        fields.get("prefill_capacity", 0) + (fields["batch_capacity"] - 1) * fields["token_capacity"],
    )
    with pytest.raises(ValueError, match=rf"graph mixed\[.*field '{field}'"):
        check(kind=GraphKind.MIXED, **fields)


@spec("mixed-execution/others-zero")
def test_prefill_capacity_is_zero_outside_mixed():
    with pytest.raises(ValueError, match="prefill_capacity"):
        check(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, prefill_capacity=64)


@spec("mixed-execution/width-range")
def test_completion_token_capacity_defaults_to_eight_and_can_be_declared():
    g = GraphDescriptor(
        GraphKind.MIXED,
        2,
        token_capacity=8,
        proposal_depth=7,
        prefill_capacity=64,
        target_capacity=72,
        speculative=True,
    )
    validate(g, speculative_token_capacity=R)
    with pytest.raises(ValueError, match="token_capacity"):
        validate(g, speculative_token_capacity=R, completion_token_capacity=4)


@spec(
    "speculative-coverage/device-needs-adaptive",
    "speculative-coverage/fixed-host-ragged",
    "mixed-execution/variant-matches-mode",
    "mixed-execution/fixed-width-shared",
    "speculative-coverage/load-reduce-existing",
    "mixed-execution/zero-drafts-ordinary",
)
def test_decode_mode_restricts_eligible_programs():
    cat = shipped_catalog()
    adaptive = cat.eligible(DecodeMode.ADAPTIVE)
    fixed = cat.eligible(DecodeMode.FIXED, fixed_width=8)
    assert any(g.allocation is Allocation.PREFIX_LIMIT for g in adaptive)
    assert not any(g.allocation is Allocation.PREFIX_LIMIT for g in fixed)
    assert {g.token_capacity for g in fixed if g.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED)} == {8}
    with pytest.raises(ValueError, match="fixed width 5"):
        cat.eligible(DecodeMode.FIXED, fixed_width=5)  # load-time selection cannot invent a shape
    with pytest.raises(ValueError, match="ordinary catalog"):
        cat.eligible(DecodeMode.ORDINARY)
    ordinary = shipped_catalog("synthetic-h200-ordinary").eligible(DecodeMode.ORDINARY)
    assert not any(g.speculative or g.kind is GraphKind.SPECULATIVE for g in ordinary)


def test_json_round_trip(tmp_path):
    cat = shipped_catalog()
    path = tmp_path / "c.json"
    cat.save(path)
    again = Catalog.load(path)
    assert again == cat
    assert json.loads(path.read_text())["graphs"][0]["duration_ms"] == cat.graphs[0].duration_ms


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.pop("graphs"), "missing field 'graphs'"),
        (lambda c: c["graphs"].append({"kind": "teleport", "batch_capacity": 1}), "unknown kind"),
        (lambda c: c["graphs"].append(dict(c["graphs"][0])), "listed twice"),
        (lambda c: c["graphs"][0].update(duration_ms=-1), "duration_ms"),
        (lambda c: c["graphs"][0].update(colour="red"), "unknown fields"),
        (lambda c: c.update(mode="warp"), "mode"),
    ],
)
def test_malformed_catalogs_are_rejected(mutate, message):
    obj = shipped_catalog().to_json()
    mutate(obj)
    with pytest.raises(ValueError, match=message):
        Catalog.from_json(obj)


@spec("duration-estimates/one-field")
def test_descriptor_has_no_trusted_estimate():
    names = {f.name for f in dataclasses.fields(GraphDescriptor)}
    assert "estimated_duration_ns" not in names  # the single estimate lives in the cost model
    assert "duration_ms" in names


def test_batch_buckets_pad_concurrency():
    assert batch_buckets(5) == [1, 2, 4, 8]
    assert batch_buckets(4, minimum=2) == [2, 4]


@spec("mixed-execution/wider-bucket-choice")
def test_wider_prompt_bucket_balances_multiplicative_distance():
    assert wider_prompt_bucket([64, 128, 256, 512, 1024, 2048, 4096]) == 512
    assert wider_prompt_bucket([64, 128, 256, 512, 1024, 2048]) == 256  # tie 256/512 -> smaller


@spec(
    "mixed-execution/catalog-bounded",
    "mixed-execution/width-one-all-prompts",
    "mixed-execution/wider-one-prompt",
    "mixed-execution/limits-split",
    "mixed-execution/spec-capture",
    "mixed-execution/ordinary-capture",
    "mixed-execution/planning-same-catalog",
)
def test_mixed_shapes_reproduce_the_shipped_catalog():
    buckets = [64, 128, 256, 512, 1024, 2048, 4096]
    spec_shapes = mixed_shapes(
        concurrency=16,
        prompt_buckets=buckets,
        speculative=True,
        wider_widths=[4, 8],
        speculative_token_capacity=64,
    )
    shipped = shipped_catalog().of_kind(GraphKind.MIXED)
    assert sorted(s.descriptor().key for s in spec_shapes) == sorted(g.key for g in shipped)
    ordinary = mixed_shapes(concurrency=16, prompt_buckets=buckets, speculative=False)
    assert sorted((s.batch_capacity, s.prefill_capacity) for s in ordinary) == sorted(
        (g.batch_capacity, g.prefill_capacity)
        for g in shipped_catalog("synthetic-h200-ordinary").of_kind(GraphKind.MIXED)
    )
    assert all(s.token_capacity == 1 and not s.speculative for s in ordinary)


@spec("mixed-execution/qwen-counts")
def test_spec_worked_example_counts():
    """Concurrency 4, 4096-token chunks, five drafts, token capacity six: 22 and 20.

    The counts follow from ten prompt buckets per batch bucket (powers of two 8..4096) and the
    rectangular widths 2 and 3 at batch two (B*W <= 6). Buckets 8, 16 and 32 break the 64-token
    prompt alignment, so a catalog built under the spec's alignment rule has 16 and 14 graphs;
    docs/catalog.md records the difference.
    """
    ten = [8 << i for i in range(10)]
    kwargs = dict(concurrency=4, prompt_buckets=ten, wider_widths=range(2, 7), speculative_token_capacity=6)
    assert len(mixed_shapes(speculative=True, **kwargs)) == 22
    assert len(mixed_shapes(speculative=False, **kwargs)) == 20
    aligned = dict(kwargs, prompt_buckets=[64 << i for i in range(7)])
    assert len(mixed_shapes(speculative=True, **aligned)) == 16
    assert len(mixed_shapes(speculative=False, **aligned)) == 14
    with pytest.raises(ValueError, match="prefill_capacity"):
        validate(MixedShape(2, 1, 8, True).descriptor(), speculative_token_capacity=6)


@spec("mixed-execution/state-row-width")
def test_state_rows_cover_widest_verification():
    assert shipped_catalog().max_verification_width == 8
    assert shipped_catalog("synthetic-h200-ordinary").max_verification_width == 1


def _widths_catalog(separate_width, mixed_width):
    """A speculative catalog whose separate and mixed generation graphs differ in width."""
    graphs = [
        GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=64),
        GraphDescriptor(
            GraphKind.SPECULATIVE, 1, token_capacity=1, target_capacity=1, allocation=Allocation.QUERY_LENGTH
        ),
        GraphDescriptor(
            GraphKind.SPECULATIVE,
            1,
            token_capacity=separate_width,
            proposal_depth=separate_width - 1,
            target_capacity=separate_width,
            allocation=Allocation.QUERY_LENGTH,
        ),
        MixedShape(2, mixed_width, 64, True).descriptor(),
    ]
    return Catalog("widths", "speculative", 64, 4, tuple(graphs))


@spec("mixed-execution/state-row-width")
@pytest.mark.parametrize("separate_width, mixed_width", [(4, 8), (8, 4)])
def test_state_reservation_covers_the_widest_separate_or_mixed_verification(separate_width, mixed_width):
    """Whichever family verifies wider, the reservation covers it: verification width 8, and a
    request's pages hold its prompt and output plus the 7 draft rows of that widest round
    (100 + 44 + 7 = 151 tokens: 10 pages of 16, where 144 tokens fit in 9)."""
    from helios_jax.scheduler.core import Scheduler

    cat = _widths_catalog(separate_width, mixed_width)
    assert cat.max_verification_width == 8 and cat.max_proposal_depth == 7
    s = Scheduler(cat, page_size=16)
    assert s.draft_storage == 7
    assert len(s.page_table(s.admit([1] * 100, max_output=44))) == 10


@spec("mixed-execution/headroom-extent", "mixed-execution/max-extent")
def test_the_catalogs_maximum_packed_extent():
    """What capture headroom reserves for: the most target tokens one program packs. Shipped
    catalogs: mixed B=16 with a 4096-token prompt and 15 decode rows, 4096 + 15*1 = 4111, above
    the 4096-token prefill chunk; without mixed graphs the chunk is the largest."""
    spec = shipped_catalog()
    by_name = {g.name: g for g in spec.graphs}
    assert by_name["prefill[B=1,W=4096,D=0,C=0,P=0]"].packed_extent == 4096
    assert by_name["speculative[B=16,W=8,D=7,C=0,P=64]"].packed_extent == 64  # P, not B*W = 128
    assert by_name["mixed[B=2,W=8,D=7,C=512,P=520]"].packed_extent == 512 + 8
    assert by_name["snapshot[B=4,W=0,D=0,C=0,P=0]"].packed_extent == 0
    ordinary = shipped_catalog("synthetic-h200-ordinary")
    assert (
        next(
            g for g in ordinary.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == 16
        ).packed_extent
        == 16
    )
    for cat in (spec, ordinary):
        assert cat.max_packed_extent == 4111
        no_mixed = dataclasses.replace(
            cat, graphs=tuple(g for g in cat.graphs if g.kind is not GraphKind.MIXED)
        )
        assert no_mixed.max_packed_extent == 4096


# A catalog file written by hand, and the descriptors it means (built directly, not through the loader).
HAND_WRITTEN = {
    "name": "hand",
    "mode": "speculative",
    "speculative_token_capacity": 16,
    "request_slots": 4,
    "completion_token_capacity": 4,
    "description": "written by hand",
    "graphs": [
        {"kind": "prefill", "batch_capacity": 1, "token_capacity": 64, "duration_ms": 5},
        {"kind": "decode", "batch_capacity": 2, "token_capacity": 1},
        {
            "kind": "decode",
            "batch_capacity": 4,
            "token_capacity": 1,
            "target_capacity": 0,
            "duration_ms": None,
        },
        {
            "kind": "speculative",
            "batch_capacity": 2,
            "token_capacity": 4,
            "proposal_depth": 3,
            "target_capacity": 8,
        },
        {
            "kind": "speculative",
            "batch_capacity": 4,
            "token_capacity": 4,
            "proposal_depth": 3,
            "target_capacity": 8,
            "allocation": "prefix_limit",
            "duration_ms": 4.5,
        },
        {
            "kind": "mixed",
            "batch_capacity": 2,
            "token_capacity": 4,
            "proposal_depth": 3,
            "prefill_capacity": 64,
            "speculative": True,
        },
        {"kind": "vision", "batch_capacity": 1, "image_capacity": 2},
        {"kind": "snapshot", "batch_capacity": 1, "duration_ms": 0.25},
    ],
}
HAND_MEANT = (
    GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=64, duration_ms=5.0),
    GraphDescriptor(GraphKind.DECODE, 2, token_capacity=1, target_capacity=2),  # P defaults to B
    GraphDescriptor(GraphKind.DECODE, 4, token_capacity=1, target_capacity=0),
    GraphDescriptor(
        GraphKind.SPECULATIVE,
        2,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=8,
        allocation=Allocation.QUERY_LENGTH,
    ),  # host allocation unless declared
    GraphDescriptor(
        GraphKind.SPECULATIVE,
        4,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=8,
        allocation=Allocation.PREFIX_LIMIT,
        duration_ms=4.5,
    ),
    GraphDescriptor(
        GraphKind.MIXED,
        2,
        token_capacity=4,
        proposal_depth=3,
        prefill_capacity=64,
        target_capacity=68,
        speculative=True,
    ),  # P defaults to the maximum packed extent
    GraphDescriptor(GraphKind.VISION, 1, image_capacity=2),
    GraphDescriptor(GraphKind.SNAPSHOT, 1, duration_ms=0.25),
)


@spec("mixed-execution/max-extent", "mixed-execution/declared-capacities")
def test_a_hand_written_catalog_loads_as_written():
    cat = Catalog.from_json(HAND_WRITTEN)
    assert (cat.name, cat.mode, cat.speculative_token_capacity, cat.request_slots) == (
        "hand",
        "speculative",
        16,
        4,
    )
    assert (cat.completion_token_capacity, cat.description) == (4, "written by hand")
    assert cat.graphs == HAND_MEANT
    assert [type(g.duration_ms) for g in cat.graphs] == [
        float,
        type(None),
        type(None),
        type(None),
        float,
        type(None),
        type(None),
        float,
    ]
    # Optional catalog fields take their defaults.
    bare = {k: v for k, v in HAND_WRITTEN.items() if k not in ("completion_token_capacity", "description")}
    bare["graphs"] = [g for g in HAND_WRITTEN["graphs"] if g["kind"] != "mixed"]
    cat = Catalog.from_json(bare)
    assert (cat.completion_token_capacity, cat.description) == (8, "")


def test_a_catalog_writes_what_it_was_given(tmp_path):
    cat = Catalog(
        "hand", "speculative", 16, 4, HAND_MEANT, completion_token_capacity=4, description="written by hand"
    )
    out = cat.to_json()
    assert {k: v for k, v in out.items() if k != "graphs"} == {
        "name": "hand",
        "mode": "speculative",
        "speculative_token_capacity": 16,
        "request_slots": 4,
        "description": "written by hand",
        "completion_token_capacity": 4,
    }
    assert out["graphs"][3] == {
        "kind": "speculative",
        "batch_capacity": 2,
        "token_capacity": 4,
        "proposal_depth": 3,
        "target_capacity": 8,
        "allocation": "query_length",
    }
    assert out["graphs"][5] == {
        "kind": "mixed",
        "batch_capacity": 2,
        "token_capacity": 4,
        "proposal_depth": 3,
        "target_capacity": 68,
        "prefill_capacity": 64,
        "speculative": True,
    }
    assert out["graphs"][7] == {"kind": "snapshot", "batch_capacity": 1, "duration_ms": 0.25}
    path = tmp_path / "hand.json"
    cat.save(path)
    assert Catalog.load(path) == cat
    # Defaults are left out of the file.
    plain = Catalog("plain", "speculative", 16, 4, HAND_MEANT[:2]).to_json()
    assert "completion_token_capacity" not in plain and "description" not in plain


@pytest.mark.parametrize(
    "entry, field",
    [
        ({"kind": "decode"}, "batch_capacity"),
        ({"batch_capacity": 1}, "kind"),
        ({"kind": "mixed", "batch_capacity": 2, "prefill_capacity": 64}, "token_capacity"),
        ({"kind": "mixed", "batch_capacity": 2, "token_capacity": 1}, "prefill_capacity"),
        (
            {
                "kind": "speculative",
                "batch_capacity": 2,
                "token_capacity": 1,
                "proposal_depth": 0,
                "target_capacity": 2,
                "allocation": "psychic",
            },
            "allocation",
        ),
    ],
)
def test_incomplete_entries_are_value_errors_naming_the_field(entry, field):
    obj = dict(HAND_WRITTEN, graphs=[entry])
    with pytest.raises(ValueError, match=field):
        Catalog.from_json(obj)


def test_unvalidated_descriptors_derive_their_defaults_from_what_is_declared():
    from helios_jax.catalog import descriptor_from_json

    no_width = descriptor_from_json({"kind": "mixed", "batch_capacity": 4, "prefill_capacity": 64})
    no_prompt = descriptor_from_json({"kind": "mixed", "batch_capacity": 4, "token_capacity": 2})
    assert no_width.target_capacity == no_width.max_packed_extent == 64
    assert no_prompt.target_capacity == no_prompt.max_packed_extent == 6
    declared = descriptor_from_json(
        {"kind": "mixed", "batch_capacity": 4, "token_capacity": 2, "target_capacity": 9}
    )
    assert declared.target_capacity == 9  # declared, never overwritten (validation rejects it)


def test_batch_buckets_start_at_one_request():
    assert batch_buckets(1) == [1]
    assert batch_buckets(64, minimum=2) == [2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError):
        batch_buckets(0)


@spec(
    "mixed-execution/variant-matches-mode",
    "mixed-execution/adaptive-width-one-draft",
    "mixed-execution/spec-capture",
    "mixed-execution/ordinary-capture",
    "mixed-execution/batch-range",
    "mixed-execution/prompt-ge-width",
)
def test_mixed_shapes_flags_bounds_and_duplicates():
    kwargs = dict(prompt_buckets=[64, 512], wider_widths=[1, 2, 4], speculative_token_capacity=512)
    spec_shapes = mixed_shapes(concurrency=100, speculative=True, **kwargs)
    # Every graph of a speculative capture maintains draft state, width one included.
    assert all(s.speculative and s.descriptor().speculative is True for s in spec_shapes)
    assert not any(
        s.speculative or s.descriptor().speculative
        for s in mixed_shapes(concurrency=100, speculative=False, **kwargs)
    )
    # Batch buckets 2..64 (concurrency 100 pads to 128, beyond the mixed range).
    assert sorted({s.batch_capacity for s in spec_shapes}) == [2, 4, 8, 16, 32, 64]
    # Width one is listed once per prompt bucket even when the wider widths name it.
    assert len(set(spec_shapes)) == len(spec_shapes)
    assert sum(s.token_capacity == 1 for s in spec_shapes) == 6 * 2
    # A wider width equal to the prompt bucket fits (prompt capacity >= decode width).
    tiny = mixed_shapes(
        concurrency=2, prompt_buckets=[8], speculative=True, wider_widths=[8], speculative_token_capacity=16
    )
    assert MixedShape(2, 8, 8, True) in tiny
    assert MixedShape(2, 8, 8, True).descriptor() == GraphDescriptor(
        GraphKind.MIXED,
        2,
        token_capacity=8,
        proposal_depth=7,
        target_capacity=16,
        prefill_capacity=8,
        speculative=True,
    )


# Each contract at its boundary: the last legal value passes, the first illegal one names its field.
LEGAL = [
    dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=1),  # a one-token chunk
    dict(kind=GraphKind.DECODE, batch_capacity=64, token_capacity=1, target_capacity=64),
    dict(
        kind=GraphKind.SPECULATIVE,
        batch_capacity=4,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=16,
        allocation=Allocation.QUERY_LENGTH,
    ),
    dict(
        kind=GraphKind.SPECULATIVE,
        batch_capacity=32,
        token_capacity=2,
        proposal_depth=1,
        target_capacity=64,
        allocation=Allocation.QUERY_LENGTH,
    ),  # rectangular B*W = R exactly
    dict(
        kind=GraphKind.SPECULATIVE,
        batch_capacity=64,
        token_capacity=2,
        proposal_depth=1,
        target_capacity=64,
        allocation=Allocation.PREFIX_LIMIT,
    ),  # ragged P = R exactly
    dict(kind=GraphKind.MIXED, batch_capacity=64, token_capacity=1, prefill_capacity=64, target_capacity=127),
    dict(
        kind=GraphKind.MIXED,
        batch_capacity=2,
        token_capacity=2,
        proposal_depth=1,
        prefill_capacity=64,
        target_capacity=66,
        speculative=True,
    ),
    dict(kind=GraphKind.VISION, batch_capacity=1, image_capacity=1),
    dict(kind=GraphKind.SNAPSHOT, batch_capacity=64),
    dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, duration_ms=1e-9),
]


@spec(
    "mixed-execution/batch-range",
    "speculative-coverage/rectangular-envelope",
    "speculative-coverage/ragged-envelope",
)
@pytest.mark.parametrize("fields", LEGAL)
def test_boundary_descriptors_are_legal(fields):
    check(**fields)


ILLEGAL = [
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=-1),
        "token_capacity",
        "nonnegative integer",
    ),
    (
        dict(kind=GraphKind.VISION, batch_capacity=1, image_capacity=-1),
        "image_capacity",
        "nonnegative integer",
    ),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64.0),
        "token_capacity",
        "nonnegative integer",
    ),
    (dict(kind=GraphKind.SNAPSHOT, batch_capacity=True), "batch_capacity", "nonnegative integer"),
    (dict(kind=GraphKind.SNAPSHOT, batch_capacity=0), "batch_capacity", "at least 1"),
    (dict(kind=GraphKind.SNAPSHOT, batch_capacity=65), "batch_capacity", "request-slot bound"),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, duration_ms=0.0),
        "duration_ms",
        "positive",
    ),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, duration_ms=float("inf")),
        "duration_ms",
        "finite",
    ),
    (dict(kind=GraphKind.SCORED_PREFILL, batch_capacity=2, token_capacity=64), "batch_capacity", "B = 1"),
    (dict(kind=GraphKind.PREFILL, batch_capacity=3, token_capacity=64), "batch_capacity", "power of two"),
    (dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=0), "token_capacity", "positive chunk"),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, target_capacity=64),
        "proposal_depth",
        "no proposals",
    ),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, proposal_depth=1),
        "proposal_depth",
        "no proposals",
    ),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, speculative=True),
        "speculative",
        "mixed",
    ),
    (
        dict(kind=GraphKind.PREFILL, batch_capacity=1, token_capacity=64, allocation=Allocation.QUERY_LENGTH),
        "allocation",
        "only speculative",
    ),
    (dict(kind=GraphKind.SNAPSHOT, batch_capacity=1, image_capacity=1), "image_capacity", "only vision"),
    (dict(kind=GraphKind.DECODE, batch_capacity=2, token_capacity=2), "token_capacity", "width one"),
    (
        dict(kind=GraphKind.DECODE, batch_capacity=2, token_capacity=1, proposal_depth=1, target_capacity=2),
        "proposal_depth",
        "no proposals",
    ),
    (
        dict(kind=GraphKind.DECODE, batch_capacity=2, token_capacity=1, target_capacity=3),
        "proposal_depth",
        "no proposals",
    ),
    (dict(kind=GraphKind.VISION, batch_capacity=1), "image_capacity", "positive image capacity"),
    (dict(kind=GraphKind.SNAPSHOT, batch_capacity=1, token_capacity=1), "token_capacity", "only a batch"),
    (dict(kind=GraphKind.RESTORE, batch_capacity=1, proposal_depth=1), "token_capacity", "only a batch"),
    (dict(kind=GraphKind.INITIALIZE, batch_capacity=1, target_capacity=1), "token_capacity", "only a batch"),
    (
        dict(kind=GraphKind.SPECULATIVE, batch_capacity=2, token_capacity=1, target_capacity=2),
        "allocation",
        "binds query_length or prefix_limit",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=2,
            token_capacity=0,
            target_capacity=2,
            allocation=Allocation.QUERY_LENGTH,
        ),
        "token_capacity",
        "at least 1",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=2,
            token_capacity=4,
            proposal_depth=2,
            target_capacity=8,
            allocation=Allocation.QUERY_LENGTH,
        ),
        "token_capacity",
        "needs at least 3 proposals",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=2,
            token_capacity=2,
            proposal_depth=1,
            target_capacity=5,
            allocation=Allocation.QUERY_LENGTH,
        ),
        "target_capacity",
        r"\[B, B\*W\]",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=64,
            token_capacity=2,
            proposal_depth=1,
            target_capacity=128,
            allocation=Allocation.QUERY_LENGTH,
        ),
        "target_capacity",
        "rectangular B\\*W=128 exceeds",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=64,
            token_capacity=2,
            proposal_depth=1,
            target_capacity=65,
            allocation=Allocation.QUERY_LENGTH,
        ),
        "target_capacity",
        "ragged P=65 exceeds",
    ),
    (
        dict(
            kind=GraphKind.SPECULATIVE,
            batch_capacity=2,
            token_capacity=1,
            target_capacity=2,
            allocation=Allocation.PREFIX_LIMIT,
        ),
        "allocation",
        "needs proposals to rank",
    ),
    (
        dict(
            kind=GraphKind.MIXED, batch_capacity=1, token_capacity=1, prefill_capacity=64, target_capacity=64
        ),
        "batch_capacity",
        "from 2 through 64",
    ),
    (
        dict(kind=GraphKind.MIXED, batch_capacity=2, token_capacity=1, prefill_capacity=0, target_capacity=1),
        "prefill_capacity",
        "positive and aligned",
    ),
    (
        dict(
            kind=GraphKind.MIXED,
            batch_capacity=2,
            token_capacity=1,
            proposal_depth=1,
            prefill_capacity=64,
            target_capacity=65,
        ),
        "proposal_depth",
        "width-one graphs have D = 0",
    ),
    (
        dict(
            kind=GraphKind.MIXED,
            batch_capacity=2,
            token_capacity=2,
            proposal_depth=1,
            prefill_capacity=64,
            target_capacity=66,
        ),
        "speculative",
        "verify proposals",
    ),
    (
        dict(
            kind=GraphKind.MIXED,
            batch_capacity=2,
            token_capacity=3,
            proposal_depth=1,
            prefill_capacity=64,
            target_capacity=67,
            speculative=True,
        ),
        "token_capacity",
        "needs at least 2 proposals",
    ),
    (
        dict(
            kind=GraphKind.MIXED,
            batch_capacity=32,
            token_capacity=4,
            proposal_depth=3,
            prefill_capacity=64,
            target_capacity=188,
            speculative=True,
        ),
        "token_capacity",
        "B\\*W=128 exceeds the token envelope",
    ),
]


@spec(
    "speculative-coverage/width-one-d-zero",
    "speculative-coverage/rectangular-p",
    "speculative-coverage/rectangular-envelope",
    "speculative-coverage/ragged-envelope",
    "speculative-coverage/device-needs-adaptive",
    "mixed-execution/batch-range",
    "mixed-execution/prompt-aligned",
    "mixed-execution/others-zero",
    "mixed-execution/width-range",
)
@pytest.mark.parametrize("fields, field, reason", ILLEGAL)
def test_each_contract_names_its_field_and_reason(fields, field, reason):
    with pytest.raises(ValueError, match=rf"graph .*field '{field}': .*{reason}"):
        check(**fields)


@pytest.mark.parametrize("fields, field, reason", ILLEGAL)
def test_each_contract_names_the_graph_it_refuses(fields, field, reason):
    """The message starts with the refused program's own name (kind and extents), whichever
    family's contract it breaks, so that a catalog's author finds the entry."""
    with pytest.raises(ValueError) as refused:
        check(**fields)
    assert str(refused.value).startswith(f"graph {GraphDescriptor(**fields).name}: field '{field}'")


@spec("mixed-execution/prompt-ge-width", "mixed-execution/width-range")
def test_a_declared_completion_capacity_bounds_mixed_width_and_prompt_may_equal_width():
    g = GraphDescriptor(
        GraphKind.MIXED,
        2,
        token_capacity=64,
        proposal_depth=63,
        prefill_capacity=64,
        target_capacity=128,
        speculative=True,
    )
    validate(g, speculative_token_capacity=128, completion_token_capacity=64)  # C = W is enough
    graphs = (
        GraphDescriptor(
            GraphKind.MIXED,
            2,
            token_capacity=8,
            proposal_depth=7,
            prefill_capacity=64,
            target_capacity=72,
            speculative=True,
        ),
    )
    Catalog("c", "speculative", 64, 4, graphs)  # the default capacity is 8
    with pytest.raises(ValueError, match="token_capacity"):
        Catalog("c", "speculative", 64, 4, graphs, completion_token_capacity=4)


def test_catalog_level_contracts():
    snap = (GraphDescriptor(GraphKind.SNAPSHOT, 1),)
    for slots in (1, 64):
        assert Catalog("c", "ordinary", 0, slots, snap).request_slots == slots
    for slots in (0, 65):
        with pytest.raises(ValueError, match="request_slots"):
            Catalog("c", "ordinary", 0, slots, snap)
    with pytest.raises(ValueError, match="speculative_token_capacity"):
        Catalog("c", "speculative", -1, 4, snap)
    with pytest.raises(ValueError, match="request_slots=4"):
        Catalog("c", "ordinary", 0, 4, (GraphDescriptor(GraphKind.SNAPSHOT, 8),))
    spec_decode = GraphDescriptor(
        GraphKind.SPECULATIVE, 2, token_capacity=1, target_capacity=2, allocation=Allocation.QUERY_LENGTH
    )
    spec_mixed = GraphDescriptor(
        GraphKind.MIXED, 2, token_capacity=1, prefill_capacity=64, target_capacity=65, speculative=True
    )
    for g in (spec_decode, spec_mixed):
        Catalog("c", "speculative", 0, 4, (g,))
        with pytest.raises(ValueError, match="ordinary catalog holds no speculative programs"):
            Catalog("c", "ordinary", 0, 4, (g,))


@spec(
    "speculative-coverage/fixed-host-ragged",
    "mixed-execution/fixed-width-shared",
    "speculative-coverage/load-reduce-existing",
)
def test_fixed_mode_keeps_every_other_kind_and_defaults_to_the_widest_host_width():
    cat = shipped_catalog()
    fixed = cat.eligible(DecodeMode.FIXED)
    assert fixed == cat.eligible(DecodeMode.FIXED, fixed_width=8)  # the widest host-allocated width
    assert {g for g in cat.graphs if not g.kind.is_generation} <= set(fixed)
    assert [g for g in fixed if g.kind is GraphKind.MIXED] == [
        g for g in cat.graphs if g.kind is GraphKind.MIXED and g.token_capacity == 8
    ]
    assert [g for g in fixed if g.kind is GraphKind.SPECULATIVE] == [
        g
        for g in cat.graphs
        if g.kind is GraphKind.SPECULATIVE
        and g.token_capacity == 8
        and g.allocation is Allocation.QUERY_LENGTH
    ]
    device_only = Catalog(
        "d",
        "speculative",
        64,
        4,
        (
            GraphDescriptor(
                GraphKind.SPECULATIVE,
                4,
                token_capacity=4,
                proposal_depth=3,
                target_capacity=8,
                allocation=Allocation.PREFIX_LIMIT,
            ),
        ),
    )
    with pytest.raises(
        ValueError, match=r"no host-allocated speculative program of fixed width 1; captured widths \[\]"
    ):
        device_only.eligible(DecodeMode.FIXED)
