"""The generated catalog family: the packaged build() equals the shared generator, and the seeded
sampler covers the ranges issue 12 asks for."""

import importlib.util
import json
import pathlib

import pytest

from helios_jax import catalog_family as cf
from helios_jax.catalog import Catalog, shipped_catalog

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tools" / "make_catalog.py"

KEYWORDS = [
    {},
    {"slots": 32, "R": 128, "drafts": 7, "scale": 1.3, "jitter": 0.2, "seed": 5},
    {"slots": 8, "R": 32, "jitter": 0.3, "seed": 11, "mode": "ordinary"},
    {
        "slots": 64,
        "R": 256,
        "weights_ms": 1.9,
        "token_ms": 0.03,
        "row_ms": 0.006,
        "draft_ms": 0.33,
        "jitter": 0.1,
        "seed": 123,
        "drafts": 3,
    },
    {
        "slots": 64,
        "R": 64,
        "launch_ms": 0.2,
        "logprob_ms": 0.006,
        "draft_row_ms": 0.003,
        "jitter": 0.25,
        "seed": 7,
        "chunks": (64, 256, 1024),
    },
]


def _shared_build():
    spec = importlib.util.spec_from_file_location("shared_make_catalog", SHARED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/tools/make_catalog.py is not beside this checkout")
@pytest.mark.parametrize("keywords", KEYWORDS, ids=lambda k: json.dumps(k, sort_keys=True))
def test_packaged_build_equals_the_shared_generator(keywords):
    assert cf.build(**keywords) == _shared_build()(**keywords)


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/tools/make_catalog.py is not beside this checkout")
def test_family_members_equal_the_shared_generator():
    shared = _shared_build()
    for member in cf.family(6, seed=3):
        assert member.catalog == Catalog.from_json(shared(**member.params))


def test_default_build_is_the_shipped_catalog():
    assert Catalog.from_json(cf.build()) == shipped_catalog()
    assert Catalog.from_json(cf.build(mode="ordinary", name="synthetic-h200-ordinary")) == shipped_catalog(
        "synthetic-h200-ordinary"
    )


def test_family_is_seeded_and_prefix_stable():
    a = [m.params for m in cf.family(12, seed=1)]
    assert a == [m.params for m in cf.family(12, seed=1)]
    assert a[:5] == [m.params for m in cf.family(5, seed=1)]
    assert a != [m.params for m in cf.family(12, seed=2)]
    assert len({m["name"] for m in a}) == 12


def test_family_covers_the_ranges():
    members = list(cf.family(60, seed=0))
    for m in members:
        p, cat = m.params, m.catalog
        assert p["slots"] in cf.SLOTS and cat.request_slots == p["slots"]
        assert p["R"] in cf.TOKEN_CAPACITIES and p["R"] >= p["slots"]
        for key in cf.SCALED:
            assert 0.5 - 1e-6 <= p[key] / cf.DEFAULTS[key] <= 1.5 + 1e-6, (key, p)
        assert 0.1 <= p["jitter"] <= 0.3
        assert cat.mode == p["mode"]
        assert cat.speculative_token_capacity == (p["R"] if p["mode"] == "speculative" else 0)
        assert all(g.duration_ms > 0 for g in cat.graphs)
        assert cat == Catalog.from_json(cf.build(**p))
    modes = [m.params["mode"] for m in members]
    assert modes[3::4] == ["ordinary"] * 15 and "ordinary" not in modes[0::4] + modes[1::4] + modes[2::4]
    assert {m.params["slots"] for m in members} == set(cf.SLOTS)
    assert len({m.params["R"] for m in members}) == len(cf.TOKEN_CAPACITIES)
    assert len({m.params["seed"] for m in members}) == 60


def test_command_writes_the_family(tmp_path, capsys):
    assert cf.main(["catalog_family", "3", "4", str(tmp_path)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    members = list(cf.family(3, seed=4))
    assert printed == [m.params for m in members]
    for m in members:
        assert Catalog.load(tmp_path / f"{m.name}.json") == m.catalog
