"""Rules of the spec that are not (or not fully) checked, each named with the reason.

A rule is *checked* when a test carries its id in a ``spec`` marker (and that test fails when
the rule's code changes: docs/mutation.md), *descriptive* when its check kind is ``doc``, and
otherwise must be listed in ``OPEN``. ``tests/test_conformance.py`` fails when a rule is none of
these, and when a rule listed as open has gained a test (then it leaves the list).

Two more statuses qualify a tested rule:

- ``SCHEDULER_ONLY``: implemented and tested in the scheduler (and its programs), but switched
  off in serving, so no served request ever exercises it yet;
- ``DEVIATIONS``: the implementation departs from the spec's text, for the reason given (and in
  docs/spec/RESOLUTIONS.md).
"""

NOT_APPLICABLE = "not applicable to helios_jax"

OPEN: dict[str, str] = {
    # Helios-only tooling and model families.
    "intro/direct-path-decode-only": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/direct-path-cost-ema": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/direct-path-revert-30s": f"{NOT_APPLICABLE}: there is no diagnostic debug-serve --direct path",
    "intro/mixed-capture-recipe": f"{NOT_APPLICABLE}: one model family; mixed capture follows "
    "--mixed_prefill",
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
    "verification/http-env-gate": "deliberately different: the HTTP scheduler scenarios run in CI on the CPU "
    "with a tiny model, not behind FLARE_RUN_CUDA_TESTS",
}


_VISION = "scheduler-only: the server refuses images and prepares no vision programs"

SCHEDULER_ONLY: dict[str, str] = {
    **{
        rule: _VISION
        for rule in (
            "prerequisites/continuation-images",
            "prerequisites/image-windows",
            "prerequisites/vision-active-window",
            "prerequisites/prefill-window-stop",
            "prerequisites/atomic-span-chunk",
            "prerequisites/multiwindow-snapshot-row",
            "prerequisites/window-drain",
            "prerequisites/restore-fresh-generation",
            "prerequisites/feature-offsets-zero",
            "prerequisites/logical-request-kept",
            "prerequisites/private-no-prefix-cache",
            "prerequisites/private-no-host-cache",
            "planning-queue/mandatory-revokes",  # mandatory execution: a multi-window image request
        )
    },
}

DEVIATIONS: dict[str, str] = {
    "mixed-execution/qwen-counts": "deviation: the 22 speculative / 20 ordinary example is not derivable "
    "from the stated rules (RESOLUTIONS.md, 12); mixed_shapes reproduces it only with prompt "
    "buckets the planner never produces",
}
