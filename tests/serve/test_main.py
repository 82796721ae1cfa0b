"""``python -m helios_jax.serve``: startup progress, serving, clean shutdown, flag errors."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "helios_jax.serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def read_until(proc: subprocess.Popen, pattern: str, timeout: float = 30.0) -> tuple[re.Match, str]:
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError(f"{pattern!r} not in output:\n{seen}")


def test_serves_the_fake_engine_and_shuts_down_on_sigterm():
    proc = start("--engine=fake", "--port=0", "--served_model_name=tiny", "--api_key=k")
    try:
        match, _ = read_until(proc, r"\[1/3\] listening on (http://127\.0\.0\.1:\d+)")
        url = match.group(1)
        _, progress = read_until(proc, r"\[3/3\] ready: serving model 'tiny'")
        assert "[2/3] building the fake engine" in progress
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            assert r.status == 200
        body = json.dumps({"prompt": "a", "max_tokens": 3}).encode()
        headers = {"Authorization": "Bearer k", "Content-Type": "application/json"}
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.load(r)["choices"][0]["text"] == "The"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "shutting down" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()


def test_bad_flags_fail_before_serving_and_name_the_flag():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "helios_jax.serve",
            "--engine=fake",
            "--port=0",
            "--mtp_adaptive_verification_alpha=0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    assert "--mtp_adaptive_verification_alpha must be finite and greater than zero, got 0.0" in proc.stderr
    assert "listening" not in proc.stderr
