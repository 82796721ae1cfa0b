"""The Dockerfile stays runnable: what it copies exists and its server command parses."""

import json
import re
from pathlib import Path

from absl import flags

from helios_jax.serve import flags as serve_flags

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_every_copied_path_exists_and_the_package_sources_are_all_copied():
    copied = [p for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M) for p in line.split()[:-1]]
    assert all((ROOT / p).exists() for p in copied), copied
    assert {"pyproject.toml", "setup.py", "helios_jax", "kernels", "reference"} <= set(copied)


def test_the_entrypoint_is_make_serves_command_on_all_interfaces():
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", DOCKERFILE, re.M).group(1))
    assert entry[:3] == ["python", "-m", "helios_jax.serve"]
    fv = flags.FlagValues()
    serve_flags.define_flags(fv)
    fv(["serve", *entry[3:], "--engine=fake"])
    config = serve_flags.config_from_flags(fv, environ={})
    assert (config.host, config.port) == ("0.0.0.0", 8000)
