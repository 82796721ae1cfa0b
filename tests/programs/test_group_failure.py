"""A follower that dies takes its group down within the heartbeat timeout (docs/distributed.md,
"Several processes").

JAX's coordination service, which every process of a group joined in
`jax.distributed.initialize`, notices a member without heartbeats for `--heartbeat_timeout_seconds`
(5 here, 100 by default) and terminates every other member (`Terminating process because the JAX
distributed service detected fatal errors`). Process 0 therefore never waits out a dead
follower's digest (five minutes) nor serves on without it: the whole group ends, and restarts as
a whole. No program is compiled: about ten seconds.
"""

import socket
import subprocess
import sys
import time

from .test_multi_process import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_a_dead_follower_ends_process_zero_within_seconds():
    port = str(_free_port())
    command = [sys.executable, "-m", "tests.programs.group_failure_run"]
    start = time.monotonic()
    leader = subprocess.Popen(
        command + ["0", port], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    follower = subprocess.Popen(command + ["1", port], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        out, err = leader.communicate(timeout=120)
        follower.communicate(timeout=30)
    finally:
        leader.kill()
        follower.kill()
    elapsed = time.monotonic() - start
    assert follower.returncode == 0
    assert "answered" not in out
    assert leader.returncode != 0, out + err[-2000:]
    assert "detected fatal errors" in err, err[-2000:]
    assert elapsed < 60, elapsed  # the heartbeat timeout is 5 s; the digest wait is five minutes
