"""The scheduler an engine serves with, built from its `EngineConfig`.

- the context the scheduler plans for leaves room for the draft storage a speculative round
  writes past the committed tokens (the deepest proposal depth);
- ``speculation="fixed"`` binds every round to the widest captured width;
- requests draw KV pages from ``EngineConfig.request_pages``: the snapshot rows' fixed pages at
  the end of the pool are never a request's (``runtime/state_copies.py``);
- checkpoint retention (conversation anchors from chat message endpoints, prompt ends, extras and
  terminal captures, the prefix cache and the snapshots preemption takes) is on whenever the
  engine has snapshot rows, one per request slot by default (docs/checkpoints.md);
- every request starts with an ``initialize`` (or a ``restore``, which loads its settings too);
- with ``measure_runs`` (`measure_into`), the duration estimates start from that many isolated
  executions of every program, timed before serving (docs/engine.md, "Measured start-up").
"""

from __future__ import annotations

from collections.abc import Callable

from helios_jax.catalog import Catalog
from helios_jax.engine_config import EngineConfig
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import Scheduler


def build_scheduler(catalog: Catalog, config: EngineConfig, policy_config: PolicyConfig | None) -> Scheduler:
    draft = max(config.proposal_depths, default=0) if config.speculative else 0
    fixed_width = max(config.proposal_depths) + 1 if config.speculation == "fixed" else None
    return Scheduler(
        catalog,
        mode=config.decode_mode,
        policy_config=policy_config or PolicyConfig(),
        fixed_width=fixed_width,
        page_size=config.page_size,
        kv_pages=config.request_pages,
        max_model_len=config.max_model_len - draft,
        draft_storage=draft,
        initialize_requests=True,
        snapshot_rows=config.snapshot_rows,
        checkpoints=config.snapshot_rows > 0,
    )


def check_measure_runs(runs) -> None:
    """Refuse a start-up measurement count that is not a nonnegative integer (before anything
    is built)."""
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 0:
        raise ValueError(f"measure_runs must be a nonnegative integer, got {runs!r}")


# A program's timed start-up runs stop once they add up to this (seconds): the default CPU
# server's 4096-token prefills take 0.65-0.73 s each, and five runs of each of its 38 programs
# took 15.4-16.9 s where this budget takes 7.1-7.6 (warm-up alone: 2.5-3.8 s); on a GPU, where
# programs take milliseconds, every program still gets all its runs.
MEASURE_BUDGET_S = 0.25


def measure_into(
    scheduler: Scheduler, programs, params, runs: int, now_ns: int, progress: Callable[[str], None] | None
) -> int:
    """Time every program up to `runs` times on a scratch state (after one untimed run each,
    ``prepare.measure_samples``, within `MEASURE_BUDGET_S` a program) and seed `scheduler`'s
    duration estimates with the samples, observed at `now_ns`; returns the programs seeded."""
    from helios_jax.prepare import measure_samples

    samples = measure_samples(programs, params, runs=runs, budget_s=MEASURE_BUDGET_S)
    seeded = scheduler.seed_costs(now_ns, samples)
    if progress:
        progress(f"measured {seeded} programs, up to {runs} runs each")
    return seeded
