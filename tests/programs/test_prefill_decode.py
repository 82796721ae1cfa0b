"""Prefill, scored prefill and ordinary decode against the cache-free full forward (scored
prefill's scores against transformers' own forward of the saved model).

A 27-token prompt is prefilled in 16-token chunks (the second chunk starts at cursor 16, so its
first token's log-probability comes from the carried hidden state h_15). Scored prefill must
return log_softmax(transformers' logits)[next token], and the 20 most probable alternatives,
for every prompt token but the first (NaN), within 1e-4; the first output token and ordinary
greedy decoding must equal the full-forward greedy continuation on its reliable prefix
(margins > 1e-4).
"""

import numpy as np
import pytest

from helios_jax.model import save_checkpoint
from helios_jax.programs.inputs import TOP_LOGPROBS

from .helpers import DECODE, MODEL, Driver, emitted, greedy_reference, reliable_prefix

spec = pytest.mark.spec
PROMPTS = {
    0: [7, 3, 250, 1, 19, 19, 4, 88, 2, 31, 64, 5, 5, 5, 120, 6, 7, 8, 9, 200, 12, 13, 14, 15, 16, 17, 18],
    2: [40, 2, 9, 33],
}


def _transformers_logits(params, prompt, folder) -> np.ndarray:
    """float64 logits of transformers' Qwen3ForCausalLM on the saved tiny model (float32)."""
    import torch
    import transformers

    save_checkpoint(folder, MODEL, params)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].double().numpy()


def test_scored_prefill_returns_prompt_logprobs(spec_programs, params, tmp_path):
    """Each prompt token's score and its TOP_LOGPROBS most probable alternatives (ids and
    values, most probable first) are log_softmax of transformers' logits one position earlier,
    across the chunk boundary too."""
    d = Driver(spec_programs, params, seed=2)
    prompt = PROMPTS[0]
    d.initialize(0)
    tops = []
    first, logprobs = d.prefill(0, prompt, scored=True, tops=tops)
    logits = _transformers_logits(params, prompt, tmp_path)
    want = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    assert np.isnan(logprobs[0]) and np.isnan(tops[0][0]).all()  # nothing predicts the first token
    np.testing.assert_allclose(
        logprobs[1:], [want[i - 1, prompt[i]] for i in range(1, len(prompt))], atol=1e-4
    )
    assert len(tops) == len(prompt) and tops[1][0].shape == (TOP_LOGPROBS,)
    for i in range(1, len(prompt)):
        values, ids = tops[i]
        np.testing.assert_allclose(values, np.sort(want[i - 1])[::-1][:TOP_LOGPROBS], atol=1e-4)
        np.testing.assert_allclose(values, want[i - 1][ids], atol=1e-4)  # the ids match the values
    assert first == int(np.argmax(logits[-1]))
    assert d.row(0)["cursor"] == len(prompt)


@spec("useful-service/output-progress")
def test_ordinary_decode_equals_full_forward_greedy(ordinary_programs, params):
    d = Driver(ordinary_programs, params, seed=6)
    streams = {}
    for slot, prompt in PROMPTS.items():
        d.initialize(slot)
        streams[slot] = [d.prefill(slot, prompt)[0]]
    slots = sorted(PROMPTS)
    for _ in range(20):
        out = d.run(DECODE, slots=slots, page_tables=d.tables(slots))
        for lane, slot in enumerate(slots):
            streams[slot].extend(emitted(out, lane))
        assert np.asarray(out.counts).tolist() == [1, 1]
    for slot, prompt in PROMPTS.items():
        want, margins = greedy_reference(params, prompt, 21)
        n = reliable_prefix(margins)
        assert n >= 12 and streams[slot][:n] == want[:n]
        assert d.row(slot)["cursor"] == len(prompt) + 20 and d.row(slot)["generated"] == 21
