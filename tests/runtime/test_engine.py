"""The engine end to end on a tiny random model: greedy output equals offline greedy decoding,
stop strings, cancellation and slot reuse, and the page pool matching the reservations."""

import dataclasses
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.catalog import GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.model import forward_full_logits
from helios_jax.runtime import compilations
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine
from reference.sampling import processed_logits_naive

from .helpers import model, tokenizer

spec = pytest.mark.spec


REQUEST_PAGES = 80  # fewer than four full-context requests: page pressure before slot pressure


@pytest.fixture(scope="module")
def engine():
    config, params = model()
    ec = EngineConfig(
        request_slots=4,
        prefill_chunks=(64, 256),
        speculation="adaptive",
        draft_tokens=3,
        max_model_len=512,
        kv_pages=4 * 32 + REQUEST_PAGES,  # four snapshot rows at full context, then the requests'
    )
    eng = HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, check_invariants=True
    )
    yield eng
    eng.shutdown()


BUFFER = 512


@jax.jit
def _logits(tokens):
    config, params = model()
    return forward_full_logits(config, params, tokens)


def offline_greedy(prompt, n):
    """Plain greedy decoding with the full (cache-free) forward over a fixed-length buffer:
    attention is causal, so the padding after the context never changes a logit (one compile)."""
    ids = list(prompt)
    for _ in range(n):
        buf = np.zeros(BUFFER, np.int32)
        buf[: len(ids)] = ids
        ids.append(int(jnp.argmax(_logits(jnp.asarray(buf))[len(ids) - 1])))
    return ids[len(prompt) :]


def run(engine, rid, prompt, **sampling):
    stream = engine.submit(GenerationRequest(rid, tuple(prompt), SamplingParams(**sampling)))
    events = list(stream)
    return events, [t for e in events for t in e.token_ids]


@spec(
    "verification/runtime-phase-coverage", "intro/speculative-graph-stages", "planning-queue/page-reservation"
)
def test_concurrent_greedy_requests_equal_offline_greedy_decoding(engine):
    """The engine verifies after every step that the page pool equals the reservations."""
    tok = tokenizer()
    prompts = [tok.encode("def f(x):\n    return x + 1\n") * k for k in (1, 3, 9)]
    streams = [
        engine.submit(GenerationRequest(f"g{i}", tuple(p), SamplingParams(max_tokens=24, temperature=0.0)))
        for i, p in enumerate(prompts)
    ]
    for p, s in zip(prompts, streams):
        events = list(s)
        tokens = [t for e in events for t in e.token_ids]
        assert events[-1].finish_reason in ("length", "stop")
        queue = [e.queue_time_s for e in events]  # reported once, with the first output
        assert queue[0] is not None and queue[0] >= 0 and queue[1:] == [None] * (len(events) - 1)
        expect = offline_greedy(p, len(tokens))
        assert tokens == expect
        assert events[-1].completion_tokens == len(tokens)


