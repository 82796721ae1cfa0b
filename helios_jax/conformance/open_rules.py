"""Rules of the spec no test checks, each named with the reason.

A rule is *covered* when a test carries its id in a ``spec`` marker, *descriptive* when its check
kind is ``doc``, and otherwise must be listed here. ``tests/test_conformance.py`` fails when a
rule is neither, and when a rule listed here has gained a test (then it leaves this list).
"""

NOT_APPLICABLE = "not applicable to helios_jax"

OPEN: dict[str, str] = {
    # Helios-only tooling and model families.
    "intro/direct-path-decode-only": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/direct-path-cost-ema": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/direct-path-revert-30s": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/mixed-capture-recipe": f"{NOT_APPLICABLE}: one model family; mixed capture follows --mixed_prefill",
    "intro/qwen38-mixed-recipe": f"{NOT_APPLICABLE}: no Qwen3.8 Flash recipe",
    "mixed-execution/qwen-shared-projections": f"{NOT_APPLICABLE}: Qwen3.8 hyperconnections and experts; "
                                               "the Qwen3 forward shares its projections by construction",
    "mixed-execution/qsa-phase": f"{NOT_APPLICABLE}: no QSA layers",
    "mixed-execution/gdn-ple-workspaces": f"{NOT_APPLICABLE}: no GDN or PLE layers",
    "mixed-execution/rollback-in-model": f"{NOT_APPLICABLE}: the dense Qwen3 model has no recurrent state "
                                         "to roll back",
    "mixed-execution/persistent-separate": f"{NOT_APPLICABLE}: no b12x operations",
    # Buffer placement inside a capture: XLA allocates and reuses buffers of a compiled program.
    "mixed-execution/workspaces-prealloc": "open: XLA owns buffer allocation inside compiled programs; "
                                           "not observable from the host",
    "mixed-execution/buffers-max-capacity": "open: XLA owns buffer allocation inside compiled programs",
    "mixed-execution/contiguous-views": "open: XLA owns buffer allocation inside compiled programs",
    "mixed-execution/proposal-workspace": "open: XLA owns buffer allocation inside compiled programs",
    "mixed-execution/live-disjoint": "open: XLA owns buffer allocation inside compiled programs",
    "mixed-execution/mtp-shared": "open: XLA owns buffer allocation inside compiled programs",
    # Not built yet.
    "mixed-execution/image-offset": "open: no vision programs yet (the server refuses images)",
    "confidence-acceptance/rank-agreement": "open: tensor parallelism (several ranks) is not built yet",
    "verification/http-env-gate": "deliberately different: the HTTP scheduler scenarios run in CI on the CPU "
                                  "with a tiny model, not behind FLARE_RUN_CUDA_TESTS",
}
