"""A follower that dies: what the group does (`test_group_failure.py`).

    python -m tests.programs.group_failure_run PROCESS_ID PORT

Both processes join a two-process group through `helios_jax.distributed.group.initialize` (the
server's own path, `--heartbeat_timeout_seconds=5`; no program is compiled). Process 1 exits at
once without a word to anyone, as a crashed or killed follower does. Process 0 publishes a frame
and waits for the follower's digest (`FrameChannel.answers`, whose own timeout is minutes): it
must not wait that long, and must not serve on. It prints `waiting` before the wait and
`answered` if the wait ever returns.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from helios_jax.distributed import group as group_lib  # noqa: E402


def main(process_id: int, port: str) -> None:
    group = group_lib.initialize(f"localhost:{port}", 2, process_id, heartbeat_timeout_seconds=5)
    if process_id == 1:
        os._exit(0)
    group.channel.publish(0, b"a frame nobody will run")
    print("waiting", flush=True)
    group.channel.answers(0)
    print("answered", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
