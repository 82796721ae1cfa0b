"""Conformance checks against a measured catalog, each with a verdict and the figure behind it.

Verdicts: ``pass``, ``fail``, ``n/a`` (the catalog lacks what the check needs) and
``not achievable`` (the catalog's own measured costs make the bound impossible, whatever the
scheduler does: for example sixteen 64-token prompts whose fastest prompt program takes 8 ms
cannot all see a first output within 100 ms). Only ``fail`` fails the run.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from helios_jax import simulation
from helios_jax.catalog import Catalog, DecodeMode, GraphKind
from helios_jax.reference import crosscheck
from helios_jax.scheduler.config import PolicyConfig

FIRST_OUTPUT_MS, GAP_MS, SPREAD_TOKENS = 100.0, 150.0, 8


@dataclasses.dataclass(frozen=True)
class Result:
    section: str
    check: str
    verdict: str  # pass, fail, n/a, not achievable
    figure: str
    rules: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def catalog_checks(catalog: Catalog) -> list[Result]:
    kinds = sorted({g.kind.value for g in catalog.graphs})
    measured = sum(1 for g in catalog.graphs if g.duration_ms is not None)
    verdict = "pass" if measured == len(catalog.graphs) else "fail"
    return [Result("catalog", "contracts and measurements", verdict,
                   f"{len(catalog.graphs)} programs ({', '.join(kinds)}), {measured} measured",
                   ("speculative-coverage/extents-explicit", "mixed-execution/batch-range"))]


def selection_checks(catalog: Catalog, cases: int, seed: int) -> list[Result]:
    report = crosscheck.run(catalog, cases, seed=seed, max_requests=5, noise=0.15)
    verdict = "pass" if report.mismatches == 0 else "fail"
    return [Result("selection", "production selector vs exhaustive enumeration", verdict,
                   f"{report.cases} cases, {report.exact_cases} exact comparisons, {report.mismatches} mismatches, "
                   f"worst bounded gap {report.worst_relative_gap:.3g}",
                   ("verification/mixed-exhaustive", "useful-service/constrained-ragged"))]


def _fastest_prompt_ms(catalog: Catalog, tokens: int) -> float | None:
    """The fastest measured program that can consume `tokens` prompt tokens at once."""
    options = [g.duration_ms for g in catalog.graphs if g.duration_ms is not None and (
        (g.kind is GraphKind.PREFILL and g.token_capacity >= tokens)
        or (g.kind is GraphKind.MIXED and g.prefill_capacity >= tokens))]
    return min(options, default=None)


def _fastest_round_ms(catalog: Catalog) -> float | None:
    options = [g.duration_ms for g in catalog.graphs if g.duration_ms is not None
               and g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE)]
    return min(options, default=None)


def startup_checks(catalog: Catalog, policy: PolicyConfig) -> list[Result]:
    out = []
    speculative = catalog.mode == "speculative"
    prompt_ms = _fastest_prompt_ms(catalog, 64)
    round_ms = _fastest_round_ms(catalog)
    rules = ("verification/startup-traces", "verification/first-output-100ms", "verification/gaps-150ms",
             "verification/hundred-rounds-spread")
    for requests in (5, 16):
        for accepted in (0, 3, 7):
            for history in ("untrained", "preseeded"):
                name = f"{requests} requests, {accepted} accepted drafts, {history}"
                if accepted and not speculative:
                    out.append(Result("startup", name, "n/a", "an ordinary catalog draws no proposals", rules))
                    continue
                if prompt_ms is None or round_ms is None:
                    out.append(Result("startup", name, "n/a", "no measured prompt or generation program", rules))
                    continue
                if requests * prompt_ms > FIRST_OUTPUT_MS or round_ms >= GAP_MS:
                    why = (f"{requests} prompts x {prompt_ms:g} ms fastest 64-token prompt program = "
                           f"{requests * prompt_ms:g} ms > {FIRST_OUTPUT_MS:g} ms"
                           if requests * prompt_ms > FIRST_OUTPUT_MS
                           else f"the fastest generation round takes {round_ms:g} ms >= {GAP_MS:g} ms")
                    out.append(Result("startup", name, "not achievable", f"not achievable on this catalog: {why}",
                                      rules))
                    continue
                result = simulation.run(simulation.SimConfig(
                    catalog, requests=requests, accepted_drafts=accepted, acceptance_history=history,
                    policy=policy, rounds=100))
                first = max(r.first_output_ms or math.inf for r in result.requests)
                gap = max(r.max_gap_ms for r in result.requests)
                spread = result.progress_spread_tokens
                ok = first <= FIRST_OUTPUT_MS and gap < GAP_MS and spread is not None and spread <= SPREAD_TOKENS
                out.append(Result("startup", name, "pass" if ok else "fail",
                                  f"first output {first:.1f} ms, largest gap {gap:.1f} ms, spread {spread} tokens",
                                  rules))
    return out


def budget_checks(catalog: Catalog, policy: PolicyConfig) -> list[Result]:
    """About a minute of continuous decoding (durations scaled up so it runs quickly)."""
    slow = dataclasses.replace(catalog, graphs=tuple(
        dataclasses.replace(g, duration_ms=g.duration_ms * 8) if g.duration_ms else g for g in catalog.graphs))
    speculative = catalog.mode == "speculative"
    result = simulation.run(simulation.SimConfig(
        slow, requests=6, output_tokens=400_000, accepted_drafts=None,
        acceptance_probs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3) if speculative else None,
        horizon_ms=70_000.0, rounds=10**9, noise=0.05, seed=3, policy=policy))
    bound = 0.002 / 0.998 * result.ordinary_ms
    out = [Result("budgets", "timing refresh <= 0.002/0.998 x ordinary + one episode",
                  "pass" if result.refresh_bound_ok else "fail",
                  f"refresh {result.timing_refresh_ms:.2f} ms, allowance {bound:.2f} ms + episode, "
                  f"{result.executions.get('timing_refresh', 0)} refreshes in {result.virtual_ms / 1000:.0f} s",
                  ("timing-refresh/aggregate-bound",)),
           Result("budgets", "2,495 ms of credited ordinary time before the first refresh",
                  "pass" if result.first_refresh_after_ms is None or result.first_refresh_after_ms >= 2495 - 1e-6
                  else "fail",
                  f"first refresh after {result.first_refresh_after_ms} ms credited", ("timing-refresh/first-2495ms",))]
    if speculative:
        out.append(Result("budgets", "acceptance probes <= 0.01/0.99 x ordinary + one episode",
                          "pass" if result.acceptance_bound_ok else "fail",
                          f"probes {result.acceptance_learning_ms:.2f} ms, allowance "
                          f"{0.01 / 0.99 * result.ordinary_ms:.2f} ms + episode",
                          ("acceptance-learning/aggregate-bound",)))
    return out


def lifecycle_checks(catalog: Catalog, policy: PolicyConfig) -> list[Result]:
    """A Poisson workload through the real Scheduler: every request completes and nothing leaks."""
    result = simulation.run(simulation.SimConfig(
        catalog, scenario="poisson", requests=60, prompt_tokens=[64, 400, 1500], output_tokens=[16, 64],
        accepted_drafts=None if catalog.mode == "speculative" else 0,
        acceptance_probs=(0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1) if catalog.mode == "speculative" else None,
        arrival_rate_per_s=40.0, seed=11, policy=policy))
    done = sum(r.finished_ms is not None for r in result.requests)
    ttft = sorted(r.first_output_ms for r in result.requests if r.first_output_ms is not None)
    return [Result("lifecycle", "Poisson workload completes", "pass" if done == len(result.requests) else "fail",
                   f"{done}/{len(result.requests)} finished in {result.virtual_ms:.0f} ms; first output p50 "
                   f"{np.percentile(ttft, 50):.1f} ms, p99 {np.percentile(ttft, 99):.1f} ms",
                   ("verification/selector-contention",))]


def numeric_checks() -> list[Result]:
    """Kernel against its oracle; logits against transformers when it is installed."""
    out = []
    from helios_jax.kernels.prefix_allocation import prefix_allocation_reference
    from helios_jax.reference.prefix_allocation import prefix_allocation_naive

    rng = np.random.default_rng(0)
    bad = 0
    for _ in range(200):
        b, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        prob = np.minimum.accumulate(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=(b, d)), axis=1).astype(np.float32)
        active = rng.random(b) < 0.8
        ceil = rng.integers(1, d + 2, size=b)
        cap = int(active.sum()) + int(rng.integers(0, 8))
        got = np.asarray(prefix_allocation_reference(prob, ceil.astype(np.int32), active, cap))
        bad += int(not np.array_equal(got, prefix_allocation_naive(prob, ceil, active, cap)))
    out.append(Result("numerics", "device prefix allocation vs numpy oracle", "pass" if bad == 0 else "fail",
                      f"200 random cases, {bad} disagreements", ("speculative-coverage/device-frontier",)))
    out.append(_engine_greedy_check())
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        out.append(Result("numerics", "logits vs transformers Qwen3ForCausalLM", "n/a",
                          "transformers is not installed"))
        return out
    import tempfile

    import jax

    from helios_jax.model import forward_full_logits, load_checkpoint

    config = transformers.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    reference = transformers.Qwen3ForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        ours = load_checkpoint(folder)
    ids = np.arange(1, 25) % 128
    with torch.no_grad():
        want = reference(torch.tensor(ids[None])).logits[0].numpy()
    got = np.asarray(forward_full_logits(ours.config, ours.params, jax.numpy.asarray(ids)))
    err = float(np.max(np.abs(got - want)))
    out.append(Result("numerics", "logits vs transformers Qwen3ForCausalLM", "pass" if err <= 1e-4 else "fail",
                      f"max abs error {err:.2e} (f32, tolerance 1e-4)"))
    return out


def _engine_greedy_check() -> Result:
    """Greedy decoding through the prepared speculative programs (the engine: paged caches, MTP
    proposals, verification, acceptance, commit) equals plain greedy decoding of the embedded
    model, token for token (float32)."""
    from helios_jax.engine_config import EngineConfig
    from helios_jax.model.default import greedy_decode, load_default_model
    from helios_jax.runtime.api import GenerationRequest, SamplingParams
    from helios_jax.runtime.engine import HeliosEngine
    from helios_jax.runtime.tokenizer import HFTokenizer

    model = load_default_model(dtype="float32")
    tokenizer = HFTokenizer(model.tokenizer)
    config = EngineConfig(request_slots=2, prefill_chunks=(64,), speculation="adaptive", draft_tokens=3,
                          max_model_len=256, dtype="float32")
    engine = HeliosEngine(model_config=model.config, params=model.params, tokenizer=tokenizer, engine_config=config)
    try:
        prompts = [tokenizer.encode("def fibonacci(n):\n    "), tokenizer.encode("import os\nimport sys\n\n")]
        streams = [engine.submit(GenerationRequest(f"c{i}", tuple(p), SamplingParams(max_tokens=32, temperature=0)))
                   for i, p in enumerate(prompts)]
        outputs = [[t for e in s for t in e.token_ids] for s in streams]
        rounds = engine.scheduler.speculative
    finally:
        engine.shutdown()
    equal = all(out == greedy_decode(model, p, len(out))[: len(out)] for p, out in zip(prompts, outputs))
    return Result("numerics", "greedy speculative decoding equals plain greedy decoding", "pass" if equal else "fail",
                  f"{sum(map(len, outputs))} tokens over {len(prompts)} concurrent requests; "
                  f"{rounds['programs']} speculative programs, {rounds['drafts_accepted']}/{rounds['drafts_offered']} "
                  "drafts accepted", ("speculative-coverage/width-one-draft-context",))


SECTIONS: dict[str, Callable] = {
    "catalog": lambda cat, policy, args: catalog_checks(cat),
    "selection": lambda cat, policy, args: selection_checks(cat, args["cases"], args["seed"]),
    "startup": lambda cat, policy, args: startup_checks(cat, policy),
    "budgets": lambda cat, policy, args: budget_checks(cat, policy),
    "lifecycle": lambda cat, policy, args: lifecycle_checks(cat, policy),
    "numerics": lambda cat, policy, args: numeric_checks(),
}
