"""The spec's startup traces on the first catalogs of the generated family (issue 12): the bounds
are a property of the scheduler over the family, not of the two shipped catalogs.

``python -m helios_jax.conformance --generated=50`` runs the same traces over fifty (the results
and the causes of the remaining failures are in docs/conformance.md); CI runs members 2, 3 and 4
of family seed 0: speculative and ordinary catalogs, 8 and 32 request slots, R from 32 to 256,
so programs narrower than the stream count and P-limited device programs both occur.

Every first-output and gap bound must hold wherever the catalog's costs allow it. The spread
bound must hold on every runnable trace except those docs/conformance.md lists as remaining
failures (`KNOWN_SPREAD`): a new failure, or a failure of another bound, fails the test, while a
listed trace that starts to hold is welcome (then remove it here and there).
"""

import pytest

from helios_jax import catalog_family
from helios_jax.conformance import checks
from helios_jax.scheduler.config import PolicyConfig

FAMILY_SEED = 0
CHOSEN = (2, 3, 4)  # of the first six: the kinds below at half the CI time (the six: --generated)
MEMBERS = {m.index: m for m in catalog_family.family(max(CHOSEN) + 1, FAMILY_SEED)}
# docs/conformance.md, "Startup traces on the generated family": cause (A) and (C).
KNOWN_SPREAD = {
    (1, "5 requests, 7 accepted drafts, untrained"),
    (2, "16 requests, 3 accepted drafts, untrained"),
    (2, "16 requests, 7 accepted drafts, untrained"),
}


def test_the_sample_covers_the_kinds_the_docstring_names():
    params = [MEMBERS[i].params for i in CHOSEN]
    assert {p["mode"] for p in params} == {"speculative", "ordinary"}
    assert min(p["slots"] for p in params) == 8 and max(p["slots"] for p in params) >= 32
    assert min(p["R"] for p in params) == 32


@pytest.mark.spec(
    "verification/startup-traces",
    "verification/first-output-100ms",
    "verification/gaps-150ms",
    "verification/hundred-rounds-spread",
)
@pytest.mark.parametrize("index", CHOSEN)
@pytest.mark.exhaustive
def test_startup_bounds_hold_on_generated_catalogs(index):
    member = MEMBERS[index]
    results = checks.startup_checks(member.catalog, PolicyConfig(), serving=False)
    counts = checks.tally(results)
    assert counts["runnable"] >= 2
    if member.catalog.request_slots < 16:
        assert counts["not achievable"] >= 2 and all(
            "request slots" in r.figure for r in results if r.verdict == "not achievable"
        )
    failures = [r for r in results if r.verdict == "fail" and (index, r.check) not in KNOWN_SPREAD]
    assert not failures, f"{member.name} ({member.describe()}):\n" + "\n".join(
        f"{r.check}: {r.figure}" for r in failures
    )
    for r in results:
        if (index, r.check) in KNOWN_SPREAD and r.verdict == "fail":
            # a listed failure may only be the spread bound
            assert r.details["failed"] == ["spread"], r.figure
