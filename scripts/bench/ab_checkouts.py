"""Run one benchmark script from two checkouts, interleaved, and compare its JSON figures.

    python scripts/bench/ab_checkouts.py --base=REF [--head=REF] [--repeats=3] \\
        [--fields=cpu_median_ms] [--json_out=FILE] -- scripts/bench/plan_path.py --decisions=100

This machine is shared and noisy, so a figure is only meaningful against a baseline measured in the
same invocation: the script adds detached git worktrees for the refs (``--head`` unset: this
working tree), then runs the benchmark ``--repeats`` times from each, alternating which goes first
(ABBA...), each with ``PYTHONPATH`` and the working directory set to its checkout and
``--json_out`` pointing at a fresh file. The benchmark must accept ``--json_out``.

For every numeric leaf of the JSON whose key matches ``--fields`` (a regular expression), it
prints the median over repeats from each checkout and the ratio head/base. Leaves that are not
numbers (counts of plans by kind, say) must agree between the checkouts: any that differ are
listed, since the same decisions are part of "the same behaviour".
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[2]

flags.DEFINE_string("base", None, "git ref of the baseline checkout", required=True)
flags.DEFINE_string("head", None, "git ref of the compared checkout (default: this working tree)")
flags.DEFINE_integer("repeats", 3, "runs from each checkout")
flags.DEFINE_string("fields", r"cpu_median_ms", "regular expression: numeric keys to compare")
flags.DEFINE_string("json_out", None, "write every run's figures and the comparison here")
FLAGS = flags.FLAGS


def _flatten(value, path=""):
    """Leaves of a JSON value as {path: leaf}; list items of dicts are keyed by their index."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{path}/{key}"))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{path}[{index}]"))
        return out
    return {path: value}


def _checkout(ref: str | None, folder: pathlib.Path) -> pathlib.Path:
    if ref is None:
        return ROOT
    target = folder / ref.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(target), ref], check=True)
    # Checkouts from before helios_jax/kernels and helios_jax/reference were links mapped those
    # folders in setup.py; link them so that the package imports from PYTHONPATH as installed.
    for name in ("kernels", "reference"):
        link = target / "helios_jax" / name
        if (target / name).is_dir() and not link.exists():
            link.symlink_to(pathlib.Path("..") / name)
    return target


def _run(checkout: pathlib.Path, command: list[str], out: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run(
        [sys.executable, *command, f"--json_out={out}"],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return _flatten(json.loads(out.read_text()))


def _compare(runs: dict[str, list[dict]], pattern: re.Pattern) -> tuple[list[dict], list[str]]:
    base, head = runs["base"], runs["head"]
    rows, differing = [], []
    for key, first in base[0].items():
        leaf = key.rsplit("/", 1)[-1]
        if isinstance(first, bool) or not isinstance(first, int | float):
            if any(run.get(key) != first for run in base + head):
                differing.append(key)
        elif pattern.search(leaf):
            b = statistics.median(run[key] for run in base)
            h = statistics.median(run[key] for run in head)
            rows.append({"field": key, "base": b, "head": h, "ratio": h / b if b else float("nan")})
    return rows, differing


def main(argv):
    command = argv[1:]
    if not command:
        raise app.UsageError("give the benchmark after --, e.g. -- scripts/bench/plan_path.py")
    with tempfile.TemporaryDirectory(prefix="ab_checkouts_") as tmp:
        folder = pathlib.Path(tmp)
        checkouts = {"base": _checkout(FLAGS.base, folder), "head": _checkout(FLAGS.head, folder)}
        runs: dict[str, list[dict]] = {"base": [], "head": []}
        try:
            for repeat in range(FLAGS.repeats):
                order = ("base", "head") if repeat % 2 == 0 else ("head", "base")
                for side in order:
                    out = folder / f"{side}-{repeat}.json"
                    runs[side].append(_run(checkouts[side], command, out))
                    print(f"repeat {repeat + 1}/{FLAGS.repeats}: {side} done", flush=True)
        finally:
            for checkout in checkouts.values():
                if checkout != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)])
    rows, differing = _compare(runs, re.compile(FLAGS.fields))
    print(f"\n{'field':60s} {'base':>10s} {'head':>10s} {'head/base':>9s}")
    for row in rows:
        print(f"{row['field']:60s} {row['base']:10.4f} {row['head']:10.4f} {row['ratio']:9.3f}")
    print(f"\nnon-numeric figures that differ between runs: {differing or 'none'}")
    if FLAGS.json_out:
        summary = {"base": FLAGS.base, "head": FLAGS.head, "command": command, "comparison": rows}
        summary["differing"] = differing
        pathlib.Path(FLAGS.json_out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    app.run(main)
