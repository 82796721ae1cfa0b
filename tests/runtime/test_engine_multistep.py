"""The engine serving with multi-step decode programs: the same text as single-step decoding.

Two engines over the same tiny model and seeds, one with single-step decode programs only, one
whose only decode programs run four steps (so every decode frame is a K-step frame): greedy and
seeded requests, with output limits that are not multiples of K, must produce identical tokens
and finish reasons.
"""

import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer

spec = pytest.mark.spec
K = 4


def _engine(decode_steps):
    config, params = model(mtp=False)
    ec = EngineConfig(
        request_slots=2,  # few programs to compile: two engines run in this test
        prefill_chunks=(64,),
        speculation="off",
        draft_tokens=0,
        max_model_len=128,
        decode_steps=decode_steps,
    )
    return HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, check_invariants=True
    )


REQUESTS = [
    ("greedy", "def f(x):\n    return x + 1\n", dict(max_tokens=10, temperature=0.0)),
    ("seeded", "hello world, the quick brown fox", dict(max_tokens=13, temperature=0.9, top_k=50, seed=7)),
    ("long", "import os\nprint(os.getcwd())\n" * 3, dict(max_tokens=21, temperature=0.7, seed=3)),
]


def _serve(engine) -> dict:
    tok = tokenizer()
    streams = {
        rid: engine.submit(GenerationRequest(rid, tuple(tok.encode(text)), SamplingParams(**sampling)))
        for rid, text, sampling in REQUESTS
    }
    out = {}
    for rid, stream in streams.items():
        events = list(stream)
        out[rid] = ([t for e in events for t in e.token_ids], events[-1].finish_reason)
    return out


@spec("useful-service/output-progress", "verification/runtime-phase-coverage")
def test_k_step_programs_serve_the_same_text_as_single_steps():
    single, multi = _engine((1,)), _engine((K,))
    try:
        want, got = _serve(single), _serve(multi)
        counts = dict(multi.executor.graph_counts)
    finally:
        single.shutdown()
        multi.shutdown()
    assert any(name.endswith(f",S={K}]") for name in counts), counts  # K-step frames ran
    assert got == want
    for rid, _, sampling in REQUESTS:
        tokens, reason = got[rid]
        assert len(tokens) <= sampling["max_tokens"]
        assert reason == "stop" or len(tokens) == sampling["max_tokens"]
