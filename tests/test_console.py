"""The console commands pyproject installs: each runs its program and lists its flags in --help."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each command, a flag of its own and an engine flag (defined in other modules) --help must list.
COMMANDS = {
    "helios-serve": ("helios_jax.serve.__main__", ("--drain_timeout_s", "--api_key", "--concurrency")),
    "helios-prepare": ("helios_jax.prepare.__main__", ("--catalog_out", "--measure", "--concurrency")),
    "helios-conformance": ("helios_jax.conformance.__main__", ("--sections", "--generated", "--policy")),
}


def test_pyproject_installs_every_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {name: f"{module}:run" for name, (module, _) in COMMANDS.items()}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_under_the_command_name_lists_its_flags(name):
    """Run as the installed script is (``sys.argv[0]`` its name): absl's --help would otherwise
    list no flags at all, since none are defined in a module of that name."""
    module, wanted = COMMANDS[name]
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import run; run()"
    proc = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]  # (absl's --help exits with 1)
    for flag in wanted:
        assert flag in proc.stdout, (name, flag)
