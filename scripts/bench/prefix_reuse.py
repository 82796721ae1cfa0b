"""Time to first token of a chat's next turn: a restored 2,000-token history against a cold one.

    python scripts/bench/prefix_reuse.py [--history_tokens=2000] [--reply_tokens=32] [--trials=5]
        [--json_out=FILE]

The engine is the server's default (`python -m helios_jax.serve` with no flags: the embedded
model, `EngineOptions()`), built once with the persistent compilation cache on. Per trial:

1. turn one: a chat whose user message is --history_tokens tokens of held-out text (files the
   model never saw), greedy, --reply_tokens tokens; the engine captures its conversation anchor
   (the end of that message) and the request retires;
2. turn two, **warm**, right after: the same conversation plus the assistant's reply and a new
   short user message (the server's chat template, so message endpoints are exact), max_tokens
   1: its prompt extends the anchor, so it restores the history and prefills only the rest;
3. turn two, **cold**: the same token sequence with one token of the system message changed, so no
   stored prefix matches: the same length, prefilled from scratch.

Warm comes right after turn one, as a chat's next turn does: with the default four checkpoint
rows, the cold request's own captures would evict turn one's anchor (least recent demand) if it
ran in between. Time to first token is submission to the first event carrying a token, read on the
submitting thread. Each trial uses another history window, so nothing is restored across trials.
Reported: both medians, their ratio (the figure: docs/checkpoints.md), the prompt lengths, the
restored tokens and the programs each measured request ran (name and device ms).
"""

from __future__ import annotations

import json
import statistics
import time
import types

from absl import app, flags
from bench_common import machine, prompt_windows

from helios_jax.engine_options import EngineOptions
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import build_real_engine

FLAGS = flags.FLAGS
flags.DEFINE_integer("history_tokens", 2000, "tokens of the first user message (the history)")
flags.DEFINE_integer("reply_tokens", 32, "tokens of the assistant's first reply")
flags.DEFINE_integer("trials", 5, "warm/cold pairs")
flags.DEFINE_integer("seed", 0, "history windows")
flags.DEFINE_string("json_out", None, "write the figures here")

SYSTEM = "You are a careful python reviewer."
QUESTION = "Which function in this file would you test first, and why?"


def first_token_ms(engine, rid: str, prompt, endpoints, max_tokens: int = 1) -> tuple[float, list[int]]:
    """Milliseconds from submission to the first token, and every token of the response."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    start = time.perf_counter()
    stream = engine.submit(GenerationRequest(rid, tuple(prompt), sampling, tuple(endpoints)))
    first, tokens = None, []
    for event in stream:
        if event.token_ids and first is None:
            first = (time.perf_counter() - start) * 1e3
        tokens += event.token_ids
    if first is None:
        raise RuntimeError(f"{rid} produced no token")
    return first, tokens


def settle(engine) -> None:
    while engine.scheduler.requests:  # terminal captures and releases finish
        time.sleep(0.005)


def programs_since(engine, mark: int) -> list[str]:
    """The programs completed since the executor's history held `mark` entries: name and ms."""
    history = list(engine.executor.history)[mark:]
    return [f"{g.name} {max(t.device_intervals_ns) / 1e6:.1f}" for g, t in history]


def measured(engine, rid: str, prompt, endpoints) -> tuple[float, list[str], int]:
    """Time to first token, the programs that ran for it, and the prompt tokens it restored."""
    mark, restored = len(engine.executor.history), engine.checkpoint_stats.restored_tokens
    ms, _ = first_token_ms(engine, rid, prompt, endpoints)
    settle(engine)
    return ms, programs_since(engine, mark), engine.checkpoint_stats.restored_tokens - restored


def trial(engine, i: int, history: str) -> dict:
    """Turn one, then turn two warm (right after it, as a chat's next turn comes), then cold."""
    tok = engine.tokenizer
    messages = [dict(role="system", content=SYSTEM), dict(role="user", content=history)]
    prompt, ends = tok.apply_chat_template(messages)
    _, reply = first_token_ms(engine, f"t{i}-turn1", prompt, ends, FLAGS.reply_tokens)
    settle(engine)
    messages += [dict(role="assistant", content=tok.decode(reply)), dict(role="user", content=QUESTION)]
    warm_prompt, warm_ends = tok.apply_chat_template(messages)
    cold_prompt = list(warm_prompt)
    cold_prompt[3] = (cold_prompt[3] + 1 + i) % tok.vocab_size  # inside the system message
    store = engine.scheduler.captures.checkpoints
    stored = sorted(
        (cp.role.name.lower(), cp.length, cp.owner) for cp in store.entries.values() if cp.ready
    )  # what turn two can find: (role, tokens, owner request)
    out = dict(prompt_tokens=len(warm_prompt), history_prompt_tokens=len(prompt), stored=stored)
    for which, p in (("warm", warm_prompt), ("cold", cold_prompt)):
        ms, programs, restored = measured(engine, f"t{i}-{which}", p, warm_ends)
        out.update({f"{which}_ms": ms, f"{which}_programs": programs, f"{which}_restored_tokens": restored})
    return out


def main(argv):
    del argv
    engine = build_real_engine(EngineOptions(), progress=print)
    try:
        encoder = types.SimpleNamespace(
            encode=lambda text: types.SimpleNamespace(ids=engine.tokenizer.encode(text))
        )
        windows = prompt_windows(encoder, FLAGS.trials + 1, FLAGS.history_tokens, FLAGS.seed)
        texts = [engine.tokenizer.decode(w["tokens"]) for w in windows]
        trial(engine, -1, texts[-1])  # first executions of every program on this path
        trials = [trial(engine, i, texts[i]) for i in range(FLAGS.trials)]
    finally:
        engine.shutdown()
    warm = statistics.median(t["warm_ms"] for t in trials)
    cold = statistics.median(t["cold_ms"] for t in trials)
    result = dict(
        machine=machine(),
        history_tokens=FLAGS.history_tokens,
        trials=trials,
        warm_median_ms=warm,
        cold_median_ms=cold,
        ratio=warm / cold,
        metrics=[line for line in engine.metrics_text().splitlines() if "checkpoint" in line],
    )
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"time to first token: warm {warm:.1f} ms, cold {cold:.1f} ms, ratio {warm / cold:.3f}")
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    app.run(main)