def test_stop_strings_are_never_shown(engine, monkeypatch):
    tok = tokenizer()
    prompt = tok.encode("hello world, the quick brown fox")
    events, tokens = run(engine, "s0", prompt, max_tokens=40, temperature=0.0)
    full = tok.decode(tokens)
    stop = full[5:8] if len(full) > 8 else None
    if not stop or not stop.strip():
        pytest.skip("the random model produced no usable stop text")
    events, _ = run(engine, "s1", prompt, max_tokens=40, temperature=0.0, stop=(stop,))
    text = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop" and stop not in text and full.startswith(text)
    # include_stop_str_in_output: the text runs through the stop string's first occurrence
    events, _ = run(
        engine, "s2", prompt, max_tokens=40, temperature=0.0, stop=(stop,), include_stop_str_in_output=True
    )
    kept = "".join(e.text for e in events)
    assert kept == full[: full.find(stop) + len(stop)]
    # skip_special_tokens=False: the request's text is decoded without skipping special tokens
    real, seen = engine.tokenizer.decode, set()

    def decode(ids, skip_special_tokens=True):
        seen.add(skip_special_tokens)
        return real(ids, skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(engine.tokenizer, "decode", decode)
    events, ids = run(engine, "s3", prompt, max_tokens=8, temperature=0.0, skip_special_tokens=False)
    assert seen == {False} and "".join(e.text for e in events) == real(ids, skip_special_tokens=False)


@spec("service-accounting/cancelled-slot-reuse", "planning-queue/cancel-keeps-pages")
def test_cancellation_frees_the_slot_and_reservations_match_the_pool(engine):
    tok = tokenizer()
    # Sampled, so ignore_eos: a request that may end on its own before the cancellation lands
    # (up to two K-step frames are in flight) would make the test a draw.
    long = GenerationRequest(
        "c0", tuple(tok.encode("for i in range(10):\n") * 4), SamplingParams(max_tokens=400, ignore_eos=True)
    )
    stream = engine.submit(long)
    first = stream.get(timeout=60)
    assert first.token_ids
    stream.cancel()
    while not stream.finished:
        last = stream.get(timeout=60)
    assert last.finish_reason == "cancelled"
    deadline = time.time() + 30
    while engine.scheduler.requests and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.scheduler.requests and not engine.scheduler.owned_pages()
    events, tokens = run(engine, "c1", tok.encode("import os\n"), max_tokens=8, temperature=0.0)
    assert tokens == offline_greedy(tok.encode("import os\n"), len(tokens))  # the reused slot starts clean


@spec("prerequisites/all-shape-pairs")
def test_a_request_for_prompt_scores_runs_behind_initialize(engine):
    """Echo + logprobs: the engine initializes every request, and the pair search must pair
    INITIALIZE with scored prefill, or the request never runs. Its prompt log-probabilities and
    their 5 most probable alternatives equal log-softmax of the full forward's logits (the first
    token has none), and its output is plain greedy decoding."""
    tok = tokenizer()
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    done = []

    def consume():
        sampling = dict(max_tokens=4, temperature=0.0, prompt_logprobs=True, logprobs=True, top_logprobs=5)
        done.append(run(engine, "p0", prompt, **sampling))

    import threading

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert done, "the scored request never completed"
    events, tokens = done[0]
    assert tokens == offline_greedy(prompt, len(tokens))
    scores = events[0].prompt_logprobs
    assert scores is not None and len(scores) == len(prompt) and scores[0] is None
    buf = np.zeros(BUFFER, np.int32)
    buf[: len(prompt)] = prompt
    logp = np.asarray(jax.nn.log_softmax(_logits(jnp.asarray(buf)), axis=-1))
    want = [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
    np.testing.assert_allclose(scores[1:], want, atol=1e-4)
    tops = events[0].prompt_top_logprobs
    assert len(tops) == len(prompt) and tops[0] is None
    for i in range(1, len(prompt)):
        ids, values = [t for t, _ in tops[i]], [v for _, v in tops[i]]
        np.testing.assert_allclose(values, np.sort(logp[i - 1])[::-1][:5], atol=1e-4)
        np.testing.assert_allclose(values, logp[i - 1, ids], atol=1e-4)
    assert all(e.prompt_top_logprobs is None for e in events[1:])


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


@spec("verification/runtime-phase-coverage")
def test_serving_a_mixed_workload_after_warm_up_compiles_nothing(engine):
    """No XLA compilation after the engine's warm-up (the docstring of test_no_recompile.py)."""
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
    text = engine.metrics_text()
    assert f"helios_xla_compilations_total {compilations.compilation_count()}" in text
    assert 'helios_frame_observations_total{observation="waited"}' in text
    slots = engine.scheduler.slots.available
    assert slots == engine.config.request_slots  # everything finished: every slot free
    assert f"helios_engine_free_slots {slots}" in text
    assert f"helios_engine_free_kv_pages {engine.scheduler.pages.available}" in text


def _offline_scores(sequence):
    buf = np.zeros(BUFFER, np.int32)
    buf[: len(sequence)] = sequence
    return np.asarray(jax.nn.log_softmax(_logits(jnp.asarray(buf)), axis=-1))


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.9, top_k=7, seed=5)])
def test_generated_token_logprobs_equal_the_full_forward(engine, settings):
    """Each generated token's log-probability and its top alternatives are the raw model
    distribution at its position (log-softmax of the full forward's logits), greedy (the fast
    path) and sampled, through prefill, decode and speculative programs."""
    tok = tokenizer()
    prompt = tok.encode("def f(x):\n    return x + 1\n") * 2
    events, tokens = run(
        engine,
        f"lp{settings['temperature']}",
        prompt,
        max_tokens=12,
        logprobs=True,
        top_logprobs=5,
        **settings,
    )
    values = [v for e in events for v in e.token_logprobs or ()]
    tops = [a for e in events for a in e.top_logprobs or ()]
    assert len(values) == len(tops) == len(tokens) > 1
    logp = _offline_scores(list(prompt) + tokens)
    for i, token in enumerate(tokens):
        row = logp[len(prompt) + i - 1]
        assert abs(values[i] - row[token]) < 1e-4, (i, values[i], row[token])
        ids = [t for t, _ in tops[i]]
        np.testing.assert_allclose([v for _, v in tops[i]], np.sort(row)[::-1][:5], atol=1e-4)
        np.testing.assert_allclose([v for _, v in tops[i]], row[ids], atol=1e-4)


