"""``python -m helios_jax.serve``: startup progress, serving, clean shutdown, flag errors."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest


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


def wait_for_draining(url: str, timeout: float = 5.0) -> bool:
    """Whether /health says "draining" within `timeout` (the signal is handled asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
        except urllib.error.HTTPError as e:
            if json.load(e) == {"status": "draining"}:
                return True
        time.sleep(0.01)
    return False


def test_serves_the_fake_engine_and_drains_on_sigterm():
    """SIGTERM lets a stream in flight finish (the drain), then the process exits with 0."""
    proc = start("--engine=fake", "--port=0", "--served_model_name=tiny", "--fake_token_delay_ms=20")
    try:
        match, _ = read_until(proc, r"\[1/3\] listening on (http://127\.0\.0\.1:\d+)")
        url = match.group(1)
        _, progress = read_until(proc, r"\[3/3\] ready: serving model 'tiny'")
        assert "[2/3] building the fake engine" in progress
        frozen = re.search(r"froze the startup heap: (\d+) objects", progress)
        assert frozen and int(frozen.group(1)) > 10_000  # the interpreter's and libraries' own
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            assert r.status == 200
        body = json.dumps({"prompt": "a", "max_tokens": 3}).encode()
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.load(r)["choices"][0]["text"] == "The"
        stream = json.dumps({"prompt": "a", "max_tokens": 100, "stream": True}).encode()  # 2 s
        req = urllib.request.Request(f"{url}/v1/completions", data=stream, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            first = r.readline()
            proc.send_signal(signal.SIGTERM)
            assert wait_for_draining(url)
            req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=5)
            assert refused.value.code == 503
            rest = r.read().decode()
        assert first.startswith(b"data: ") and rest.rstrip().endswith("data: [DONE]")
        assert '"finish_reason":"length"' in rest
        assert proc.wait(timeout=10) == 0
        output = proc.stdout.read()
        assert "shutting down: draining" in output and "drained" in output
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


def test_help_lists_the_server_and_engine_flags_also_for_the_console_command():
    for command in (
        ["-m", "helios_jax.serve", "--help"],
        [
            "-c",
            "import sys; sys.argv[0] = 'helios-serve'; from helios_jax.serve.__main__ import run; run()",
            "--help",
        ],
    ):
        proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=30)
        for flag in ("--drain_timeout_s", "--allowed_origins", "--api_key", "--concurrency", "--model"):
            assert flag in proc.stdout, (command, flag)


def test_a_model_that_is_not_a_folder_fails_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "helios_jax.serve", "--port=0", "--model=Qwen/Qwen3-0.6B"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    assert "--model must be a local model folder" in proc.stderr and "'Qwen/Qwen3-0.6B'" in proc.stderr
    assert "Traceback" not in proc.stderr and "listening" not in proc.stderr


def test_freezing_the_startup_heap_leaves_later_objects_to_the_collector():
    """What the server freezes after its engine is ready is out of every later collection; what
    is made afterwards is collected as before (a cycle made after the freeze is reclaimed)."""
    import gc
    import weakref

    from helios_jax.serve.app import freeze_startup_heap

    class Node:
        pass

    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 0
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
