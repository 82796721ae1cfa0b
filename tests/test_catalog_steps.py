"""Multi-step decode descriptors: the `steps` field, its contracts, names, JSON and planning."""

import dataclasses
import json

import pytest

from helios_jax.catalog import Allocation, Catalog, GraphDescriptor, GraphKind, shipped_catalog, validate
from helios_jax.engine_config import EngineConfig
from helios_jax.engine_options import EngineOptions

DECODE = GraphDescriptor(GraphKind.DECODE, 4, token_capacity=1, target_capacity=4)
WIDTH_ONE = GraphDescriptor(
    GraphKind.SPECULATIVE, 4, token_capacity=1, target_capacity=4, allocation=Allocation.QUERY_LENGTH
)
WIDE = GraphDescriptor(  # a verifying round has no K-step form
    GraphKind.SPECULATIVE,
    4,
    token_capacity=2,
    proposal_depth=1,
    target_capacity=8,
    allocation=Allocation.QUERY_LENGTH,
    steps=4,
)


def test_steps_enter_key_and_name_only_when_above_one():
    four = dataclasses.replace(DECODE, steps=4)
    assert DECODE.key != four.key and four.key.steps == 4 and DECODE.key.steps == 1
    assert DECODE.name == "decode[B=4,W=1,D=0,C=0,P=4]"  # existing names are unchanged
    assert four.name == "decode[B=4,W=1,D=0,C=0,P=4,S=4]"


def test_json_round_trip_writes_steps_only_when_above_one(tmp_path):
    ordinary = shipped_catalog("synthetic-h200-ordinary")
    cat = dataclasses.replace(ordinary, graphs=ordinary.graphs + (dataclasses.replace(DECODE, steps=8),))
    path = tmp_path / "c.json"
    cat.save(path)
    entries = json.loads(path.read_text())["graphs"]
    assert [e.get("steps") for e in entries if "steps" in e] == [8]
    assert Catalog.load(path) == cat


@pytest.mark.parametrize(
    "graph, message",
    [
        (dataclasses.replace(DECODE, steps=0), "steps"),
        (dataclasses.replace(DECODE, steps=True), "steps"),
        (GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=64, steps=2), "only ordinary decode"),
        (WIDE, "width-one speculative"),
    ],
)
def test_steps_contracts_name_graph_and_field(graph, message):
    with pytest.raises(ValueError, match=message) as err:
        validate(graph, speculative_token_capacity=64)
    assert "'steps'" in str(err.value)


def test_engine_config_plans_one_decode_per_bucket_and_step_count():
    ordinary = EngineConfig(request_slots=4, speculation="off", draft_tokens=0, max_model_len=256)
    assert {g.steps for g in ordinary.catalog().of_kind(GraphKind.DECODE)} == {1}
    multi = ordinary.replace(decode_steps=(8, 1, 4))
    assert multi.decode_steps == (1, 4, 8)
    decode = [(g.batch_capacity, g.steps) for g in multi.catalog().of_kind(GraphKind.DECODE)]
    assert sorted(decode) == [(b, k) for b in (1, 2, 4) for k in (1, 4, 8)]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(decode_steps=()), "at least one step count"),
        (dict(decode_steps=(0,)), "decode_steps"),
    ],
)
def test_engine_config_rejects_bad_step_counts(fields, message):
    base = dict(speculation="off", draft_tokens=0)
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{**base, **fields})


def test_width_one_speculative_programs_take_steps():
    validate(dataclasses.replace(WIDTH_ONE, steps=4), speculative_token_capacity=64)
    spec = EngineConfig(request_slots=4, speculation="adaptive", max_model_len=256, decode_steps=(1, 8))
    width_one = [g for g in spec.catalog().of_kind(GraphKind.SPECULATIVE) if g.token_capacity == 1]
    assert sorted((g.batch_capacity, g.steps) for g in width_one) == [
        (b, k) for b in (1, 2, 4) for k in (1, 8)
    ]
    wider = [g for g in spec.catalog().of_kind(GraphKind.SPECULATIVE) if g.token_capacity > 1]
    assert wider and {g.steps for g in wider} == {1}  # a verifying round runs once
    assert not spec.catalog().of_kind(GraphKind.DECODE)


def test_options_pass_step_counts_with_and_without_speculation():
    options = EngineOptions(speculation="off", decode_steps=(1, 8))
    assert options.engine_config().decode_steps == (1, 8)
    assert EngineOptions().engine_config().decode_steps == (1, 4, 8)  # the server's default
    assert EngineOptions(decode_steps=(1, 4)).engine_config().decode_steps == (1, 4)
    with pytest.raises(ValueError, match="decode_steps"):
        EngineOptions(decode_steps=(0,))
