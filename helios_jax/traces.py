"""Production request traces for the scheduling simulator (Azure LLM inference trace format).

The format is a CSV with a header ``TIMESTAMP,ContextTokens,GeneratedTokens``: one request per
row, its arrival time (``YYYY-MM-DD HH:MM:SS.fffffff``, seven fractional digits), its prompt
length and the number of tokens it generated. The conversation sample of the 2023 trace
(Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024;
AzurePublicDataset, CC-BY 4.0) is read by :func:`read_azure_trace`.

A replay (:func:`replay_requests`) takes a window of consecutive rows, measures arrivals from
the window's first request, divides the gaps by ``rate_scale`` (2.0 replays the same requests at
twice the rate), and clips each request to the context a slot holds: prompt plus output at most
``context_limit`` tokens (the output is kept, since the trace forces it; the prompt is cut), and
every length at least one token.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import pathlib
from collections.abc import Iterable, Sequence

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# A slot's context in the simulator's scheduler: with no model length given, `Scheduler` sizes
# the KV pool at 8192 tokens per request slot (helios_jax/scheduler/core.py).
CONTEXT_LIMIT = 8192


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One row of a trace: arrival (ms since the trace's first row), prompt and output tokens."""

    arrival_ms: float
    prompt_tokens: int
    output_tokens: int


@dataclasses.dataclass(frozen=True)
class Replay:
    """Requests ready for the simulator, and what clipping changed."""

    arrivals_ms: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    clipped: int  # requests whose prompt was cut to fit the context limit
    clipped_tokens: int  # prompt tokens removed in all
    duration_ms: float  # the window's span after scaling (first to last arrival)

    @property
    def requests(self) -> int:
        return len(self.arrivals_ms)


def parse_timestamp(text: str) -> datetime.datetime:
    """``2023-11-16 18:15:46.6805900`` -> a datetime (fractions beyond microseconds dropped)."""
    text = text.strip()
    whole, _, fraction = text.partition(".")
    moment = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    return moment.replace(microsecond=micros)


def parse_azure_rows(lines: Iterable[str]) -> list[TraceRequest]:
    """Rows of an Azure-format CSV (header first), arrivals in ms from the first row, sorted by
    arrival (stable, so equal timestamps keep their file order).

    Raises:
      ValueError: a missing or different header, a malformed row, or negative token counts.
    """
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != HEADER:
        raise ValueError(f"expected the header {','.join(HEADER)}, got {header!r}")
    stamps, rows = [], []
    for number, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != 3:
            raise ValueError(f"line {number}: expected 3 fields, got {len(row)}")
        try:
            stamp, prompt, output = parse_timestamp(row[0]), int(row[1]), int(row[2])
        except ValueError as e:
            raise ValueError(f"line {number}: {e}") from None
        if prompt < 0 or output < 0:
            raise ValueError(f"line {number}: negative token count")
        stamps.append(stamp)
        rows.append((prompt, output))
    if not rows:
        return []
    first = min(stamps)
    out = [TraceRequest((s - first).total_seconds() * 1e3, p, o) for s, (p, o) in zip(stamps, rows)]
    return sorted(out, key=lambda r: r.arrival_ms)


def read_azure_trace(path: str | pathlib.Path) -> list[TraceRequest]:
    """The requests of an Azure-format trace file (:func:`parse_azure_rows`)."""
    with open(path, newline="") as f:
        return parse_azure_rows(f)


def replay_requests(
    trace: Sequence[TraceRequest],
    *,
    start: int = 0,
    count: int | None = None,
    rate_scale: float = 1.0,
    context_limit: int = CONTEXT_LIMIT,
) -> Replay:
    """Rows ``start .. start+count`` of `trace`, arrivals from the window's first and divided by
    `rate_scale`, each request clipped to `context_limit` (module docstring)."""
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    if context_limit < 2:
        raise ValueError(f"context_limit must be at least 2, got {context_limit}")
    window = list(trace[start : None if count is None else start + count])
    if not window:
        raise ValueError(f"no requests in rows {start}..{'end' if count is None else start + count}")
    origin = window[0].arrival_ms
    arrivals = [(r.arrival_ms - origin) / rate_scale for r in window]
    outputs = [max(1, min(r.output_tokens, context_limit - 1)) for r in window]
    prompts, clipped, removed = [], 0, 0
    for r, out in zip(window, outputs):
        prompt = max(1, r.prompt_tokens)
        keep = min(prompt, context_limit - out)
        clipped += keep < prompt
        removed += prompt - keep
        prompts.append(keep)
    return Replay(arrivals, prompts, outputs, clipped, removed, arrivals[-1] - arrivals[0])


def offered_rate_per_s(replay: Replay) -> float:
    """Requests per second of the window: (requests - 1) / span (the arrival-gap mean's inverse)."""
    if replay.requests < 2 or replay.duration_ms <= 0:
        return 0.0
    return (replay.requests - 1) / replay.duration_ms * 1e3
