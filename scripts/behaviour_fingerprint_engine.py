"""The engine's greedy token ids on the embedded model, one line per (mode, prompt): part of
scripts/behaviour_fingerprint.sh (a restructure must leave them unchanged).

Requests run four at a time so that batching, packing and speculative rounds are exercised."""

from __future__ import annotations

from helios_jax.engine_config import EngineConfig
from helios_jax.model import load_checkpoint
from helios_jax.model.default import default_model_path
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine
from helios_jax.runtime.tokenizer import HFTokenizer

PROMPTS = [
    "def fibonacci(n):\n",
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time there was a little robot who " * 6,
]


def main() -> None:
    model = load_checkpoint(str(default_model_path()), dtype="float32")
    tokenizer = HFTokenizer(model.tokenizer)
    for mode in ("off", "fixed", "adaptive"):
        config = EngineConfig(
            request_slots=4,
            max_model_len=512,
            prefill_chunks=(64, 256),
            speculation=mode,
            dtype=model.config.dtype,
            **({"draft_tokens": 0} if mode == "off" else {}),
        )
        engine = HeliosEngine(
            model_config=model.config,
            params=model.params,
            tokenizer=tokenizer,
            engine_config=config,
            progress=None,
        )
        try:
            streams = [
                engine.submit(
                    GenerationRequest(
                        f"{mode}-{i}",
                        tuple(tokenizer.encode(p)),
                        SamplingParams(max_tokens=40, temperature=0.0),
                    )
                )
                for i, p in enumerate(PROMPTS)
            ]
            for i, stream in enumerate(streams):
                ids = [t for event in stream for t in event.token_ids]
                print(mode, i, ids)
        finally:
            engine.shutdown()


if __name__ == "__main__":
    main()