def test_out_of_range_requests_raise_value_error_and_change_nothing(engine):
    vocab = engine.vocab_size
    for bad in (
        dict(seed=2**64),
        dict(seed=-(2**63) - 1),
        dict(top_k=-1),
        dict(temperature=float("nan")),
        dict(logprobs=True, top_logprobs=21),
    ):
        with pytest.raises(ValueError):
            SamplingParams(max_tokens=4, **bad)
    for prompt in ((vocab,), (-1,), ()):
        with pytest.raises(ValueError, match="prompt_tokens"):
            engine.submit(GenerationRequest("bad", prompt, SamplingParams(max_tokens=4)))
    assert engine.ready() and not engine._by_id


def test_huge_top_k_is_off_and_huge_seeds_are_deterministic(engine):
    """top_k >= the vocabulary keeps every token (the same text as top_k = 0); seeds up to 2**64
    fold into the program seed deterministically (the issue's engine-killing requests)."""
    prompt = tokenizer().encode("hello world")
    _, off = run(engine, "k0", prompt, max_tokens=8, temperature=1.0, seed=9)
    _, huge = run(engine, "k1", prompt, max_tokens=8, temperature=1.0, seed=9, top_k=2**31)
    assert huge == off
    _, a = run(engine, "s63a", prompt, max_tokens=8, temperature=1.0, seed=2**63)
    _, b = run(engine, "s63b", prompt, max_tokens=8, temperature=1.0, seed=2**63)
    assert a == b and len(a) == 8 and engine.ready()


POISON = (7, 7, 7, 7, 7, 7, 7, 5)


def test_a_request_that_fails_to_pack_fails_alone(engine, monkeypatch):
    """Packing raises for one request's lanes: it ends with an error, a concurrent request
    completes normally, the engine stays healthy and serves the next request."""
    from helios_jax.runtime import executor as executor_module

    real = executor_module.pack_inputs

    def pack(program, plan, info):
        if any(info[lane.handle.rid].prompt == POISON for lane in plan.lanes):
            raise OverflowError("injected packing fault")
        return real(program, plan, info)

    monkeypatch.setattr(executor_module, "pack_inputs", pack)
    tok = tokenizer()
    good = tok.encode("import os\n")
    streams = [
        engine.submit(GenerationRequest(r, tuple(p), SamplingParams(max_tokens=10, temperature=0.0)))
        for r, p in (("ok", good), ("poison", POISON))
    ]
    ok, poison = (list(s) for s in streams)
    assert poison[-1].finish_reason == "error" and "injected packing fault" in poison[-1].error
    assert ok[-1].finish_reason == "length"
    assert [t for e in ok for t in e.token_ids] == offline_greedy(good, 10)
    assert engine.ready()
    _, later = run(engine, "after", good, max_tokens=4, temperature=0.0)
    assert later == offline_greedy(good, 4)


def test_a_request_the_scheduler_refuses_fails_alone(engine, monkeypatch):
    """The scheduler refuses one admission with ValueError (a request no prepared program can
    serve): that request ends with an error naming why; a concurrent one is served."""
    real = engine.scheduler.admit

    def admit(prompt, **kw):
        if tuple(prompt) == POISON:
            raise ValueError("injected admission refusal")
        return real(prompt, **kw)

    monkeypatch.setattr(engine.scheduler, "admit", admit)
    good = tokenizer().encode("import os\n")
    streams = [
        engine.submit(GenerationRequest(r, tuple(p), SamplingParams(max_tokens=6, temperature=0.0)))
        for r, p in (("poison", POISON), ("ok", good))
    ]
    poison, ok = (list(s) for s in streams)
    assert poison[-1].finish_reason == "error" and "injected admission refusal" in poison[-1].error
    assert [t for e in ok for t in e.token_ids] == offline_greedy(good, 6) and engine.ready()


