"""After its warm-up the engine never compiles again.

The real engine on the embedded default model (small: 4 slots, max_model_len 160, adaptive
speculation with D = 2) is built and warmed by its constructor; then a mixed workload runs:
more concurrent requests than slots, prompts from 2 to 100 tokens (one chunk, several chunks),
greedy and sampled rows (temperature, top-k, top-p, seeds) in the same batches, stop strings,
generated-token log-probabilities and prompt scores. Any XLA compilation meanwhile (a program
that was not prepared, a jnp operation on the host path, a shape that varies) fails the test,
naming the compiled functions. The counter itself (`helios_jax.runtime.compilations`) must see
a fresh jit compile and render as a Prometheus counter.
"""

import threading

import jax
import numpy as np
import pytest

from helios_jax.engine_config import EngineConfig
from helios_jax.prepare import load_engine_model
from helios_jax.runtime import compilations
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine
from helios_jax.runtime.tokenizer import HFTokenizer


def test_the_counter_sees_a_new_compilation_and_renders_as_a_counter():
    before = compilations.compilation_count()
    jax.jit(lambda x: x * 3 + 1)(np.arange(7, dtype=np.int32)).block_until_ready()
    assert compilations.compilation_count() == before + 1
    assert "<lambda>" in compilations.recent_compilations()[-1]
    jax.jit(lambda x: x * 3 + 1)  # a jit that never runs compiles nothing
    assert compilations.compilation_count() == before + 1
    text = compilations.render_compilations()
    lines = text.splitlines()
    assert text.endswith("\n") and lines[1] == "# TYPE helios_xla_compilations_total counter"
    assert lines[0].startswith("# HELP helios_xla_compilations_total ")
    assert lines[2] == f"helios_xla_compilations_total {before + 1}"


@pytest.fixture(scope="module")
def engine():
    model = load_engine_model(None, dtype="float32")
    config = EngineConfig(
        request_slots=4,
        prefill_chunks=(32, 64),
        speculation="adaptive",
        draft_tokens=2,
        speculative_token_capacity=8,
        max_model_len=160,
    )
    eng = HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer(model.tokenizer),
        engine_config=config,
    )
    yield eng
    eng.shutdown()


def _workload(tok) -> list[GenerationRequest]:
    text = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n" * 4
    ids = tok.encode(text)
    lengths = (2, 9, 31, 40, 64, 100, 17, 5)
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.8, seed=1),
        dict(temperature=0.0, stop=("\n",)),
        dict(temperature=1.0, top_k=5, seed=2, logprobs=True),
        dict(temperature=0.7, top_p=0.9, seed=3),
        dict(temperature=0.0, prompt_logprobs=True),
        dict(temperature=0.0, logprobs=True),
        dict(temperature=1.2, top_k=20, top_p=0.8, stop=("return",), seed=4),
    ]
    return [
        GenerationRequest(f"r{i}", tuple(ids[:n]), SamplingParams(max_tokens=6 + 3 * i, **s))
        for i, (n, s) in enumerate(zip(lengths, settings))
    ]


def test_serving_a_mixed_workload_after_warm_up_compiles_nothing(engine):
    before = compilations.compilation_count()
    requests = _workload(engine.tokenizer)
    finished = []

    def consume(stream):
        events = list(stream)
        finished.append(events[-1].finish_reason)

    # Two waves: the second arrives while the first is decoding (mixed prefill + decode rounds).
    workers = []
    for wave in (requests[:5], requests[5:]):
        for request in wave:
            worker = threading.Thread(target=consume, args=(engine.submit(request),), daemon=True)
            worker.start()
            workers.append(worker)
    for worker in workers:
        worker.join(timeout=300)
    assert len(finished) == len(requests) and all(r in ("length", "stop") for r in finished), finished
    new = compilations.compilation_count() - before
    assert new == 0, f"{new} compilations after warm-up: {compilations.recent_compilations()[-new:]}"
