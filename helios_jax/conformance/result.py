"""One conformance check's outcome: a verdict and the figure behind it.

Verdicts (`VERDICTS`): ``pass``, ``fail``, ``n/a`` (the catalog lacks what the check needs) and
``not achievable`` (the catalog's own measured costs make the bound impossible). Only ``fail``
fails a run.
"""

from __future__ import annotations

import dataclasses

VERDICTS = ("pass", "fail", "n/a", "not achievable")


@dataclasses.dataclass(frozen=True)
class Result:
    section: str
    check: str
    verdict: str  # pass, fail, n/a, not achievable
    figure: str
    rules: tuple[str, ...] = ()
    details: dict | None = None  # the figures behind the verdict, for --json_out

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
