"""Cost of a chat prompt with exact message endpoints, against one encode of the same text.

    python scripts/bench/chat_endpoints.py [--messages=2,10,50,200] [--chars=500] [--trials=5]

The embedded model's tokenizer and chat template (`HFTokenizer.from_folder`). A conversation of
--messages alternating user and assistant messages, each --chars characters of this Python's
standard library source. Per size, the median over --trials of:

- ``render_chat``: the prompt ids and every message endpoint (segments between added tokens
  encoded once: `chat_encoding.SegmentEncoder`);
- ``whole-text``: the same endpoints with every prefix rendering encoded whole, the method any
  tokenizer gets when its segments are not independent;
- ``one encode``: ``encode`` of the full rendering, no endpoints (the floor).

Results: docs/chat-templates.md.
"""

from __future__ import annotations

import pathlib
import statistics
import time

from absl import app, flags

from helios_jax.model.default import default_model_path
from helios_jax.runtime import chat_encoding
from helios_jax.runtime.chat_template import control_token_patterns, mark_control_tokens
from helios_jax.runtime.tokenizer import HFTokenizer

FLAGS = flags.FLAGS
flags.DEFINE_list("messages", ["2", "10", "50", "200"], "conversation sizes (messages)")
flags.DEFINE_integer("chars", 500, "characters per message")
flags.DEFINE_integer("trials", 5, "timed repetitions per size (median reported)")


def _median_ms(fn) -> float:
    times = []
    for _ in range(FLAGS.trials):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _whole_text_endpoints(tok: HFTokenizer, messages: list[dict]) -> tuple[int, ...]:
    """Every prefix rendering encoded whole (no segment reuse)."""
    tokens_re, markers_re = control_token_patterns(tok.control_tokens)
    marked = mark_control_tokens(messages, tokens_re)
    text = tok.render_chat_text(marked)

    def encode(rendered: str) -> list[int]:
        return chat_encoding.encode_marked(tok.backend, rendered, markers_re)

    ids = encode(text)
    render = lambda prefix: tok.render_chat_text(list(prefix), add_generation_prompt=False)  # noqa: E731
    return chat_encoding.prefix_endpoints(marked, text, ids, render, encode)


def main(argv):
    del argv
    tok = HFTokenizer.from_folder(default_model_path())
    source = "".join(
        p.read_text() for p in sorted(pathlib.Path(statistics.__file__).parent.glob("json/*.py"))
    )
    for n in map(int, FLAGS.messages):
        text = (source * (1 + n * FLAGS.chars // len(source)))[: n * FLAGS.chars]
        messages = [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": text[i * FLAGS.chars : (i + 1) * FLAGS.chars],
            }
            for i in range(n)
        ]
        ids, endpoints = tok.render_chat(messages)
        assert _whole_text_endpoints(tok, messages) == endpoints
        rendered = tok.render_chat_text(messages)
        fast = _median_ms(lambda: tok.render_chat(messages))  # noqa: B023
        slow = _median_ms(lambda: _whole_text_endpoints(tok, messages))  # noqa: B023
        floor = _median_ms(lambda: tok.encode(rendered))  # noqa: B023
        print(
            f"{n:4d} messages x {FLAGS.chars} chars: {len(ids):6d} tokens, {len(endpoints):3d} endpoints; "
            f"render_chat {fast:8.1f} ms, whole-text {slow:8.1f} ms, one encode {floor:6.1f} ms"
        )


if __name__ == "__main__":
    app.run(main)
