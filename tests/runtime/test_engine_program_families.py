"""The engine serving with multi-step decode and multi-prompt prefill programs: the same text as
single-step, one-row programs.

Two engines over the same tiny model and seeds (compiled once each for both families, to keep
the suite's time): one with single-step decode and one-row prefill only, one whose only decode
programs run four steps (RESOLUTIONS.md, 25: every decode frame is a K-step frame) and that also
prepares four-row prefills (RESOLUTIONS.md, 28). Four simultaneous prompts, greedy and seeded,
one longer than a chunk, with output limits that are not multiples of K, must produce identical
tokens and finish reasons, and both kinds of frame must have run. Seeded prompts fit one chunk:
a row's key advances once per chunk, so seeded text depends on how a prompt is chunked, and the
engines may chunk a long prompt differently.
"""

import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer

spec = pytest.mark.spec
K = 4  # decode steps
B = 4  # prefill rows


def _engine(decode_steps, prefill_batch):
    config, params = model(mtp=False)
    ec = EngineConfig(
        request_slots=B,
        prefill_chunks=(16, 64),  # B x 16 fits the largest chunk: four-row programs of 16 tokens
        speculation="off",
        draft_tokens=0,
        max_model_len=128,
        decode_steps=decode_steps,
        prefill_batch=prefill_batch,
    )
    return HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, check_invariants=True
    )


REQUESTS = [
    ("greedy", "def f(x):\n    return x + 1\n", dict(max_tokens=10, temperature=0.0)),
    ("seeded", "hello fox", dict(max_tokens=13, temperature=0.9, top_k=50, seed=7)),
    ("long", "import os\nprint(os.getcwd())\n" * 3, dict(max_tokens=21, temperature=0.0)),
    ("short", "hi", dict(max_tokens=5, temperature=0.7, seed=3)),
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


@spec(
    "useful-service/output-progress", "useful-service/prompt-progress", "verification/runtime-phase-coverage"
)
@pytest.mark.slow  # two whole engines compiled (about 100 s of CI's cores): make test-slow
def test_k_step_decode_and_multi_prompt_prefill_serve_the_same_text():
    plain, families = _engine((1,), (1,)), _engine((K,), (1, B))
    try:
        want, got = _serve(plain), _serve(families)
        counts = dict(families.executor.graph_counts)
    finally:
        plain.shutdown()
        families.shutdown()
    assert any(name.endswith(f",S={K}]") for name in counts), counts  # K-step frames ran
    assert any(name.startswith(f"prefill[B={B},") for name in counts), counts  # multi-row frames ran
    assert got == want
    for rid, _, sampling in REQUESTS:
        tokens, reason = got[rid]
        assert 0 < len(tokens) <= sampling["max_tokens"]
        assert reason == "stop" or len(tokens) == sampling["max_tokens"]
