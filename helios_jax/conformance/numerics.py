"""The numerics section of the conformance command: kernels and the model against their oracles.

Three checks, in this order:

1. the device prefix allocation (the jitted kernel reference) against the naive numpy oracle, on
   200 seeded random cases;
2. greedy decoding through the prepared speculative programs against plain greedy decoding of the
   embedded model, token for token;
3. the model's logits against transformers' ``Qwen3ForCausalLM`` on a tiny seeded checkpoint, where
   transformers is installed (``n/a`` otherwise).

Each check imports jax, the model and torch itself, so the scheduler sections of the conformance
command never load them.
"""

from __future__ import annotations

import numpy as np

from helios_jax.conformance.result import Result


def numeric_checks() -> list[Result]:
    """Kernel against its oracle, the engine's greedy speculative decoding against plain greedy
    decoding, and logits against transformers when it is installed."""
    return [_prefix_allocation_check(), _engine_greedy_check(), _transformers_logits_check()]


def _prefix_allocation_check() -> Result:
    """The device prefix allocation against the numpy oracle on 200 random populations: up to five
    lanes, up to four proposal depths, monotone survival probabilities, random ceilings and caps."""
    from helios_jax.kernels.prefix_allocation import prefix_allocation_reference
    from helios_jax.reference.prefix_allocation import prefix_allocation_naive

    rng = np.random.default_rng(0)
    bad = 0
    for _ in range(200):
        b, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        prob = np.minimum.accumulate(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=(b, d)), axis=1).astype(
            np.float32
        )
        active = rng.random(b) < 0.8
        ceil = rng.integers(1, d + 2, size=b)
        cap = int(active.sum()) + int(rng.integers(0, 8))
        got = np.asarray(prefix_allocation_reference(prob, ceil.astype(np.int32), active, cap))
        bad += int(not np.array_equal(got, prefix_allocation_naive(prob, ceil, active, cap)))
    return Result(
        "numerics",
        "device prefix allocation vs numpy oracle",
        "pass" if bad == 0 else "fail",
        f"200 random cases, {bad} disagreements",
        ("speculative-coverage/device-frontier",),
    )


def _engine_greedy_check() -> Result:
    """Greedy decoding through the prepared speculative programs (the engine: paged caches, MTP
    proposals, verification, acceptance, commit) equals plain greedy decoding of the embedded
    model, token for token (float32)."""
    from helios_jax.engine_config import EngineConfig
    from helios_jax.model.default import greedy_decode, load_default_model
    from helios_jax.runtime.api import GenerationRequest, SamplingParams
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_default_model(dtype="float32")
    tokenizer = HFTokenizer(model.tokenizer)
    config = EngineConfig(
        request_slots=2,
        prefill_chunks=(64,),
        speculation="adaptive",
        draft_tokens=3,
        max_model_len=256,
        dtype="float32",
    )
    engine = HeliosEngine(
        model_config=model.config, params=model.params, tokenizer=tokenizer, engine_config=config
    )
    try:
        prompts = [tokenizer.encode("def fibonacci(n):\n    "), tokenizer.encode("import os\nimport sys\n\n")]
        streams = [
            engine.submit(GenerationRequest(f"c{i}", tuple(p), SamplingParams(max_tokens=32, temperature=0)))
            for i, p in enumerate(prompts)
        ]
        outputs = [[t for e in s for t in e.token_ids] for s in streams]
        rounds = engine.scheduler.speculative
    finally:
        engine.shutdown()
    equal = all(out == greedy_decode(model, p, len(out))[: len(out)] for p, out in zip(prompts, outputs))
    return Result(
        "numerics",
        "greedy speculative decoding equals plain greedy decoding",
        "pass" if equal else "fail",
        f"{sum(map(len, outputs))} tokens over {len(prompts)} concurrent requests; "
        f"{rounds['programs']} speculative programs, {rounds['drafts_accepted']}/{rounds['drafts_offered']} "
        "drafts accepted",
        ("speculative-coverage/width-one-draft-context",),
    )


def _transformers_logits_check() -> Result:
    """Full-sequence logits of a tiny random Qwen3 checkpoint (two layers, float32) loaded by
    `load_checkpoint`, against transformers' own forward pass on the same weights."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return Result(
            "numerics", "logits vs transformers Qwen3ForCausalLM", "n/a", "transformers is not installed"
        )
    import tempfile

    import jax

    from helios_jax.model import forward_full_logits, load_checkpoint

    config = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    reference = transformers.Qwen3ForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        ours = load_checkpoint(folder)
    ids = np.arange(1, 25) % 128
    with torch.no_grad():
        want = reference(torch.tensor(ids[None])).logits[0].numpy()
    got = np.asarray(forward_full_logits(ours.config, ours.params, jax.numpy.asarray(ids)))
    err = float(np.max(np.abs(got - want)))
    return Result(
        "numerics",
        "logits vs transformers Qwen3ForCausalLM",
        "pass" if err <= 1e-4 else "fail",
        f"max abs error {err:.2e} (f32, tolerance 1e-4)",
    )