def test_a_request_no_plan_serves_fails_after_the_stall_limit(engine, monkeypatch):
    """The loop idles with a selectable request and no plan (a scheduler that breaks its own
    liveness): the request fails with an error once the stall limit passes, instead of waiting
    forever with its stream open; the engine then serves as before."""
    monkeypatch.setattr(engine, "stall_limit_s", 0.3)
    monkeypatch.setattr(engine.scheduler, "plan", lambda: None)
    stream = engine.submit(
        GenerationRequest("stalled", POISON, SamplingParams(max_tokens=4, temperature=0.0))
    )
    last = stream.get(timeout=20)  # without the guard: queue.Empty, the request never ends
    assert last.finish_reason == "error" and "no prepared program served" in last.error
    monkeypatch.undo()
    good = tokenizer().encode("import os\n")
    assert run(engine, "after-stall", good, max_tokens=4, temperature=0.0)[1] == offline_greedy(good, 4)


class _FailingProgram:
    def __init__(self, program, failures):
        self.program, self.failures = program, failures

    def __getattr__(self, name):
        return getattr(self.program, name)

    def __call__(self, *args):
        self.failures.append(self.program)
        raise RuntimeError("injected device fault")


class _FailOnce(dict):
    """The engine's programs; the first generation program called after arming raises."""

    def __init__(self, programs):
        super().__init__()
        self.programs, self.failures = programs, []

    def __getitem__(self, key):
        program = self.programs[key]
        if self.failures or program.descriptor.kind.value in ("initialize", "prefill", "scored_prefill"):
            return program
        return _FailingProgram(program, self.failures)

    def init_state(self, **kw):
        return self.programs.init_state(**kw)


def test_a_failed_program_fails_resident_requests_and_the_engine_recovers(engine, monkeypatch):
    """A program's failure loses the donated state: the resident requests end with an error, the
    engine re-initialises its device state and serves the next request exactly."""
    faulty = _FailOnce(engine.executor.programs)
    monkeypatch.setattr(engine.executor, "programs", faulty)
    monkeypatch.setattr(engine, "_programs", faulty)
    good = tokenizer().encode("for i in range(10):\n")
    events, _ = run(engine, "dev0", good, max_tokens=10, temperature=0.0)
    assert faulty.failures and events[-1].finish_reason == "error" and "injected" in events[-1].error
    deadline = time.time() + 30  # degraded (503) only while the state is rebuilt
    while not engine.ready() and time.time() < deadline:
        time.sleep(0.01)
    assert engine.ready()
    _, later = run(engine, "dev1", good, max_tokens=6, temperature=0.0)
    assert later == offline_greedy(good, 6)
    deadline = time.time() + 30
    while engine.scheduler.requests and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.scheduler.requests and not engine.scheduler.owned_pages()  # slots and pages freed


def _served(engine, rid, text, source, max_tokens=40):
    """Serve one greedy request under `source` on a fresh engine that shares `engine`'s compiled
    programs, in `fixed` speculation (every round on the D + 1 program, as wide as the copy prefix
    allows: under `adaptive` whether a round is wide depends on the costs the engine measured so
    far). Returns the prompt, the tokens, the wide speculative frames and the draft counters."""
    ec = dataclasses.replace(engine.config, speculation="fixed", proposal_source=source)
    config, _ = model()
    params, programs = engine.executor.params, engine.executor.programs
    fresh = HeliosEngine(
        model_config=config, params=params, tokenizer=tokenizer(), engine_config=ec, programs=programs
    )
    try:
        prompt = tokenizer().encode(text)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        tokens = [
            t for e in fresh.submit(GenerationRequest(rid, tuple(prompt), sampling)) for t in e.token_ids
        ]
        wide = sum(
            1
            for graph, _ in fresh.executor.history
            if graph.kind is GraphKind.SPECULATIVE and graph.token_capacity > 1
        )
        return prompt, tokens, wide, dict(fresh.scheduler.speculative), fresh.scheduler.population
    finally:
        fresh.shutdown()


COPIED_CODE = "def f(x):\n    return x + 1\n" * 3


