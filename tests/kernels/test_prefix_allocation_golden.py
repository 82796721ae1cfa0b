"""Golden cases for the prefix allocation, shared with the scheduler's host numpy implementation.

`tests/golden/prefix_allocation.json` holds {"cases": [...]}, each case
{"name", "joint_prob": [[...]], "ceilings": [...], "active": [...], "capacity": N, "expected": [...]}.
The hand-picked cases below carry their derivation; the random ones are seeded, with
probabilities on a 1/8 grid (exact in float32 and float64, ties likely). The expectations come
from the naive oracle and are pinned by the file: regenerate with
`.venv/bin/python tests/kernels/test_prefix_allocation_golden.py` only when the rule changes.
"""

import json
import pathlib

import jax
import numpy as np
import pytest

from helios_jax.kernels.prefix_allocation import prefix_allocation, prefix_allocation_reference
from helios_jax.reference.prefix_allocation import prefix_allocation_batched, prefix_allocation_naive

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "prefix_allocation.json"

SPEC = (
    "speculative-coverage/device-frontier",
    "speculative-coverage/frontier-ties",
    "speculative-coverage/device-fixed-cohort",
    "speculative-coverage/ceilings-over-p",
    "speculative-coverage/device-program-steps",
)

# (name, joint_prob, ceilings, active, capacity): derivations in the comments.
HAND_PICKED = [
    # The module docstring's example: [1,1,1] -> lane 0 (0.9 tie, lower slot) -> lane 1 (0.9)
    # -> lane 2 (0.5 tie with lane 0's 0.5 at L=2, shorter prefix wins).
    ("docstring_example", [[0.9, 0.5, 0.1], [0.9, 0.8, 0.7], [0.5, 0.5, 0.4]], [4, 2, 4], [1, 1, 1], 6),
    ("docstring_example_p7", [[0.9, 0.5, 0.1], [0.9, 0.8, 0.7], [0.5, 0.5, 0.4]], [4, 2, 4], [1, 1, 1], 7),
    # Equal values, equal lengths: the lower slot wins.
    ("tie_lower_slot", [[0.5], [0.5]], [2, 2], [1, 1], 3),
    # Lane 0 takes 1.0, then its 0.5 at L=2 ties lane 1's 0.5 at L=1: the shorter prefix wins.
    ("tie_shorter_prefix_beats_lower_slot", [[1.0, 0.5], [0.5, 0.5]], [3, 3], [1, 1], 4),
    # Non-monotone row: lane 0's 0.9 hides behind its 0.2 frontier, so lane 1 is served first.
    ("non_monotone_p3", [[0.2, 0.9], [0.5, 0.4]], [3, 3], [1, 1], 3),
    ("non_monotone_p4", [[0.2, 0.9], [0.5, 0.4]], [3, 3], [1, 1], 4),
    ("non_monotone_p5", [[0.2, 0.9], [0.5, 0.4]], [3, 3], [1, 1], 5),
    # A non-monotone row that rises above other lanes once its first proposal is admitted.
    ("non_monotone_rises", [[0.6, 0.95, 0.1], [0.7, 0.65, 0.6]], [4, 4], [1, 1], 6),
    # Inactive lanes hold the best probabilities and any ceiling: they stay at 0.
    ("inactive_lanes_stay_zero", [[1.0, 1.0], [0.1, 0.1], [1.0, 1.0]], [3, 3, 0], [0, 1, 0], 3),
    # Capacity equal to the active count: pending tokens only.
    ("capacity_equals_active_count", [[1.0, 1.0], [1.0, 1.0], [0.5, 0.5]], [3, 3, 3], [1, 0, 1], 2),
    # Capacity above the ceilings' sum: every active lane reaches its ceiling.
    ("capacity_above_ceilings", [[0.1, 0.01, 0.001], [0.9, 0.8, 0.7]], [2, 4], [1, 1], 20),
    # Zero probabilities are still admitted; all ties, so shortest prefix then slot: round robin.
    ("zeros_round_robin", [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [4, 4, 4], [1, 1, 1], 7),
    ("zeros_fill_to_ceilings", [[0.0, 0.0], [0.0, 0.0]], [3, 2], [1, 1], 9),
    # Ceilings sum above P (8 > 5): capacity binds.
    ("ceilings_over_p", [[0.9, 0.81, 0.73], [0.8, 0.64, 0.51]], [4, 4], [1, 1], 5),
    # Ceiling 1: the lane keeps only its pending token whatever its probabilities.
    ("ceiling_one", [[1.0, 1.0], [0.25, 0.125]], [1, 3], [1, 1], 6),
    # Width-one program (D = 0): one row per active lane.
    ("depth_zero", [[], [], []], [1, 1, 1], [1, 0, 1], 5),
    # Empty cohort: nothing active, nothing allocated.
    ("all_inactive", [[0.5, 0.5], [0.5, 0.5]], [3, 3], [0, 0], 0),
    ("single_lane", [[0.75, 0.5, 0.25]], [4], [1], 3),
    # Exact ones everywhere: ties broken by shorter prefix then slot.
    ("all_ones", [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], [3, 3, 3], [1, 1, 1], 7),
    # A padded batch: active lanes interleaved with padding.
    ("padded_batch", [[0.5, 0.25], [0.9, 0.9], [0.75, 0.5], [0.9, 0.9]], [3, 3, 3, 3], [1, 0, 1, 0], 5),
]


RANDOM_SHAPES = [
    (1, 1),
    (1, 5),
    (2, 2),
    (2, 7),
    (3, 3),
    (3, 4),
    (4, 1),
    (4, 3),
    (5, 2),
    (5, 6),
    (6, 4),
    (7, 7),
    (8, 3),
    (8, 8),
    (10, 2),
    (12, 5),
    (16, 4),
    (16, 16),
    (32, 8),
    (48, 3),
    (64, 16),
    (64, 16),
]


def _random_cases(seed=20240611):
    rng = np.random.default_rng(seed)
    cases = []
    for i, (b, depth) in enumerate(RANDOM_SHAPES):
        probs = rng.integers(0, 9, (b, depth)) / 8
        if i % 2 == 0:
            probs = -np.sort(-probs, axis=1)  # monotone half of the time
        active = rng.random(b) < 0.75
        # Inactive lanes get ceilings outside 1..D+1 too: they must be ignored.
        ceilings = np.where(active, rng.integers(1, depth + 2, b), rng.integers(0, depth + 3, b))
        k = int(active.sum())
        room = int(np.where(active, ceilings - 1, 0).sum())  # admissions until every ceiling
        capacity = k if i % 7 == 3 else k + int(rng.integers(0, room + 3))
        cases.append(
            (f"random_{i:02d}", probs.tolist(), ceilings.tolist(), active.astype(int).tolist(), capacity)
        )
    return cases


def build_cases():
    cases = []
    for name, probs, ceilings, active, capacity in HAND_PICKED + _random_cases():
        active = [bool(a) for a in active]
        expected = prefix_allocation_naive(
            np.asarray(probs, np.float32).reshape(len(ceilings), -1), ceilings, active, capacity
        )
        cases.append(
            {
                "name": name,
                "joint_prob": probs,
                "ceilings": [int(c) for c in ceilings],
                "active": active,
                "capacity": capacity,
                "expected": expected.tolist(),
            }
        )
    return cases


def load_cases():
    cases = json.loads(GOLDEN.read_text())["cases"]
    for case in cases:
        b = len(case["ceilings"])
        yield (
            case["name"],
            (
                np.asarray(case["joint_prob"], np.float32).reshape(b, -1),
                np.asarray(case["ceilings"], np.int32),
                np.asarray(case["active"], bool),
                int(case["capacity"]),
            ),
            case["expected"],
        )


CASES = list(load_cases()) if GOLDEN.exists() else []  # absent only while regenerating
IDS = [name for name, _, _ in CASES]


@pytest.mark.spec(*SPEC)
def test_golden_file_is_the_naive_oracle_of_its_builder():
    assert json.loads(GOLDEN.read_text())["cases"] == build_cases()


@pytest.mark.spec(*SPEC)
@pytest.mark.parametrize("name,args,expected", CASES, ids=IDS)
def test_golden_oracles(name, args, expected):
    assert prefix_allocation_naive(*args).tolist() == expected
    assert np.asarray(prefix_allocation_reference(*args)).tolist() == expected
    batched = prefix_allocation_batched(*(np.asarray(a)[None] for a in args))
    assert batched[0].tolist() == expected


class TestPrefixAllocationGolden:
    INTERPRET = False

    @pytest.fixture(autouse=True)
    def _needs_gpu_unless_interpreted(self):
        if not self.INTERPRET and jax.default_backend() != "gpu":
            pytest.skip("compiled Pallas needs a GPU; the Interpret subclass covers CPU")

    @pytest.mark.spec(*SPEC)
    def test_kernel_matches_golden(self):
        failures = []
        for name, args, expected in CASES:
            got = np.asarray(prefix_allocation(*args, interpret=self.INTERPRET)).tolist()
            if got != expected:
                failures.append((name, got, expected))
        assert not failures


class TestPrefixAllocationGoldenInterpret(TestPrefixAllocationGolden):
    INTERPRET = True


if __name__ == "__main__":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "description": (
            "Speculative prefix allocation (SpeculativePrefixLimit) golden cases; semantics in "
            "kernels/prefix_allocation.py and docs/kernels.md. joint_prob[b][d]: probability that "
            "proposals 0..d of lane b survive; ceilings include the pending token; expected: i32 query "
            "lengths."
        ),
        "cases": build_cases(),
    }
    # One case per line keeps the file reviewable as a table.
    lines = ",\n".join("  " + json.dumps(case) for case in payload["cases"])
    GOLDEN.write_text(
        f'{{\n "description": {json.dumps(payload["description"])},\n "cases": [\n{lines}\n ]\n}}\n'
    )
    print(f"wrote {len(payload['cases'])} cases to {GOLDEN}")
