"""Mixed prefill/verification frames, device-allocated verification frames and K-step width-one
frames through the engine.

An adaptive engine with two request slots, one proposal depth (D = 3, W = 4) and a speculative
token envelope R = 4 smaller than B * W = 8, so that its two-lane verification program is ragged
and bound to the device `prefix_limit` allocation (docs/catalog.md), and with mixed programs
(`mixed_prefill`). Copy proposals from repeated code keep acceptance high, so wide rounds pay; a
prompt that arrives while another request streams is absorbed by a mixed frame. Width-one
rounds run one or four steps (`decode_steps`, RESOLUTIONS.md 25), each step keeping the draft
context that the wide rounds after it draft from. Every text must be plain greedy decoding's, and
all three kinds of frame must have run.
"""

import pytest

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.runtime import compilations
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer
from .test_engine import offline_greedy

spec = pytest.mark.spec
CODE = "def f(x):\n    return x + 1\n"
ROUNDS = 3  # request pairs served, at most, until both kinds of frame have run


@pytest.fixture(scope="module")
def engine():
    config, params = model()
    ec = EngineConfig(
        request_slots=2,
        prefill_chunks=(64,),
        speculation="adaptive",
        draft_tokens=3,
        speculative_token_capacity=4,
        mixed_prefill=True,
        max_model_len=128,
        proposal_source="copy",
        decode_steps=(1, 4),
    )
    eng = HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, check_invariants=True
    )
    yield eng
    eng.shutdown()


def _kinds(engine) -> tuple[int, int, int]:
    """(mixed frames, device-allocated verification frames, K-step width-one frames) the engine
    has run."""
    mixed = device = steps = 0
    for graph, _ in engine.executor.history:
        mixed += graph.kind is GraphKind.MIXED
        device += graph.kind is GraphKind.SPECULATIVE and graph.allocation is Allocation.PREFIX_LIMIT
        steps += graph.kind is GraphKind.SPECULATIVE and graph.steps > 1
    return mixed, device, steps


def _pair(engine, n: int) -> None:
    """One request streams; a second, longer prompt arrives after its first tokens."""
    tok = tokenizer()
    greedy = SamplingParams(max_tokens=32, temperature=0.0)
    prompts = [tok.encode(CODE * (2 + n)), tok.encode(CODE * 5)]
    first = engine.submit(GenerationRequest(f"stream{n}", tuple(prompts[0]), greedy))
    head = next(iter(first))
    second = engine.submit(GenerationRequest(f"arrival{n}", tuple(prompts[1]), greedy))
    texts = [list(head.token_ids) + [t for e in first for t in e.token_ids]]
    texts.append([t for e in second for t in e.token_ids])
    for prompt, tokens in zip(prompts, texts):
        assert tokens == offline_greedy(prompt, len(tokens)) and len(tokens) == 32


@spec("mixed-execution/planning-same-catalog", "verification/runtime-phase-coverage")
def test_mixed_and_device_allocated_frames_serve_plain_greedy_text(engine):
    graphs = engine.executor.programs.catalog.graphs
    assert any(g.allocation is Allocation.PREFIX_LIMIT and g.batch_capacity == 2 for g in graphs)
    offline_greedy(tokenizer().encode(CODE), 2)  # the reference's own compilations, done first
    before = compilations.compilation_count()
    for n in range(ROUNDS):
        _pair(engine, n)
        mixed, device, steps = _kinds(engine)
        if mixed and device and steps:
            break
    assert mixed > 0 and device > 0 and steps > 0, dict(engine.executor.graph_counts)
    new = compilations.compilation_count() - before
    assert new == 0, compilations.recent_compilations()[-new:]  # every kind was prepared at start-up