@spec("speculative-coverage/copy-d", "speculative-coverage/copy-no-draws")
def test_copy_proposals_serve_plain_greedy_text(engine):
    """Prompt lookup drafts from repeated code and the model's own looping greedy text; the wide
    speculative frames verify the copies and the text is plain greedy decoding's."""
    prompt, tokens, wide_frames, drafts, _ = _served(engine, "copy", COPIED_CODE, "copy")
    assert len(tokens) == 40 and tokens == offline_greedy(prompt, 40)
    assert wide_frames > 0  # copy-proposal rounds ran
    assert drafts.get("copy_drafts", 0) > 0 and drafts.get("copy_accepted", 0) > 0
    assert drafts.get("learned_drafts", 0) == 0  # copies draw nothing


@spec("confidence-acceptance/per-source")
def test_a_request_allowed_both_sources_uses_and_learns_each(engine):
    """Under "both", each round takes the source whose optimistic estimate promises more (an
    untried source is tried), so copies and MTP drafts both run; each source's pooled estimate
    observes rounds, and the text is plain greedy decoding's."""
    prompt, tokens, wide_frames, drafts, population = _served(engine, "both", COPIED_CODE + "for i", "both")
    assert tokens == offline_greedy(prompt, len(tokens))
    assert wide_frames > 0 and drafts.get("learned_drafts", 0) > 0
    assert drafts.get("copy_drafts", 0) > 0 and drafts.get("copy_accepted", 0) > 0
    assert all(pool.revision > 0 for pool in population.acceptance_pools.values())


def test_a_request_naming_an_unknown_source_is_refused(engine):
    request = GenerationRequest("bad-source", (1, 2, 3), SamplingParams(max_tokens=2), proposal_source="mtp")
    with pytest.raises(ValueError, match="proposal_source"):
        engine.submit(request)


def test_echo_with_top_logprobs_over_http_with_the_openai_client(engine):
    """A completions request with echo and logprobs: 3 answers, in the OpenAI format, every
    prompt token but the first with its log-probability and a top_logprobs dict of its 3 most
    probable alternatives (plus the token itself), equal to the full forward's log-softmax."""
    import openai

    from ..serve.helpers import live_server

    tok = tokenizer()
    prompt = "def add(a, b):\n    return a + b\n"
    ids = tok.encode(prompt)
    with live_server(engine, shutdown_engine=False) as server:
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
        ) as client:
            r = client.completions.create(
                model=engine.model_name, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=3
            )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt) and lp.tokens[: len(ids)] == [tok.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    logp = _offline_scores(ids)
    for i in range(1, len(ids)):
        row = logp[i - 1]
        assert abs(lp.token_logprobs[i] - row[ids[i]]) < 1e-4
        best = np.argsort(row)[::-1][:3]
        want = {tok.decode([int(t)]): float(row[t]) for t in best}
        want.setdefault(tok.decode([ids[i]]), float(row[ids[i]]))
        got = lp.top_logprobs[i]
        assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-4 for k in want), (i, got, want)


# == checkpoints in serving ===================================================================
def _checkpoint_counts(engine) -> dict:
    stats = engine.checkpoint_stats
    return dict(
        restores=stats.restores,
        restored=stats.restored_tokens,
        snapshots=sum(stats.snapshots.values()),
        preemptions=stats.preemptions,
        continuations=stats.continuations,
    )


def _settle(engine) -> None:
    """Wait until every request retired (terminal captures included)."""
    deadline = time.time() + 60
    while engine.scheduler.requests and time.time() < deadline:
        time.sleep(0.02)
    assert not engine.scheduler.requests


@spec(
    "planning-queue/anchor-prompt-end",
    "prerequisites/snapshot-preserves",
    "verification/runtime-phase-coverage",
)
def test_a_snapshot_and_a_restore_serve_plain_greedy_text(engine):
    """The first request captures its prompt end (an anchor snapshot) and keeps decoding; the
    second, whose prompt extends it, restores it and prefills only the rest. Both texts equal
    plain greedy decoding of their whole prompts (a cold run)."""
    tok = tokenizer()
    first = tok.encode("import os\nimport sys\nprint(os.getcwd(), sys.argv)\n")
    before = _checkpoint_counts(engine)
    _, tokens = run(engine, "ck0", first, max_tokens=12, temperature=0.0)
    assert tokens == offline_greedy(first, len(tokens))
    _settle(engine)
    assert _checkpoint_counts(engine)["snapshots"] > before["snapshots"]
    second = first + tok.encode("for i in range(10):\n    print(i)\n")
    restored = _checkpoint_counts(engine)
    events, tokens = run(engine, "ck1", second, max_tokens=12, temperature=0.0)
    assert tokens == offline_greedy(second, len(tokens))
    after = _checkpoint_counts(engine)
    assert after["restores"] == restored["restores"] + 1
    assert after["restored"] - restored["restored"] >= len(first)  # only the rest was prefilled
    assert events[-1].prompt_tokens == len(second)
    text = engine.metrics_text()
    assert f"helios_checkpoint_restores_total {after['restores']}" in text
    assert 'helios_checkpoint_snapshots_total{role="anchor"}' in text


