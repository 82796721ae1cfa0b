"""`python -m helios_jax.serve` over two processes (docs/distributed.md): the same completions
as one process. Each server compiles the default model's catalog at tensor_parallel=2, so the
engine is the smallest that serves (one request slot, single-step decode, no speculation, no
snapshot rows: six programs); the leader/follower machinery itself is checked program by
program in tests/programs/test_multi_process.py. The single-process server's completions are
recorded in tests/golden/multi_process_server.json (a slow test re-derives them), so CI compiles
only the two processes' programs."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from ..environment import subprocess_env
from .test_main import read_until

ENGINE_FLAGS = (
    "--port=0",
    "--tensor_parallel=2",
    "--concurrency=1",
    "--decode_steps=1",
    "--speculation=off",
    "--prefill_chunks=32",
    "--max_model_len=128",
    "--snapshot_rows=0",
)
PROMPTS = ("The quick brown fox", "def add(a, b):\n")


def _start(*args: str, devices: int = 1, log=subprocess.PIPE) -> subprocess.Popen:
    env = subprocess_env(devices, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "helios_jax.serve", *ENGINE_FLAGS, *args]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def _completions(proc: subprocess.Popen) -> list[dict]:
    match, _ = read_until(proc, r"\[1/3\] listening on (http://127\.0\.0\.1:\d+)", timeout=60)
    read_until(proc, r"\[3/3\] ready", timeout=1800)
    got = []
    for prompt in PROMPTS:
        body = json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1}).encode()
        request = urllib.request.Request(
            f"{match.group(1)}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            choice = json.load(r)["choices"][0]
        got.append({"text": choice["text"], "tokens": choice["logprobs"]["tokens"]})
    return got


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        proc.kill()


GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "multi_process_server.json"


def _single_process_completions() -> list[dict]:
    single = _start(devices=2)
    try:
        return _completions(single)
    finally:
        assert _stop(single) == 0


def test_two_processes_serve_the_completions_of_one(tmp_path):
    """The completions the single-process server answers at N = 2 (recorded in GOLDEN, which
    the slow test below re-derives from a live single-process server)."""
    want = json.loads(GOLDEN.read_text())
    with socket.socket() as s:
        s.bind(("localhost", 0))
        group = f"--coordinator_address=localhost:{s.getsockname()[1]}"
    with open(tmp_path / "follower.log", "w") as log:
        follower = _start(group, "--num_processes=2", "--process_id=1", log=log)
        leader = _start(group, "--num_processes=2", "--process_id=0")
        try:
            have = _completions(leader)
        finally:
            status = _stop(leader)
            try:
                follower_status = follower.wait(timeout=120)  # process 0 published `stop`
            finally:
                follower.kill()
    assert status == 0 and follower_status == 0, (tmp_path / "follower.log").read_text()[-4000:]
    assert have == want and all(len(c["tokens"]) == 16 for c in want)
    assert "follows process 0" in (tmp_path / "follower.log").read_text()


@pytest.mark.slow  # one more server compiled, for a reference that changes only with the model
def test_the_single_process_server_answers_the_recorded_completions():
    """GOLDEN is what `python -m helios_jax.serve` answers as one process at N = 2 (rewrite it
    with HELIOS_WRITE_GOLDEN=1 when the model or the sampling changes)."""
    got = _single_process_completions()
    if os.environ.get("HELIOS_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(GOLDEN.read_text())
