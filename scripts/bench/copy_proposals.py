"""Copy proposals on a repetitive workload: editing code the prompt contains.

    python scripts/bench/copy_proposals.py [--sources=learned,copy,both] [--modes=fixed,adaptive]
        [--requests=8]
        [--code_tokens=160] [--restart_tokens=12] [--new_tokens=96] [--concurrency=1]
        [--draft_tokens=3] [--max_model_len=512] [--seed=0] [--json_out=FILE]

Workload: each prompt is a window of --code_tokens tokens of a held-out standard-library file
(text the embedded model never saw), a blank line, then the window's first --restart_tokens
tokens again, so that the model starts rewriting the code it was shown (what an edit of a file
in the prompt looks like). Greedy, --new_tokens new tokens each.

Engines: one with speculation off (the plain greedy reference: every source must produce its text
token for token) and one per speculation mode and proposal source (learned MTP proposals, copy
proposals by prompt lookup, or both, chosen per round), all on the embedded default model. The
speculative engines share one prepared program set: the source changes no program, and with
B x W <= R every program is rectangular, so `fixed` (every round W = D + 1 wide, or as wide as the
copy prefix allows) and `adaptive` (the selector prices each width by its measured cost) differ
only in what the scheduler may select. `fixed` isolates the acceptance of each source; `adaptive`
shows what the selector makes of it on this machine. Requests are served --concurrency at a time.

Measured per source, from the engine's counters (deltas over the run):
  - acceptance: accepted / offered drafts, per source (``scheduler.speculative``'s
    ``copy_*`` and ``learned_*`` counters), and the mean copy prefix offered per copy round;
  - tokens per target forward: output tokens after the first (which prefill emits) divided by
    decode lane-rounds (one per request per frame, counted from the streams' events);
  - wall-clock tokens per second (noisy on a shared CPU: read it against `off` from the same run).
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time

from absl import app, flags
from bench_common import DEFAULT_CACHE_DIR, machine, prompt_windows

from helios_jax.compilation_cache import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_list("sources", ["learned", "copy", "both"], "proposal sources to compare")
flags.DEFINE_list("modes", ["fixed", "adaptive"], "speculation modes of the speculative engines")
flags.DEFINE_integer("requests", 8, "prompts (code windows)")
flags.DEFINE_integer("code_tokens", 160, "tokens of code in each prompt")
flags.DEFINE_integer("restart_tokens", 12, "the code's first tokens repeated at the prompt's end")
flags.DEFINE_integer("new_tokens", 96, "new tokens per request")
flags.DEFINE_integer("concurrency", 1, "requests served at once")
flags.DEFINE_integer("draft_tokens", 3, "D: the deepest proposal depth (and the longest copy)")
flags.DEFINE_integer("max_model_len", 512, "engine context length")
flags.DEFINE_integer("seed", 0, "seed of the code windows")
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_string("compilation_cache_dir", DEFAULT_CACHE_DIR, "persistent compilation cache; empty: off")


def engines(model):
    """{"off": engine, "mode/source": engine, ...}: the speculative engines share one program set."""
    from helios_jax.engine_config import EngineConfig
    from helios_jax.prepare import prepare, warm_up
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(model.tokenizer)
    base = dict(
        request_slots=max(4, FLAGS.concurrency), prefill_chunks=(256,), max_model_len=FLAGS.max_model_len
    )
    off = EngineConfig(speculation="off", draft_tokens=0, **base)
    spec = EngineConfig(speculation="adaptive", draft_tokens=FLAGS.draft_tokens, **base)
    out = {
        "off": HeliosEngine(
            model_config=model.config, params=model.params, tokenizer=tokenizer, engine_config=off
        )
    }
    prepared = prepare(model.config, model.params, spec, progress=None)
    warm_up(prepared.programs, prepared.params)
    for mode in FLAGS.modes:
        config = spec.replace(speculation=mode)
        if config.catalog("helios-default").graphs != spec.catalog("helios-default").graphs:
            raise ValueError(f"{mode} plans other programs than adaptive: raise R or lower the slots")
        for source in FLAGS.sources:
            out[f"{mode}/{source}"] = HeliosEngine(
                model_config=model.config,
                params=prepared.params,
                tokenizer=tokenizer,
                engine_config=config.replace(proposal_source=source),
                programs=prepared.programs,
            )
    return out


def serve(engine, prompts):
    """Greedy requests, --concurrency at a time: per request (tokens, events with tokens)."""
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    results = [None] * len(prompts)

    def one(i):
        request = GenerationRequest(
            f"copy-bench-{time.perf_counter_ns()}-{i}",
            tuple(prompts[i]),
            SamplingParams(max_tokens=FLAGS.new_tokens, temperature=0.0),
        )
        events = [e for e in engine.submit(request) if e.token_ids or e.finish_reason == "error"]
        if any(e.finish_reason == "error" for e in events):
            raise RuntimeError(events[-1].error)
        results[i] = ([t for e in events for t in e.token_ids], len(events))

    for start in range(0, len(prompts), FLAGS.concurrency):
        threads = [
            threading.Thread(target=one, args=(i,))
            for i in range(start, min(start + FLAGS.concurrency, len(prompts)))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def measure(name, engine, prompts) -> dict:
    before = collections.Counter(engine.scheduler.speculative)
    started = time.perf_counter()
    results = serve(engine, prompts)
    wall = time.perf_counter() - started
    d = collections.Counter(engine.scheduler.speculative)
    d.subtract(before)
    tokens = sum(len(t) for t, _ in results)
    lane_rounds = sum(events - 1 for _, events in results)

    def rate(accepted, offered):
        return d[accepted] / d[offered] if d[offered] else None

    return dict(
        source=name,
        output_tokens=tokens,
        lane_rounds=lane_rounds,
        tokens_per_target_forward=(tokens - len(results)) / max(lane_rounds, 1),
        tokens_per_s=tokens / wall,
        wall_s=wall,
        copy_drafts=d["copy_drafts"],
        copy_accepted=d["copy_accepted"],
        copy_acceptance=rate("copy_accepted", "copy_drafts"),
        learned_drafts=d["learned_drafts"],
        learned_accepted=d["learned_accepted"],
        learned_acceptance=rate("learned_accepted", "learned_drafts"),
        outputs=[t for t, _ in results],
    )


def workload(tokenizer) -> list[list[int]]:
    windows = prompt_windows(tokenizer, FLAGS.requests, FLAGS.code_tokens, FLAGS.seed)
    blank = tokenizer.encode("\n\n").ids
    return [w["tokens"] + blank + w["tokens"][: FLAGS.restart_tokens] for w in windows]


def main(argv) -> int:
    del argv
    enable_compilation_cache(FLAGS.compilation_cache_dir)
    from helios_jax.model.default import load_default_model

    model = load_default_model("float32")
    prompts = workload(model.tokenizer)
    built = engines(model)
    try:
        rows = [measure(name, engine, prompts) for name, engine in built.items()]
    finally:
        for engine in built.values():
            engine.shutdown()
    reference = rows[0]["outputs"]
    for row in rows:
        row["equals_plain_greedy"] = row.pop("outputs") == reference
    print(f"{'engine':16} {'copy acc':>9} {'learned acc':>11} {'tok/fwd':>8} {'tok/s':>7} greedy-equal")
    for r in rows:
        copy = "-" if r["copy_acceptance"] is None else f"{r['copy_acceptance']:.3f}"
        learned = "-" if r["learned_acceptance"] is None else f"{r['learned_acceptance']:.3f}"
        print(
            f"{r['source']:16} {copy:>9} {learned:>11} {r['tokens_per_target_forward']:8.2f} "
            f"{r['tokens_per_s']:7.1f} {r['equals_plain_greedy']}"
        )
    if FLAGS.json_out:
        flags_used = {
            k: getattr(FLAGS, k)
            for k in (
                "sources",
                "requests",
                "code_tokens",
                "restart_tokens",
                "new_tokens",
                "concurrency",
                "draft_tokens",
                "max_model_len",
                "seed",
            )
        }
        with open(FLAGS.json_out, "w") as f:
            json.dump(
                dict(command=" ".join(sys.argv), machine=machine(), flags=flags_used, rows=rows), f, indent=1
            )
    return 0 if all(r["equals_plain_greedy"] for r in rows) else 1


if __name__ == "__main__":
    app.run(main)
