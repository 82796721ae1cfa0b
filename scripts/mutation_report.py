"""Kill rate per module from mutmut's results (`make mutation`; docs/mutation.md).

    python scripts/mutation_report.py                                   # every mutated module
    python scripts/mutation_report.py --paths=helios_jax/scheduler/cost.py,helios_jax/catalog.py
    python scripts/mutation_report.py --markdown                        # the table for docs/mutation.md
    python scripts/mutation_report.py --diffs                           # each survivor's diff too
    python scripts/mutation_report.py --sample=7                        # only mutants numbered ...7
    python scripts/mutation_report.py \\
        --sample=helios_jax/scheduler/core.py=7,helios_jax/scheduler/utility.py=37

mutmut keeps one `<module>.py.meta` JSON file per mutated module under mutants/, mapping every
mutant's name (`module.function__mutmut_N`, methods as `module.xǁClassǁmethod__mutmut_N`) to
the exit code of the tests run against it. This reads them and prints, per module: the mutants,
how many the tests killed, how many survived, how many of the survivors are recorded as
equivalent, how many timed out (the tests did not finish: detected, as CI would fail), how many
ended otherwise (no test reached the function, a crash, not run yet), and the kill rate,
(killed + timeout) / (mutants - equivalent). Then it lists every mutant that was neither detected
nor recorded as equivalent.

A sample (`make mutation SAMPLE=7`) runs, in every function, the mutants whose number ends in one
of the given digits: a systematic sample of about a tenth per digit, spread over every function
in proportion to its mutants. `--sample` restricts the counts to those mutants and adds a 95%
Wilson interval for the module's kill rate over all its mutants.

Equivalent mutants (the program behaves identically with the change) are recorded, each with its
reason, as rows of docs/mutation.md whose first cell is the mutant's name in backticks. mutmut
numbers mutants within a function, so a changed function renumbers its own mutants: a recorded
name that no longer survives is reported as stale, to be checked again.
"""

from __future__ import annotations

import collections
import fnmatch
import json
import math
import os
import pathlib
import re
import sys

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]

FLAGS = flags.FLAGS
flags.DEFINE_string("mutants_dir", str(ROOT / "mutants"), "mutmut's working folder")
flags.DEFINE_list("paths", [], "restrict to these source files or folders (default: every mutated module)")
flags.DEFINE_string(
    "equivalents",
    str(ROOT / "docs" / "mutation.md"),
    "markdown file whose table rows `| `mutant` | reason |` record equivalent mutants",
)
flags.DEFINE_bool("markdown", False, "print the per-module table as markdown")
flags.DEFINE_bool("diffs", False, "print each listed survivor's diff (`mutmut show`)")
flags.DEFINE_list(
    "sample",
    [],
    "DIGITS, or PATH=DIGITS per module: count only the mutants whose number ends in "
    "one of DIGITS (the sample `make mutation SAMPLE=DIGITS` ran); modules not named count whole",
)
flags.DEFINE_bool(
    "list_survivors", True, "list the mutants that were neither killed nor recorded as equivalent"
)

# mutmut's exit codes (mutmut/stats.py, status_by_exit_code): the tests failed, so the mutant is killed.
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}
STATUS = {
    None: "not checked",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    37: "caught by type check",
    2: "interrupted",
    -11: "segfault",
    -9: "killed by signal",
}

_ROW = re.compile(r"^\|\s*`([^`]+__mutmut_\d+)`\s*\|")


def status(code) -> str:
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in TIMEOUT:
        return "timeout"
    return STATUS.get(code, "suspicious")


def equivalents(path: pathlib.Path) -> set[str]:
    if not path.exists():
        return set()
    return {m.group(1) for line in path.read_text().splitlines() if (m := _ROW.match(line))}


def results(mutants_dir: pathlib.Path, paths: list[str]) -> dict[str, dict[str, int | None]]:
    """{source path: {mutant name: exit code}} for the modules under `paths` (all when empty)."""
    wanted = [p.rstrip("/") for p in paths]
    out = {}
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        source = meta.relative_to(mutants_dir).as_posix()[: -len(".meta")]
        if wanted and not any(source == w or source.startswith(w + "/") for w in wanted):
            continue
        out[source] = json.loads(meta.read_text())["exit_code_by_key"]
    return out


def sample_digits(spec: list[str]) -> dict[str, str]:
    """{source path or "" for every module: digits} from the --sample flag."""
    out = {}
    for item in spec:
        path, _, digits = item.rpartition("=")
        if not digits.isdigit():
            raise app.UsageError(f"--sample: {item!r} is not DIGITS or PATH=DIGITS")
        out[path.rstrip("/")] = digits
    return out