def _chat(tok, turns: list[tuple[str, str]]) -> tuple[list[int], tuple[int, ...]]:
    """A chat-template prompt (im_start/im_end) and its message endpoints, ending with the
    assistant's header (as the server's template does)."""
    ids, ends = [], []
    for role, text in turns:
        ids += tok.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")
        ends.append(len(ids))
    ids += tok.encode("<|im_start|>assistant\n")
    return ids, tuple(ends)


@spec("planning-queue/anchor-last-message", "planning-queue/exact-endpoints")
def test_the_second_turn_of_a_chat_restores_the_first(engine):
    """Turn two's prompt repeats turn one's conversation: it restores a checkpoint of at least
    turn one's messages and prefills only the rest; its text is plain greedy decoding."""
    tok = tokenizer()
    history = [("system", "You write short python."), ("user", "def f(x):\n    return x + 1\n")]
    prompt, ends = _chat(tok, history)
    request = GenerationRequest("chat0", tuple(prompt), SamplingParams(max_tokens=10, temperature=0.0), ends)
    reply = [t for e in engine.submit(request) for t in e.token_ids]
    assert reply == offline_greedy(prompt, len(reply))
    _settle(engine)
    history += [("assistant", tok.decode(reply)), ("user", "hello world, the quick brown fox")]
    prompt2, ends2 = _chat(tok, history)
    before = _checkpoint_counts(engine)
    request = GenerationRequest(
        "chat1", tuple(prompt2), SamplingParams(max_tokens=10, temperature=0.0), ends2
    )
    second = [t for e in engine.submit(request) for t in e.token_ids]
    after = _checkpoint_counts(engine)
    assert second == offline_greedy(prompt2, len(second))
    assert after["restores"] == before["restores"] + 1
    assert after["restored"] - before["restored"] >= ends[-1]  # turn one's messages at least


