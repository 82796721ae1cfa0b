"""The fake engine's outputs match the derivations in its docstring."""

import pytest

from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.serve.fake import CYCLE_TEXT, CharTokenizer, FakeEngine, stop_holdback

TOKENIZER = CharTokenizer()


def run(engine: FakeEngine, prompt: str, request_id: str = "r", **sampling):
    stream = engine.submit(
        GenerationRequest(request_id, tuple(TOKENIZER.encode(prompt)), SamplingParams(**sampling))
    )
    return list(stream)


def test_tokenizer_round_trip_and_chat_template_endpoints():
    assert TOKENIZER.encode("hi") == [104, 105]
    assert TOKENIZER.decode([104, 105]) == "hi"
    ids, endpoints = TOKENIZER.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    assert TOKENIZER.decode(ids) == "system: Be brief.\nuser: hi\nassistant: "
    assert (len(ids), endpoints) == (38, (18, 27))


def test_cycle_output_honours_max_tokens():
    events = run(FakeEngine(), "Hello", max_tokens=50)
    assert "".join(e.text for e in events) == (CYCLE_TEXT * 2)[:50]
    assert [len(e.token_ids) for e in events] == [1] * 50
    last = events[-1]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == ("length", 5, 50)
    assert last.token_logprobs is None and events[0].prompt_logprobs is None


def test_reverse_mode_echoes_the_prompt_reversed():
    events = run(FakeEngine(mode="reverse", tokens_per_event=4), "abc", max_tokens=7)
    assert "".join(e.text for e in events) == "cbacbac"
    assert [len(e.token_ids) for e in events] == [4, 3]


def test_stop_string_is_never_returned_and_its_tokens_are_counted():
    events = run(FakeEngine(), "x", max_tokens=40, stop=(" brown", "zzz"))
    assert "".join(e.text for e in events) == "The quick"
    assert (events[-1].finish_reason, events[-1].completion_tokens) == ("stop", 15)
    assert sum(len(e.token_ids) for e in events) == 15


def test_a_possible_stop_prefix_is_held_back_until_decided():
    # "fob" never appears, but "fo" of "fox" could start it: "f" and "fo" wait for the "x".
    events = run(FakeEngine(), "x", max_tokens=20, stop=("fob",))
    texts = [e.text for e in events]
    assert "".join(texts) == CYCLE_TEXT[:20]
    assert "fox" in texts and "f" not in texts
    assert stop_holdback("abc ab", ["abd"]) == 2 and stop_holdback("abc", ["xyz"]) == 0


def test_logprobs_are_fixed_numbers():
    events = run(FakeEngine(tokens_per_event=3), "abcd", max_tokens=5, logprobs=True, prompt_logprobs=True)
    assert events[0].prompt_logprobs == (None, -1.0, -1.0, -1.0)
    assert all(e.prompt_logprobs is None for e in events[1:])
    assert [e.token_logprobs for e in events] == [(-0.5,) * 3, (-0.5,) * 2]


def test_cancel_is_recorded_and_ends_the_stream():
    engine = FakeEngine(token_delay_s=0.01)
    stream = engine.submit(GenerationRequest("slow", (1, 2), SamplingParams(max_tokens=1000)))
    stream.get(timeout=5)
    stream.cancel()
    stream.cancel()  # idempotent
    assert engine.wait_for_cancel("slow", timeout=5)
    assert engine.cancelled == ("slow",)
    events = list(stream)
    assert events[-1].finish_reason == "cancelled"


def test_injected_failures_and_readiness():
    engine = FakeEngine(ready=False)
    assert not engine.ready()
    engine.set_ready(True)
    assert engine.ready()
    engine.inject_failure("submit", "boom")
    with pytest.raises(RuntimeError, match="boom"):
        run(engine, "a", max_tokens=1)
    engine.inject_failure("stream", "kaput")
    (event,) = run(engine, "a", max_tokens=1)
    assert (event.finish_reason, event.error) == ("error", "kaput")
    assert "helios_fake_engine_requests_total 1" in engine.metrics_text()
    engine.shutdown()
    assert not engine.ready()
