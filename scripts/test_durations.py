"""Per-file test times for `make test`'s scheduling: tests/durations.json from a pytest run.

    make test-durations        # runs the suite with --durations=0, then this script

or by hand:

    python -m pytest -n 2 --dist loadfile -m "not slow" --durations=0 -q | tee /tmp/durations.txt
    python scripts/test_durations.py /tmp/durations.txt [/tmp/durations2.txt ...]

`make test` hands whole test files to two pytest-xdist workers in collection order
(`--dist loadfile --no-loadscope-reorder`); tests/conftest.py puts the files with the longest
recorded times first, so that the last file a worker takes is a short one and both workers
finish together (longest processing time first). The times are setup + call + teardown summed
per file, in seconds, rounded; with several runs, each file's mean over the runs that hold it
(the machines are shared: one loaded run can inflate whatever ran beside the load). Files
missing from the record run after the recorded ones.
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import statistics
import sys

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+?)::")
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def per_file(lines) -> dict[str, float]:
    times: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        match = LINE.match(line)
        if match:
            times[match.group(3)] += float(match.group(1))
    return {path: round(t, 1) for path, t in sorted(times.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = [per_file(pathlib.Path(path).read_text().splitlines()) for path in argv[1:]]
    if not all(runs):
        print("a file without --durations lines among the arguments", file=sys.stderr)
        return 1
    root = OUT.parents[1]
    files = {path for run in runs for path in run if (root / path).exists()}  # not since removed
    means = {path: statistics.mean(run[path] for run in runs if path in run) for path in files}
    times = {path: round(t, 1) for path, t in sorted(means.items(), key=lambda kv: -kv[1])}
    OUT.write_text(json.dumps(times, indent=1) + "\n")
    print(f"{len(times)} files from {len(runs)} run(s), {sum(times.values()):.0f} s in all -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