def in_sample(codes: dict[str, int | None], digits: str | None) -> dict[str, int | None]:
    if not digits:
        return codes
    return {name: code for name, code in codes.items() if fnmatch.fnmatch(name, f"*__mutmut_*[{digits}]")}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (a sampled kill rate)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def tally(codes: dict[str, int | None], equivalent: set[str]) -> dict:
    counts = collections.Counter(status(c) for c in codes.values())
    eq = sum(1 for name, c in codes.items() if name in equivalent and status(c) == "survived")
    killed, timeout = counts["killed"], counts["timeout"]
    other = len(codes) - killed - timeout - counts["survived"]
    denominator = len(codes) - eq
    low, high = wilson(killed + timeout, denominator)
    return dict(
        mutants=len(codes),
        killed=killed,
        survived=counts["survived"],
        equivalent=eq,
        timeout=timeout,
        other=other,
        rate=(killed + timeout) / denominator if denominator else float("nan"),
        interval=f"{100 * low:.1f}–{100 * high:.1f}%",
    )


def main(argv):
    del argv
    mutants_dir = pathlib.Path(FLAGS.mutants_dir)
    by_module = results(mutants_dir, FLAGS.paths)
    if not by_module:
        sys.exit(f"no mutmut results under {mutants_dir}: run `make mutation` first")
    digits = sample_digits(FLAGS.sample)
    sampled = {source for source in by_module if digits.get(source, digits.get(""))}
    every_result = {name: code for codes in by_module.values() for name, code in codes.items()}
    by_module = {
        source: in_sample(codes, digits.get(source, digits.get(""))) for source, codes in by_module.items()
    }
    equivalent = equivalents(pathlib.Path(FLAGS.equivalents))

    rows = [(source, tally(codes, equivalent)) for source, codes in by_module.items()]
    total = tally({k: v for codes in by_module.values() for k, v in codes.items()}, equivalent)
    header = ("module", "mutants", "killed", "survived", "equivalent", "timeout", "other", "kill rate")
    if sampled:
        header += ("95% interval",)
    cells = [
        (
            s,
            str(t["mutants"]),
            str(t["killed"]),
            str(t["survived"]),
            str(t["equivalent"]),
            str(t["timeout"]),
            str(t["other"]),
            f"{100 * t['rate']:.1f}%",
        )
        + ((t["interval"] if s in sampled else "",) if sampled else ())
        for s, t in rows + [("total", total)]
    ]
    if FLAGS.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        for c in cells:
            print("| " + " | ".join((f"`{c[0]}`" if c[0] != "total" else "**total**",) + c[1:]) + " |")
    else:
        widths = [max(len(r[i]) for r in cells + [header]) for i in range(len(header))]
        fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
        print(fmt.format(*header))
        for c in cells:
            print(fmt.format(*c))
    print(
        "\nkill rate = (killed + timeout) / (mutants - equivalent); survived includes the equivalent ones;"
        "\nother = no test reached the mutant, a crash, or not run yet"
        + (
            "\nsampled modules count only the mutants numbered ...["
            + "], ...[".join(sorted(set(digits.values())))
            + "]; the interval is the kill rate's 95% Wilson interval for all of the "
            "module's\nnon-equivalent mutants (approximate: the sample is systematic, not random)"
            if sampled
            else ""
        )
    )

    if FLAGS.list_survivors:
        open_ = [
            (name, status(code))
            for codes in by_module.values()
            for name, code in codes.items()
            if status(code) not in ("killed", "timeout")
            and not (name in equivalent and status(code) == "survived")
        ]
        print(f"\n{len(open_)} mutants neither detected nor recorded as equivalent" + (":" if open_ else "."))
        source_of = {name: source for source, codes in by_module.items() for name in codes}
        for name, st in open_:
            print(f"  {st:>12}  {name}")
            if FLAGS.diffs:
                print("\n".join("      " + line for line in _diff(name, source_of[name], mutants_dir)))
        # Rows outside a sample are still checked against their last result.
        stale = sorted(
            name
            for name in equivalent
            if name in every_result and status(every_result[name]) in ("killed", "timeout")
        )
        missing = sorted(
            name
            for name in equivalent
            if name not in every_result and any(name.startswith(_module(s) + ".") for s in by_module)
        )
        for name in stale:
            print(f"  stale equivalent (no longer survives, check the row): {name}")
        for name in missing:
            print(f"  stale equivalent (no such mutant any more, check the row): {name}")


def _diff(name: str, source: str, mutants_dir: pathlib.Path) -> list[str]:
    """The changed lines of one mutant (mutmut's own diff, read in this process)."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant
    except ImportError:
        return ["(install the mutation extra to show diffs)"]
    cwd = pathlib.Path.cwd()
    try:
        os.chdir(mutants_dir.parent)  # mutmut reads mutants/<source> relative to the project root
        diff = get_diff_for_mutant(name, path=source)
    finally:
        os.chdir(cwd)
    return [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def _module(source: str) -> str:
    return source[: -len(".py")].replace("/", ".")


if __name__ == "__main__":
    app.run(main)
