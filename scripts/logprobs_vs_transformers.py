"""The engine's log-probabilities against transformers on the embedded default model.

Serves three requests through a small HeliosEngine on helios_jax/assets/default_model (float32;
adaptive speculation, so prefill, decode and speculative programs all score tokens): greedy with
20 alternatives, sampled (temperature 0.8, top-k 40, top-p 0.9) with 5, and a scored prefill
(prompt log-probabilities with 20 alternatives each, as echo with logprobs: 20 asks). Each
value is compared with log_softmax of Qwen3ForCausalLM's logits over the whole sequence; prints
the largest absolute errors and exits 1 above 1e-3.

    PYTHONPATH=. python scripts/logprobs_vs_transformers.py   # measured: largest error 8.8e-06
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import transformers

from helios_jax.engine_config import EngineConfig
from helios_jax.model.default import default_model_path
from helios_jax.prepare import load_engine_model
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine
from helios_jax.runtime.tokenizer import HFTokenizer

TOLERANCE = 1e-3
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


def reference(ids: list[int]) -> np.ndarray:
    """log_softmax of transformers' logits for `ids`: row i scores token i + 1."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(default_model_path()), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def errors(prompt: list[int], events) -> dict[str, float]:
    tokens = [t for e in events for t in e.token_ids]
    values = [v for e in events for v in e.token_logprobs or ()]
    tops = [a for e in events for a in e.top_logprobs or ()]
    logp = reference(prompt + tokens)
    out = {"tokens": float(len(tokens))}
    rows = [logp[len(prompt) + i - 1] for i in range(len(tokens))]
    if values:
        out["token_logprob"] = max(abs(v - r[t]) for v, r, t in zip(values, rows, tokens, strict=True))
    if tops:
        k = len(tops[0])
        out["top_values"] = max(
            float(np.max(np.abs(np.array([v for _, v in a]) - np.sort(r)[::-1][:k])))
            for a, r in zip(tops, rows)
        )
        out["top_ids_logprob"] = max(abs(v - r[i]) for a, r in zip(tops, rows) for i, v in a)
    scores = events[0].prompt_logprobs
    if scores is not None:
        out["prompt_logprob"] = max(abs(scores[i] - logp[i - 1, prompt[i]]) for i in range(1, len(prompt)))
    prompt_tops = events[0].prompt_top_logprobs
    if prompt_tops is not None:
        rows = [(a, logp[i - 1]) for i, a in enumerate(prompt_tops) if i > 0]
        k = len(rows[0][0])
        out["prompt_top_values"] = max(
            float(np.max(np.abs(np.array([v for _, v in a]) - np.sort(r)[::-1][:k]))) for a, r in rows
        )
        out["prompt_top_ids_logprob"] = max(abs(v - r[i]) for a, r in rows for i, v in a)
    return out


def main() -> int:
    model = load_engine_model(None, dtype="float32")
    tokenizer = HFTokenizer(model.tokenizer)
    ec = EngineConfig(
        request_slots=2, prefill_chunks=(64,), speculation="adaptive", draft_tokens=3, max_model_len=256
    )
    engine = HeliosEngine(
        model_config=model.config, params=model.params, tokenizer=tokenizer, engine_config=ec, progress=None
    )
    prompt = tokenizer.encode(PROMPT)
    cases = {
        "greedy, top 20": SamplingParams(max_tokens=24, temperature=0.0, logprobs=True, top_logprobs=20),
        "sampled T=0.8 k=40 p=0.9, top 5": SamplingParams(
            max_tokens=24, temperature=0.8, top_k=40, top_p=0.9, seed=3, logprobs=True, top_logprobs=5
        ),
        "scored prefill (echo), top 20": SamplingParams(
            max_tokens=4, temperature=0.0, prompt_logprobs=True, logprobs=True, top_logprobs=20
        ),
    }
    worst = 0.0
    try:
        for i, (name, sampling) in enumerate(cases.items()):
            events = list(engine.submit(GenerationRequest(f"c{i}", tuple(prompt), sampling)))
            assert events[-1].finish_reason in ("length", "stop"), events[-1]
            found = errors(prompt, events)
            print(name, {k: (f"{v:.2e}" if k != "tokens" else int(v)) for k, v in found.items()})
            worst = max([worst] + [v for k, v in found.items() if k != "tokens"])
    finally:
        engine.shutdown()
    print(f"largest absolute error {worst:.2e} (tolerance {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
