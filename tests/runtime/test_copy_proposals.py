"""Copy proposals without an MTP head: a model that has no draft head still speculates, with
prompt-lookup copies alone, and serves plain greedy decoding's text.

The engine over the draft-head model serves copy proposals in ``test_engine.py`` (its compiled
programs are shared there); this one compiles a catalog of its own for a model without the head,
so it is slow (about 100 s on two busy cores).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.model import forward_full_logits
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import model, tokenizer

spec = pytest.mark.spec
# `fixed`: every round on the D + 1 program, as wide as the copy prefix allows (under `adaptive`,
# whether a round is wide depends on the costs a fresh engine happens to measure first).
EC = EngineConfig(
    request_slots=2, prefill_chunks=(64,), speculation="fixed", draft_tokens=3, max_model_len=192
)
TEXTS = ("def f(x):\n    return x + 1\n" * 3, "for i in range(10):\n    print(i)\n" * 2 + "for i in")
BUFFER = 192


@functools.cache
def _logits_fn():
    config, params = model(mtp=False)
    return jax.jit(lambda tokens: forward_full_logits(config, params, tokens))


def plain_greedy(prompt, n):
    """Greedy decoding by the cache-free full forward over a fixed buffer (causal: padding after
    the context changes no logit)."""
    ids = list(prompt)
    for _ in range(n):
        buf = np.zeros(BUFFER, np.int32)
        buf[: len(ids)] = ids
        ids.append(int(jnp.argmax(_logits_fn()(jnp.asarray(buf))[len(ids) - 1])))
    return ids[len(prompt) :]


@pytest.mark.slow
@spec("speculative-coverage/copy-d", "speculative-coverage/copy-no-draws")
def test_a_model_without_an_mtp_head_speculates_with_copies():
    config, params = model(mtp=False)
    with pytest.raises(ValueError, match="MTP draft head"):  # learned proposals: nothing drafts them
        HeliosEngine(model_config=config, params=params, tokenizer=tokenizer(), engine_config=EC, start=False)
    engine = HeliosEngine(
        model_config=config,
        params=params,
        tokenizer=tokenizer(),
        engine_config=EC.replace(proposal_source="copy"),
        check_invariants=True,
    )
    try:
        prompts = [tokenizer().encode(t) for t in TEXTS]
        streams = [
            engine.submit(
                GenerationRequest(f"r{i}", tuple(p), SamplingParams(max_tokens=40, temperature=0.0))
            )
            for i, p in enumerate(prompts)
        ]
        out = [[t for e in s for t in e.token_ids] for s in streams]
        history = list(engine.executor.history)
        drafts = dict(engine.scheduler.speculative)
    finally:
        engine.shutdown()
    for p, tokens in zip(prompts, out):
        assert len(tokens) == 40 and tokens == plain_greedy(p, 40)
    assert any(g.kind is GraphKind.SPECULATIVE and g.token_capacity > 1 for g, _ in history)
    assert drafts["copy_drafts"] > 0 and drafts["copy_accepted"] > 0  # verified and accepted copies
    assert drafts.get("learned_drafts", 0) == 0  # nothing drew a learned proposal
