"""The engine serving with multi-prompt prefill programs: the same text as one-row prefill.

Two engines over the same tiny model and seeds, one with one-row prefill programs only, one that
also prepares four-row prefills (RESOLUTIONS.md, 26): four simultaneous prompts, greedy and
seeded (seeded ones within one chunk), one longer than a chunk, must produce identical tokens
and finish reasons, and the second engine must have run multi-row prefill frames.
"""

import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer

spec = pytest.mark.spec
B = 4


def _engine(prefill_batch):
    config, params = model(mtp=False)
    ec = EngineConfig(
        request_slots=B,
        prefill_chunks=(16, 64),  # B x 16 fits the largest chunk: four-row programs of 16 tokens
        speculation="off",
        draft_tokens=0,
        max_model_len=128,
        prefill_batch=prefill_batch,
    )
    return HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, check_invariants=True
    )


REQUESTS = [
    ("greedy", "def f(x):\n    return x + 1\n", dict(max_tokens=6, temperature=0.0)),
    ("seeded", "hello fox", dict(max_tokens=5, temperature=0.9, top_k=50, seed=7)),
    # Longer than a 16-token chunk: greedy, since a row's key advances once per chunk, so seeded
    # text depends on how a prompt is chunked (and the engines may chunk it differently).
    ("long", "import os\nprint(os.getcwd())\n" * 3, dict(max_tokens=4, temperature=0.0)),
    ("short", "hi", dict(max_tokens=5, temperature=0.0)),
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


@spec("useful-service/prompt-progress", "verification/runtime-phase-coverage")
def test_multi_prompt_prefill_serves_the_same_text_as_one_row_prefill():
    single, batched = _engine((1,)), _engine((1, B))
    try:
        want, got = _serve(single), _serve(batched)
        counts = dict(batched.executor.graph_counts)
    finally:
        single.shutdown()
        batched.shutdown()
    assert any(name.startswith(f"prefill[B={B},") for name in counts), counts  # multi-row frames ran
    assert got == want
    for rid, _, sampling in REQUESTS:
        tokens, reason = got[rid]
        assert 0 < len(tokens) <= sampling["max_tokens"]
