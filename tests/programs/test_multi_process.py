"""Several processes, one scheduler (docs/distributed.md): two processes on localhost over gloo.

`multi_process_run` runs in three subprocesses at once: the single-process tensor_parallel=2
reference (two forced host devices) and the two members of a `jax.distributed` group with one
CPU device each (process 0 leads, process 1 follows). The leader's outputs (rank zero's) and
the follower's own copies equal the reference's over the trace, every frame's digest check
passes, and the frame the follower runs diverged is failed by the leader's check.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from ..environment import subprocess_env
from .multi_process_run import CHECKED_FRAMES, DECODE_STEPS
from .tensor_parallel_trace import TOL

spec = pytest.mark.spec
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("multi_process"))
    port = str(_free_port())
    env = subprocess_env()  # multi_process_run forces the reference's two devices
    command = [sys.executable, "-m", "tests.programs.multi_process_run"]
    roles = {
        "reference": ["reference", out],
        "leader": ["member", "0", port, out],
        "follower": ["member", "1", port, out],
    }
    procs = {
        role: subprocess.Popen(command + args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for role, args in roles.items()
    }
    for role, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=600)
        finally:
            proc.kill()
        assert proc.returncode == 0, f"{role}: {err[-4000:]}"
    results = {}
    for role in roles:
        with open(os.path.join(out, f"{role}.json")) as f:
            results[role] = dict(np.load(os.path.join(out, f"{role}.npz"))), json.load(f)
    return results


def _assert_equal(have: dict, want: dict, frames: int) -> float:
    diff = 0.0
    for name, value in want.items():
        if int(name.split(".")[0]) >= frames:
            continue
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(have[name], value, rtol=0, atol=TOL, err_msg=name)
            diff = max(diff, float(np.max(np.abs(have[name] - value))))
        else:
            np.testing.assert_array_equal(have[name], value, err_msg=name)
    return diff


@spec("confidence-acceptance/rank-agreement", "confidence-acceptance/rank-zero")
def test_two_processes_run_the_programs_of_one_process_and_fail_a_diverged_frame(runs):
    reference, _ = runs["reference"]
    leader, summary = runs["leader"]
    follower, answered = runs["follower"]
    generating = 2 + DECODE_STEPS  # two prefills and the decode steps, then the diverged step
    # Rank zero's outputs, and the follower's own copies, are the single-process program's.
    assert _assert_equal(leader, reference, generating) < TOL
    assert _assert_equal(follower, reference, generating) < TOL
    last = f"{generating}.counts"
    assert reference[last].tolist() == [1, 1] and follower[last].tolist() == [1, 0]
    # Every trace frame was checked (frame 0, the state's init, inside init_state) and agreed;
    # the diverged frame failed loudly, naming the follower; then `stop`.
    assert summary["checked"] == list(range(1, CHECKED_FRAMES))
    failed = f"frame {CHECKED_FRAMES}: processes [1] committed other tokens than rank zero"
    assert summary["disagreed"] == [failed]
    assert answered["received"] == summary["frames"] == CHECKED_FRAMES + 2