@spec("prerequisites/preemption-no-complete", "prerequisites/terminal-age-start")
def test_preemption_under_page_pressure_still_serves_plain_greedy_text(engine):
    """Three long requests, two of which fill the pool's pages while two slots stay free: the
    third preempts a decoding request (no delay); the victim continues as its prompt plus its
    output (restoring its captured state, or recomputing it) and every text equals plain greedy
    decoding."""
    tok = tokenizer()
    base = tok.encode("hello world, the quick brown fox jumps over the lazy dog\n")
    prompts = [tok.encode(f"# task {i}\n") + base * 13 for i in range(3)]
    need = -(-(len(prompts[0]) + 8) // engine.config.page_size)
    assert 2 * need <= REQUEST_PAGES < 3 * need  # two fit, the third waits for pages
    before = _checkpoint_counts(engine)
    delay = engine.preemptions.delay_ms
    engine.preemptions.delay_ms = 0.0
    try:
        streams = [
            engine.submit(
                GenerationRequest(f"pre{i}", tuple(p), SamplingParams(max_tokens=8, temperature=0.0))
            )
            for i, p in enumerate(prompts)
        ]
        results = [list(s) for s in streams]
    finally:
        engine.preemptions.delay_ms = delay
    after = _checkpoint_counts(engine)
    assert after["preemptions"] > before["preemptions"]
    assert after["continuations"] > before["continuations"]
    for p, events in zip(prompts, results):
        tokens = [t for e in events for t in e.token_ids]
        assert events[-1].finish_reason in ("length", "stop")
        assert events[-1].completion_tokens == len(tokens) and events[-1].prompt_tokens == len(p)
        assert tokens == offline_greedy(p, len(tokens))
    assert f"helios_preemptions_total {after['preemptions']}" in engine.metrics_text()
    print("preemption", {k: after[k] - before[k] for k in after})
    _settle(engine)


def test_request_stop_ids_and_ignore_eos_follow_plain_greedy_text(engine, monkeypatch):
    """A request's stop id ends its output at that token's first occurrence in the plain greedy
    text (kept in the output), through the scheduler's and the programs' stop checks; with
    ``ignore_eos`` the tokenizer's EOS ids no longer end it."""
    prompt = tokenizer().encode("stop ids: one two three four")
    greedy = offline_greedy(prompt, 12)
    stop = greedy[4]
    cut = greedy[: greedy.index(stop) + 1]
    events, tokens = run(engine, "sid0", prompt, max_tokens=12, temperature=0.0, stop_token_ids=(stop,))
    assert (tokens, events[-1].finish_reason) == (cut, "stop")
    monkeypatch.setattr(engine.tokenizer, "eos_token_ids", (stop,))
    events, tokens = run(engine, "sid1", prompt, max_tokens=12, temperature=0.0)
    assert (tokens, events[-1].finish_reason) == (cut, "stop")
    events, tokens = run(engine, "sid2", prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
    assert (tokens, events[-1].finish_reason) == (greedy, "length")
    with pytest.raises(ValueError, match="stop_token_ids"):
        run(engine, "sid3", prompt, max_tokens=4, stop_token_ids=(1, 2, 3, 4))
    assert engine.ready() and not engine._by_id


def test_n_greedy_choices_of_a_prompt_batch_over_http_equal_plain_greedy_decoding(engine):
    """Two prompts, n = 2, greedy: four engine requests whose texts, by choice index (prompt * n
    + sample), are each prompt's plain greedy text; usage counts each prompt once."""
    from ..serve.helpers import live_server, post

    tok = tokenizer()
    prompts = ["first prompt: alpha", "second prompt: beta gamma"]
    # the text of the greedy tokens, less an incomplete character at the end (detokenize.py)
    want = [tok.decode(offline_greedy(tok.encode(p), 6)).rstrip("\ufffd") for p in prompts]
    body = {"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0}
    with live_server(engine, shutdown_engine=False) as server:
        r = post(server, "/v1/completions", body, timeout=120).json()
    assert [(c["index"], c["text"]) for c in r["choices"]] == list(
        enumerate([want[0], want[0], want[1], want[1]])
    )
    assert r["usage"]["prompt_tokens"] == sum(len(tok.encode(p)) for p in prompts)


PROCESSED = dict(
    presence_penalty=0.7,
    frequency_penalty=0.5,
    repetition_penalty=1.4,
    logit_bias=((40, 2.0), (41, -5.0)),
    min_tokens=6,
    bad_token_ids=(10,),
)


def offline_processed(prompt, n, stops):
    """Plain greedy decoding over the logits after the numpy processors (reference/sampling.py)."""
    ids, out = list(prompt), []
    for _ in range(n):
        buf = np.zeros(BUFFER, np.int32)
        buf[: len(ids)] = ids
        logits = np.asarray(_logits(jnp.asarray(buf))[len(ids) - 1])
        processed = processed_logits_naive(
            logits,
            outputs=out,
            prompt=prompt,
            presence=PROCESSED["presence_penalty"],
            frequency=PROCESSED["frequency_penalty"],
            repetition=PROCESSED["repetition_penalty"],
            logit_bias=dict(PROCESSED["logit_bias"]),
            banned=PROCESSED["bad_token_ids"],
            stops=stops,
            min_tokens=PROCESSED["min_tokens"],
        )
        out.append(int(np.argmax(processed)))
        ids.append(out[-1])
    return out


def test_greedy_output_with_processors_equals_offline_processed_decoding(engine):
    """Penalties, logit_bias, a bad word and min_tokens through the adaptive speculative engine
    (prefill, mixed and speculative frames): the text of plain step-by-step processed greedy
    decoding, and not the unprocessed one."""
    tok = tokenizer()
    prompt = tok.encode("def f(x):\n    return x + 1\n") * 2
    _, tokens = run(engine, "processed", prompt, max_tokens=20, temperature=0.0, **PROCESSED)
    stops = tuple(tok.eos_token_ids)
    expect = offline_processed(prompt, len(tokens), stops)
    assert tokens == expect and len(tokens) >= PROCESSED["min_tokens"]
    assert tokens != offline_greedy(prompt, len(tokens))
