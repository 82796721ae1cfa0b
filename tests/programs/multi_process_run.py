"""Two processes, one scheduler: a fixed trace through the leader and follower paths.

    python -m tests.programs.multi_process_run reference OUT
    python -m tests.programs.multi_process_run member PROCESS_ID PORT OUT

`reference` runs the trace in one process over two forced host devices (tensor_parallel=2).
`member` is one of two processes with one CPU device each, joined by `jax.distributed` on
localhost:PORT with gloo collectives, so the `tp` mesh spans both: process 0 leads
(`distributed.leader.lead`: each call publishes its frame, runs over the global mesh, and
`check` compares the follower's committed-token digest), process 1 follows
(`distributed.follower.follow`). The trace: a fresh state, initialize two greedy requests,
prefill their prompts, DECODE_STEPS decode steps (every frame checked); then one more decode
step that the follower runs with its second lane inactive (`alter`): its committed tokens
differ from rank zero's and the leader's check must raise `RanksDisagree`.
Each process writes its outputs (rank zero's on the leader, its own copy on the follower) as
OUT/<role>.npz and a JSON summary as OUT/<role>.json.
"""

from __future__ import annotations

import os
import sys

from ..environment import xla_flags  # noqa: E402

ROLE = sys.argv[1] if len(sys.argv) > 1 else ""
# Two forced devices for the single-process reference; one CPU device per member process,
# whatever the caller's flags force.
os.environ["XLA_FLAGS"] = xla_flags(devices=2 if ROLE == "reference" else 1)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from helios_jax.catalog import Catalog  # noqa: E402
from helios_jax.compilation_cache import enable_compilation_cache  # noqa: E402
from helios_jax.model import tiny_config  # noqa: E402
from helios_jax.programs import build_programs  # noqa: E402

from .helpers import DECODE, ORDINARY_ENGINE, PREFILLS, STATE_OPS, random_params  # noqa: E402

CONFIG = tiny_config(num_heads=8, num_kv_heads=4)
ENGINE = ORDINARY_ENGINE.replace(tensor_parallel=2)
SLOTS = (1, 3)
PROMPTS = ([5, 17, 99, 3, 250, 42, 42, 7, 1, 0, 128], [9, 8, 7, 6, 5, 4, 3, 2, 1, 200])
DECODE_STEPS = 4
CHECKED_FRAMES = 1 + 2 + 2 + DECODE_STEPS  # init, two initializes, two prefills, the decodes
FIELDS = ("tokens", "counts", "logprobs")


def programs_and_params():
    catalog = Catalog(
        "multi-process",
        "ordinary",
        ENGINE.speculative_token_capacity,
        ENGINE.request_slots,
        (STATE_OPS[0], PREFILLS[0], DECODE),
    )
    programs = build_programs(CONFIG, random_params(CONFIG, seed=0), ENGINE, catalog)
    return programs, programs.place_params(random_params(CONFIG, seed=0))


def trace(programs, params, check, seconds: list | None = None) -> list[dict]:
    """Runs the trace's frames, calling `check(program, outputs)` after each; returns the
    outputs of the generating frames as host arrays (`seconds`: gets each frame's wall times,
    from the call through the host's read of its tokens, and of its check)."""
    n = ENGINE.pages_per_row
    tables = [list(range(s * n, (s + 1) * n)) for s in SLOTS]
    state, got = programs.init_state(), []

    def run(graph, **host):
        nonlocal state
        program = programs[graph.key]
        start = time.perf_counter()
        state, out = program(params, state, program.pack(**host))
        np.asarray(getattr(out, "tokens", 0))
        read = time.perf_counter()
        check(program, out)
        if seconds is not None:
            seconds.append((read - start, time.perf_counter() - read))
        return out

    for slot, prompt, table in zip(SLOTS, PROMPTS, tables):
        init = dict(temperature=[0.0], top_p=[1.0], top_k=[0], seeds=[0], logprobs=[True])
        run(STATE_OPS[0], slots=[slot], **init)
        out = run(PREFILLS[0], slot=slot, tokens=prompt, page_table=table, prompt_ends=True)
        got.append({f: np.asarray(getattr(out, f)) for f in FIELDS})
    for _ in range(DECODE_STEPS + 1):
        out = run(DECODE, slots=list(SLOTS), page_tables=tables)
        got.append({f: np.asarray(getattr(out, f)) for f in FIELDS})
    return got


def drop_lane(seq: int, host):
    """The diverged follower: from the first frame after the checked trace, it runs its second
    lane as inactive (its committed count is 0 where rank zero's is 1)."""
    if seq < CHECKED_FRAMES:
        return host
    return host.replace(active=np.asarray([True, False]))


def save(out: str, role: str, frames: list[dict], summary: dict) -> None:
    arrays = {f"{i}.{k}": v for i, f in enumerate(frames) for k, v in f.items()}
    np.savez(os.path.join(out, f"{role}.npz"), **arrays)
    with open(os.path.join(out, f"{role}.json"), "w") as f:
        json.dump(summary, f)


def lead(programs, params, group) -> tuple[list[dict], dict]:
    from helios_jax.distributed.leader import RanksDisagree, lead

    programs = lead(programs, group.channel)
    checked, disagreed = [], []

    def check(program, out):
        try:
            program.check(out)
            checked.append(programs.leader.seq - 1)
        except RanksDisagree as e:
            disagreed.append(str(e))

    seconds = []
    frames = trace(programs, params, check, seconds)
    programs.leader.stop()
    return frames, dict(
        checked=checked, disagreed=disagreed, frames=programs.leader.seq, decode_ms=_decode_ms(seconds)
    )


def _decode_ms(seconds: list[tuple[float, float]]) -> dict[str, float]:
    """Median wall times of the checked decode frames after the first (which compiles): from
    the call through the host's read of the tokens, and of the check that follows."""
    run, check = np.median(np.asarray(seconds[5 : 4 + DECODE_STEPS]), axis=0)
    return dict(run=round(1000 * float(run), 3), check=round(1000 * float(check), 3))


def main(argv) -> None:
    enable_compilation_cache()  # every compile cached, however short: a warm run compiles nothing
    if argv[1] == "reference":
        programs, params = programs_and_params()
        seconds = []
        frames = trace(programs, params, lambda program, out: None, seconds)
        save(argv[2], "reference", frames, dict(decode_ms=_decode_ms(seconds)))
        return
    from helios_jax.distributed import group as group_lib
    from helios_jax.distributed.follower import follow

    pid, port, out = int(argv[2]), argv[3], argv[4]
    group = group_lib.initialize(f"localhost:{port}", 2, pid)
    programs, params = programs_and_params()
    assert programs.mesh.size == 2 and len(programs.mesh.local_devices) == 1
    if group.leader:
        frames, summary = lead(programs, params, group)
        save(out, "leader", frames, summary)
        return
    frames = []

    def keep(seq, outputs):
        if getattr(outputs, "tokens", None) is not None:
            frames.append({f: np.asarray(getattr(outputs, f)) for f in FIELDS})

    received = follow(programs, params, group.channel, on_outputs=keep, alter=drop_lane)
    save(out, "follower", frames, dict(received=received))


if __name__ == "__main__":
    main(sys.argv)
