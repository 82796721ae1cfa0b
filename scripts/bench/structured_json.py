"""Structured output on the embedded model: sampled JSON outputs against a small schema.

    python scripts/bench/structured_json.py [--samples=100] [--max_tokens=96] [--concurrency=8]
        [--speculation=adaptive] [--whitespace=any,compact] [--unconstrained] [--json_out=FILE]

One engine, built as ``python -m helios_jax.serve`` builds it on the embedded default model
(helios_jax/assets/default_model, a tiny Qwen3; float32 on a CPU), with the persistent
compilation cache on. Each sample is one request at temperature 1 (unseeded: the engine's own
per-request streams) with the chat prompt below and the schema as its grammar, compiled once by
the engine's grammars, as the server compiles ``response_format: {"type": "json_schema"}``, once
with any whitespace between elements (vLLM's default) and once compact
(``disable_any_whitespace``). Every
output is checked against the schema by hand (jsonschema is not a dependency): a JSON object with
exactly the keys name (string of 1..20 characters), age (integer 0..120) and city (string of
1..20 characters). `--unconstrained` also samples the same prompt without the grammar, as a
baseline of how often the model writes a valid object by itself.
"""

from __future__ import annotations

import json
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("samples", 100, "sampled outputs")
flags.DEFINE_integer("max_tokens", 96, "output limit per sample")
flags.DEFINE_integer("concurrency", 8, "request slots")
flags.DEFINE_string("speculation", "adaptive", "off, fixed or adaptive")
flags.DEFINE_list(
    "whitespace", ["any", "compact"], "JSON grammars measured: any whitespace (vLLM's default), compact"
)
flags.DEFINE_bool("unconstrained", False, "also sample without the grammar (baseline)")
flags.DEFINE_string("json_out", None, "write the results as JSON here")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPT = "Describe a person as a JSON object with their name, age and city."


def valid(text: str) -> bool:
    """`text` satisfies SCHEMA (checked by hand)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    if not isinstance(obj, dict) or set(obj) != {"name", "age", "city"}:
        return False
    strings = all(isinstance(obj[k], str) and 1 <= len(obj[k]) <= 20 for k in ("name", "city"))
    return strings and type(obj["age"]) is int and 0 <= obj["age"] <= 120


def build():
    from helios_jax.engine_options import EngineOptions
    from helios_jax.runtime.engine import build_real_engine

    options = EngineOptions(concurrency=FLAGS.concurrency, speculation=FLAGS.speculation)
    return build_real_engine(options, progress=None)  # the server's own engine, embedded model


def sample(engine, prompt, grammar, tag: str) -> dict:
    """`--samples` requests at once; their texts, finish reasons and timing."""
    from helios_jax.runtime.api import GenerationRequest, SamplingParams

    sampling = SamplingParams(max_tokens=FLAGS.max_tokens, temperature=1.0)
    start = time.perf_counter()
    streams = [
        engine.submit(GenerationRequest(f"{tag}-{i}", prompt, sampling, grammar=grammar))
        for i in range(FLAGS.samples)
    ]
    texts, reasons, tokens = [], [], 0
    for stream in streams:
        events = list(stream)
        texts.append("".join(e.text for e in events))
        reasons.append(events[-1].finish_reason)
        tokens += events[-1].completion_tokens
    wall = time.perf_counter() - start
    ok = [valid(t) for t in texts]
    return dict(
        valid=sum(ok),
        samples=len(texts),
        finish_reasons={r: reasons.count(r) for r in sorted(set(reasons))},
        output_tokens=tokens,
        wall_s=round(wall, 2),
        tokens_per_s=round(tokens / wall, 1),
        examples=texts[:3],
        invalid=[t for t, v in zip(texts, ok) if not v][:3],
        stopped_invalid=sum(1 for v, r in zip(ok, reasons) if r == "stop" and not v),
    )


def main(argv) -> None:
    del argv
    from helios_jax.runtime.grammar import GrammarSpec

    t = time.perf_counter()
    engine = build()
    built_s = time.perf_counter() - t
    try:
        prompt, _ = engine.tokenizer.render_chat([{"role": "user", "content": PROMPT}])
        result: dict = dict(build_s=round(built_s, 1))
        for whitespace in FLAGS.whitespace:
            spec = GrammarSpec("json_schema", json.dumps(SCHEMA), any_whitespace=whitespace == "any")
            t = time.perf_counter()
            grammar = engine.grammars.compile(spec)
            compile_ms = round((time.perf_counter() - t) * 1e3, 1)
            result[whitespace] = dict(
                compile_grammar_ms=compile_ms, **sample(engine, tuple(prompt), grammar, whitespace)
            )
        if FLAGS.unconstrained:
            result["unconstrained"] = sample(engine, tuple(prompt), None, "free")
    finally:
        engine.shutdown()
    text = json.dumps(result, indent=1)
    print(text)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            f.write(text + "\n")
    # An output the grammar ended ("stop") that is invalid would be a broken constraint; outputs
    # cut by max_tokens are unfinished documents, counted but not failed on.
    sys.exit(1 if any(result[w]["stopped_invalid"] for w in FLAGS.whitespace) else 0)


if __name__ == "__main__":
    app.run(main)
