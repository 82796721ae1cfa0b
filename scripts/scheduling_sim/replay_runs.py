"""One replay setting's runs, without flags (``replay.py`` is the command line).

:func:`run_one` replays a trace window at one rate scale through one scheduler (the utility
scheduler under a preference setting, or a baseline) in the simulator and summarizes it with
``helios_jax.slo``; :func:`run_setting` sweeps one setting's rate scales in ascending order
(appending each run to a JSON-lines file if given, so a cut-short sweep keeps what it ran).
A task is a plain dict (it crosses process boundaries): ``trace``, ``start``, ``requests``,
``context_limit``, ``catalog``, ``acceptance_probs``, ``horizon_ms``, ``seed``, ``slo`` (the
``SloTargets`` fields), ``stop_after_miss``, ``spec`` (``SchedulerSpec`` fields) and ``scale``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402  (a sibling script module)

from helios_jax import simulation, slo, traces  # noqa: E402
from helios_jax.catalog import Catalog, shipped_catalog  # noqa: E402
from helios_jax.scheduler.config import PolicyConfig  # noqa: E402

PREFERENCE_KEYS = {
    "beta": "output_token_value",
    "f": "token_fairness",
    "g": "delivery_fairness",
    "c": "decode_age_price",
    "tv": "terminal_value",
    "tc": "terminal_age_price",
    "alpha": "adaptive_verification_alpha",
    "tau": "adaptation_ms",
}


def policy_of(setting: str) -> PolicyConfig:
    """A preset name (``balanced``, ``throughput``) or ``key=value;...`` over balanced."""
    if "=" not in setting:
        return PolicyConfig.preset(setting)
    changes = {}
    for part in setting.split(";"):
        key, _, value = part.partition("=")
        if key.strip() not in PREFERENCE_KEYS:
            raise ValueError(f"unknown preference {key!r} in {setting!r}; keys: {sorted(PREFERENCE_KEYS)}")
        changes[PREFERENCE_KEYS[key.strip()]] = float(value)
    return dataclasses.replace(PolicyConfig.preset("balanced"), **changes)


def scheduler_specs(preferences, families, budgets, width) -> list[baselines.SchedulerSpec]:
    """The first preference setting, every baseline at every budget, then the other preference
    settings (the order they run in: a sweep cut short still has the comparison's core)."""
    utility = [baselines.SchedulerSpec(p, "utility", policy=p) for p in preferences]
    out = utility[:1]
    for fam in families:
        kind = {"fcfs": "fcfs", "sarathi": "sarathi", "fcfs_fixed": "fcfs_fixed"}[fam]
        prefix = f"fcfs_w{width}" if fam == "fcfs_fixed" else fam
        out += [
            baselines.SchedulerSpec(
                f"{prefix}@{b}", kind, token_budget=b, fixed_width=width if kind == "fcfs_fixed" else None
            )
            for b in budgets
        ]
    return out + utility[1:]


@functools.lru_cache(maxsize=2)
def load_trace(path: str) -> tuple:
    return tuple(traces.read_azure_trace(path))


def load_catalog(name: str) -> Catalog:
    return Catalog.load(name) if name.endswith(".json") else shipped_catalog(name)


def run_one(task: dict) -> dict:
    """One scheduler at one rate scale: the SLO summary and what the scheduler committed."""
    spec = baselines.SchedulerSpec(**task["spec"])
    replay = traces.replay_requests(
        load_trace(task["trace"]),
        start=task["start"],
        count=task["requests"],
        rate_scale=task["scale"],
        context_limit=task["context_limit"],
    )
    config = simulation.SimConfig(
        catalog=load_catalog(task["catalog"]),
        scenario="trace",
        requests=replay.requests,
        prompt_tokens=replay.prompt_tokens,
        output_tokens=replay.output_tokens,
        arrivals_ms=replay.arrivals_ms,
        accepted_drafts=None,
        acceptance_probs=tuple(task["acceptance_probs"]),
        policy=policy_of(spec.policy) if spec.kind == "utility" else PolicyConfig(),
        horizon_ms=task["horizon_ms"],
        seed=task["seed"],
        rounds=10**9,
    )
    t0 = time.perf_counter()
    result, sched = baselines.simulate(config, baselines.factory(spec))
    wall = time.perf_counter() - t0
    out = slo.summarize(result.requests, slo.SloTargets(**task["slo"]))
    done = [r.finished_ms for r in result.requests if r.finished_ms is not None]
    tokens = sum(r.output_tokens for r in result.requests)
    out.update(
        label=spec.label,
        family=spec.family,
        budget=spec.token_budget,
        scale=task["scale"],
        rate=traces.offered_rate_per_s(replay),
        throughput_tok_s=tokens / max(done, default=1.0) * 1e3,
        clipped=replay.clipped,
        wall_s=wall,
        chosen=sched.summary(),
    )
    return out


def run_setting(tasks: list[dict], runs_out: str | None = None) -> list[dict]:
    """One setting's sweep in ascending rate, stopping after the first rate that misses the
    attainment target when ``stop_after_miss`` (goodput counts up to the first miss)."""
    out = []
    for t in sorted(tasks, key=lambda t: t["scale"]):
        out.append(run_one(t))
        o = out[-1]
        if runs_out:
            with open(runs_out, "a") as f:
                f.write(json.dumps(o) + "\n")
        print(
            f"  {o['label']} x{o['scale']:g} ({o['rate']:.2f} req/s): attainment {o['attainment']:.3f} "
            f"({o['wall_s']:.1f} s)",
            flush=True,
        )
        if t["stop_after_miss"] and o["attainment"] < t["slo"]["target"]:
            break
    return out
