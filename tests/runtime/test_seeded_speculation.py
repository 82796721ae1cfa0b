"""A seeded request's text does not depend on speculation or on the other requests.

Three engines over the same tiny model (random MTP head), speculation off, fixed and adaptive
(small, so that they compile quickly: two request slots, one 64-token chunk, six target rows). Each serves
two seeded sampled requests (one with top-k and top-p), first alone, one after the other, then
together with two unseeded requests, greedy and sampled. A seeded request's draws are keyed by
its seed and token position (RESOLUTIONS.md 30), so its tokens must be the same in all six runs,
although the modes run different programs (ordinary decode; speculative programs of width one
and wider, host or device allocated) and the batches differ. The three engines compile about
thirty programs, so this test is `slow` (`pytest -m slow`); in the default run, the program
tests (tests/programs/test_coupled_programs.py) hold every program kind to the keyed draws, and
a fake-program engine checks here that a request's seed, and only a set seed, makes its row
coupled.
"""

import dataclasses

import pytest

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams, program_seed
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer
from .test_executor import FakeDevice, FakeProgram, FakeSet

SEEDED = {
    "fox": ("the quick brown fox", dict(max_tokens=14, temperature=0.9, seed=11)),
    "code": (
        "def f(x):\n    return",
        dict(max_tokens=11, temperature=0.7, top_k=40, top_p=0.9, seed=2**40 + 3),
    ),
}
OTHERS = {
    "greedy": ("import os\nprint(", dict(max_tokens=9, temperature=0.0)),
    "sampled": ("hello world", dict(max_tokens=12, temperature=1.0)),
}


def _engine(speculation: str) -> HeliosEngine:
    config, params = model()
    ec = EngineConfig(
        request_slots=2,
        prefill_chunks=(64,),
        speculation=speculation,
        draft_tokens=3 if speculation != "off" else 0,
        max_model_len=128,
        speculative_token_capacity=6,  # B = 2 at W = 4 is ragged: device allocation when adaptive
    )
    return HeliosEngine(model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec)


def _submit(engine, requests: dict, tag: str) -> dict:
    tok = tokenizer()
    streams = {
        rid: engine.submit(
            GenerationRequest(f"{tag}-{rid}", tuple(tok.encode(text)), SamplingParams(**sampling))
        )
        for rid, (text, sampling) in requests.items()
    }
    return {rid: [t for e in stream for t in e.token_ids] for rid, stream in streams.items()}


def _serve(speculation: str) -> tuple[dict, dict, dict]:
    engine = _engine(speculation)
    try:
        alone = {}
        for rid, request in SEEDED.items():
            alone.update(_submit(engine, {rid: request}, "alone"))
        together = _submit(engine, {**SEEDED, **OTHERS}, "together")
        return alone, together, dict(engine.executor.graph_counts)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def runs():
    return {mode: _serve(mode) for mode in ("off", "fixed", "adaptive")}


@pytest.mark.slow
def test_seeded_text_is_the_same_in_every_mode_alone_and_batched(runs):
    want = runs["off"][0]
    for mode, (alone, together, _) in runs.items():
        assert alone == want, mode
        assert {rid: together[rid] for rid in SEEDED} == want, mode
    assert all(len(want[rid]) == SEEDED[rid][1]["max_tokens"] for rid in SEEDED)  # no stop token


@pytest.mark.slow
def test_the_modes_ran_different_programs(runs):
    names = {mode: set(counts) for mode, (_, _, counts) in runs.items()}
    assert any(n.startswith("decode") for n in names["off"])
    assert not any(n.startswith("decode") for n in names["fixed"] | names["adaptive"])
    assert any(",W=4," in n for n in names["fixed"]) and any(",W=4," in n for n in names["adaptive"])
    assert any(",W=1," in n and n.startswith("speculative") for n in names["adaptive"])  # it chose widths


@dataclasses.dataclass
class RecordingProgram(FakeProgram):
    """A fake program that records the inputs of every initialize frame."""

    initialized: list = dataclasses.field(default_factory=list)

    def __call__(self, params, state, inputs):
        if self.descriptor.kind is GraphKind.INITIALIZE:
            self.initialized.append(inputs)
        return super().__call__(params, state, inputs)


def test_a_set_seed_and_only_a_set_seed_makes_the_row_coupled():
    ec = EngineConfig(request_slots=4, prefill_chunks=(64,), speculation="adaptive", max_model_len=256)
    device, record = FakeDevice(), []
    programs = FakeSet(
        {g.key: RecordingProgram(g, device, g.batch_capacity, record) for g in ec.catalog().graphs}
    )
    engine = HeliosEngine(
        model_config=None, params=None, tokenizer=tokenizer(), engine_config=ec, programs=programs
    )
    try:
        prompt = tuple(tokenizer().encode("hello"))
        streams = [
            engine.submit(GenerationRequest(f"r{seed}", prompt, SamplingParams(max_tokens=2, seed=seed)))
            for seed in (5, None, 2**33 + 9)
        ]
        for stream in streams:
            list(stream)
    finally:
        engine.shutdown()
    lanes = [(seed, coupled) for host in record for seed, coupled in zip(host["seeds"], host["coupled"])]
    assert len(lanes) == 3
    assert sorted(coupled for _, coupled in lanes) == [False, True, True]
    assert {seed for seed, coupled in lanes if coupled} == {5, program_seed(2**33 + 9)}
