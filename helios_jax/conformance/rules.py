"""The spec's checkable rules (RULES.md shipped with the package), parsed."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import re


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    section: str
    text: str
    check: str  # unit, sim, model, kernel, http or doc


@functools.cache
def rules() -> tuple[Rule, ...]:
    text = importlib.resources.files("helios_jax.conformance").joinpath("RULES.md").read_text()
    out, section = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        m = re.match(r"\|\s*([a-z0-9-]+/[a-z0-9-]+)\s*\|\s*(.*?)\s*\|\s*(\w+)\s*\|\s*$", line)
        if m:
            out.append(Rule(m.group(1), section, m.group(2), m.group(3)))
    return tuple(out)


def rule_ids() -> set[str]:
    return {r.id for r in rules()}
