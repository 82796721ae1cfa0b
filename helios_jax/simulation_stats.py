"""What the scheduling simulator measures: per-request statistics, the run's result, the progress
spread window and the exploration budget bounds (``helios_jax.simulation`` runs the loop).

Measurements (RESOLUTIONS.md, 16):

- **first output**: time from a request's arrival to its first visible output.
- **largest gap**: the longest wait between a stream's consecutive visible outputs, including the
  wait still open when the run ends (from its last output to the end of the run; for an arrived
  stream with no output yet, its whole first-output wait).
- **progress spread**: max - min output tokens gained by the streams over whole rotation cycles
  from a symmetric start. A *cycle* is the shortest run of consecutive generation rounds (decode,
  speculative or mixed completions) in which every live stream is served, i.e. publishes output,
  at least once; a cycle that has not closed after ``rounds`` generation rounds is cut there (a
  stream went unserved that long, which the spread then shows). Cycles are laid back to back from
  the completion at which every stream has its first output; the window starts at the end of the
  first cycle (every stream served once since: a symmetric start) and ends at the first cycle
  boundary after at least ``rounds`` generation rounds. A fixed count of rounds would instead cut
  a rotation in the middle whenever a program is narrower than the stream count, so the phase of
  the rotation would show up as spread.
- **exploration budgets**: each timing-refresh and acceptance-learning episode's paid interval
  (the credited interval of its execution, as the simulated engine reported it), so the bounds
  ``refresh <= 0.002/0.998 * ordinary + one episode`` and ``probes <= 0.01/0.99 * ordinary + one
  episode`` are checked against the largest single episode, from the simulator's own record.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RequestStats:
    arrival_ms: float
    prompt_tokens: int
    first_output_ms: float | None = None
    publications: list = dataclasses.field(default_factory=list)
    output_tokens: int = 0
    finished_ms: float | None = None
    end_ms: float | None = None  # when the run stopped (set by run())

    @property
    def open_wait_ms(self) -> float:
        """The wait still open when the run ended: since the last output, or since arrival for a
        stream with no output yet (0 once finished, or before arrival)."""
        if self.end_ms is None or self.finished_ms is not None:
            return 0.0
        since = self.publications[-1] if self.publications else self.arrival_ms
        return max(0.0, self.end_ms - since)

    @property
    def max_gap_ms(self) -> float:
        times = self.publications
        return max([b - a for a, b in zip(times, times[1:])] + [self.open_wait_ms, 0.0])


@dataclasses.dataclass
class SimResult:
    requests: list[RequestStats]
    progress_spread_tokens: int | None
    executions: dict
    execution_ms: dict
    selections: dict
    virtual_ms: float
    refresh_bound_ok: bool
    acceptance_bound_ok: bool
    timing_refresh_ms: float
    acceptance_learning_ms: float
    ordinary_ms: float
    first_refresh_after_ms: float | None
    speculative: dict
    spread_window: dict | None = None  # start_ms, end_ms, rounds, cycles, cut_cycles
    refresh_episodes_ms: list = dataclasses.field(default_factory=list)  # each episode's paid interval
    probe_episodes_ms: list = dataclasses.field(default_factory=list)

    @property
    def largest_refresh_episode_ms(self) -> float:
        return max(self.refresh_episodes_ms, default=0.0)

    @property
    def largest_probe_episode_ms(self) -> float:
        return max(self.probe_episodes_ms, default=0.0)

    def to_json(self) -> dict:
        return {
            "requests": [
                {
                    "first_output_ms": r.first_output_ms,
                    "max_gap_ms": r.max_gap_ms,
                    "open_wait_ms": r.open_wait_ms,
                    "output_tokens": r.output_tokens,
                    "prompt_tokens": r.prompt_tokens,
                    "arrival_ms": r.arrival_ms,
                    "finished_ms": r.finished_ms,
                }
                for r in self.requests
            ],
            "progress_spread_tokens": self.progress_spread_tokens,
            "spread_window": self.spread_window,
            "executions": self.executions,
            "execution_ms": self.execution_ms,
            "execution_ns": {k: int(v * 1e6) for k, v in self.execution_ms.items()},
            "selections": self.selections,
            "virtual_ms": self.virtual_ms,
            "bounds": {
                "timing_refresh_ms": self.timing_refresh_ms,
                "acceptance_learning_ms": self.acceptance_learning_ms,
                "ordinary_ms": self.ordinary_ms,
                "refresh_bound_ok": self.refresh_bound_ok,
                "acceptance_bound_ok": self.acceptance_bound_ok,
                "largest_refresh_episode_ms": self.largest_refresh_episode_ms,
                "largest_probe_episode_ms": self.largest_probe_episode_ms,
                "refresh_episodes": len(self.refresh_episodes_ms),
                "probe_episodes": len(self.probe_episodes_ms),
                "first_refresh_after_ms": self.first_refresh_after_ms,
            },
            "speculative": self.speculative,
        }


class SpreadWindow:
    """Progress spread over whole rotation cycles from a symmetric start (module docstring)."""

    def __init__(self, rounds: int):
        self.rounds = max(1, rounds)
        self.baseline: list[int] | None = None  # tokens at the window's start
        self.start_ms: float | None = None
        self.cycle_served: set[int] = set()
        self.cycle_rounds = 0
        self.window_rounds = 0
        self.cycles = 0
        self.cut_cycles = 0
        self.result: dict | None = None

    def observe(self, now: float, served: set[int], stats: list[RequestStats]) -> bool:
        """One generation round after every stream's first output; True once the window closed."""
        self.cycle_rounds += 1
        self.cycle_served |= served
        live = {i for i, s in enumerate(stats) if s.finished_ms is None}
        closed = live <= self.cycle_served
        cut = not closed and self.cycle_rounds >= self.rounds
        if self.baseline is not None:
            self.window_rounds += 1
        if not (closed or cut):
            return False
        self.cycle_served, self.cycle_rounds = set(), 0
        if self.baseline is None:  # the end of the first cycle: the symmetric start
            self.baseline = [s.output_tokens for s in stats]
            self.start_ms = now
            return False
        self.cycles += 1
        self.cut_cycles += cut
        if self.window_rounds < self.rounds:
            return False
        gained = [s.output_tokens - b for s, b in zip(stats, self.baseline)]
        self.result = {
            "spread_tokens": max(gained) - min(gained),
            "start_ms": self.start_ms,
            "end_ms": now,
            "rounds": self.window_rounds,
            "cycles": self.cycles,
            "cut_cycles": self.cut_cycles,
            "min_gained": min(gained),
            "max_gained": max(gained),
        }
        return True


def refresh_bound_holds(refresh_ms: float, ordinary_ms: float, largest_episode_ms: float) -> bool:
    """timing-refresh/aggregate-bound: refresh <= 0.002/0.998 * ordinary + one (the largest) episode."""
    return refresh_ms <= 0.002 / 0.998 * ordinary_ms + largest_episode_ms + 1e-9


def acceptance_bound_holds(probe_ms: float, ordinary_ms: float, largest_episode_ms: float) -> bool:
    """acceptance-learning/aggregate-bound: probes <= 0.01/0.99 * ordinary + one (the largest) episode."""
    return probe_ms <= 0.01 / 0.99 * ordinary_ms + largest_episode_ms + 1e-9
