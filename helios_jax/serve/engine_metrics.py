"""The real engine's Prometheus text: scheduler series, speculative proposals offered and accepted
by source, per-program executions and device time,
frame observations, compilations, queue gauges, and checkpoint work (snapshots by role,
restores and the prompt tokens they supplied, preemptions and continuations).

The engine keeps plain counters (``executor.graph_counts``, ``runtime.state_copies.CheckpointStats``);
this module is the only place that formats them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from helios_jax.runtime.compilations import render_compilations
from helios_jax.serve.metrics import render_scheduler_stats

if TYPE_CHECKING:
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.state_copies import CheckpointStats


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


def render_checkpoint_stats(stats: CheckpointStats) -> list[str]:
    """Snapshots by role, restores, restored prompt tokens, preemptions and continuations."""
    lines = _family(
        "helios_checkpoint_snapshots_total",
        "counter",
        "Completed snapshots into checkpoint rows, by the capture's role (anchor, extra, terminal).",
    )
    for role in sorted(set(stats.snapshots) | {"anchor", "extra", "terminal"}):
        lines.append(f'helios_checkpoint_snapshots_total{{role="{role}"}} {stats.snapshots.get(role, 0)}')
    lines += _family(
        "helios_checkpoint_restores_total", "counter", "Completed restores of a stored checkpoint."
    )
    lines.append(f"helios_checkpoint_restores_total {stats.restores}")
    lines += _family(
        "helios_checkpoint_restored_tokens_total",
        "counter",
        "Prompt tokens supplied by restores instead of prefill (prefix reuse).",
    )
    lines.append(f"helios_checkpoint_restored_tokens_total {stats.restored_tokens}")
    lines += _family("helios_preemptions_total", "counter", "Requests preempted for a waiting request.")
    lines.append(f"helios_preemptions_total {stats.preemptions}")
    lines += _family(
        "helios_preemption_continuations_total",
        "counter",
        "Preempted requests resumed (restoring their captured state or recomputing it).",
    )
    lines.append(f"helios_preemption_continuations_total {stats.continuations}")
    return lines


def render_source_counters(speculative: Mapping[str, int]) -> list[str]:
    """Proposals offered for verification and accepted, by their source (``learned``: the
    model's own draft heads; ``copy``: copies from a supplied prefix, docs/copy-proposals.md),
    from the scheduler's speculative counters (``scheduler.stats.Counters.speculative``)."""
    lines = _family(
        "helios_speculative_source_offered_total",
        "counter",
        "Speculative proposals offered for verification, by proposal source.",
    )
    lines += [
        f'helios_speculative_source_offered_total{{source="{source}"}} {speculative.get(key, 0)}'
        for source, key in (("learned", "learned_drafts"), ("copy", "copy_drafts"))
    ]
    lines += _family(
        "helios_speculative_source_accepted_total",
        "counter",
        "Speculative proposals accepted by verification, by proposal source.",
    )
    lines += [
        f'helios_speculative_source_accepted_total{{source="{source}"}} {speculative.get(key, 0)}'
        for source, key in (("learned", "learned_accepted"), ("copy", "copy_accepted"))
    ]
    return lines


def render_engine(engine: HeliosEngine) -> str:
    """Every series of one engine, as Prometheus text."""
    executor = engine.executor
    lines = [render_scheduler_stats(engine.scheduler.stats()).rstrip("\n")]
    lines += render_source_counters(
        engine.scheduler.counters.speculative
    )  # key reads: no copy racing the loop
    lines += _family("helios_graph_executions_total", "counter", "Completed executions per prepared program.")
    for name, n in sorted(executor.graph_counts.items()):
        lines.append(f'helios_graph_executions_total{{graph="{name}"}} {n}')
    lines += _family(
        "helios_graph_timed_executions_total",
        "counter",
        "Completed executions per prepared program that reported a device interval.",
    )
    for name, n in sorted(executor.graph_timed.items()):
        lines.append(f'helios_graph_timed_executions_total{{graph="{name}"}} {n}')
    lines += _family(
        "helios_graph_device_seconds_total",
        "counter",
        "Device time per prepared program, over its timed executions.",
    )
    for name, ns in sorted(executor.graph_ns.items()):
        lines.append(f'helios_graph_device_seconds_total{{graph="{name}"}} {ns / 1e9:.6f}')
    lines += _family(
        "helios_frame_observations_total",
        "counter",
        "How the engine loop observed completed frames: "
        "waited (stamped on wake-up), polled (between host tasks), late (found finished when the "
        "wait began), missing_interval (stamped too late to exclude host time: no cost sample).",
    )
    for kind, n in sorted(executor.observations.items()):
        lines.append(f'helios_frame_observations_total{{observation="{kind}"}} {n}')
    lines.append(render_compilations().rstrip("\n"))
    lines += render_checkpoint_stats(engine.checkpoint_stats)
    lines += [
        "# TYPE helios_engine_waiting_requests gauge",
        f"helios_engine_waiting_requests {engine.waiting}",
        "# TYPE helios_engine_resident_requests gauge",
        f"helios_engine_resident_requests {len(engine.scheduler.requests)}",
        "# HELP helios_engine_free_slots Request slots no resident request holds.",
        "# TYPE helios_engine_free_slots gauge",
        f"helios_engine_free_slots {engine.scheduler.slots.available}",
        "# HELP helios_engine_free_kv_pages KV pages of the request pool that no resident request holds.",
        "# TYPE helios_engine_free_kv_pages gauge",
        f"helios_engine_free_kv_pages {engine.scheduler.pages.available}",
    ]
    return "\n".join(lines) + "\n"
