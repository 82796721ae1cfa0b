"""Dependency-free SVG charts for the simulator reports (where matplotlib is not installed).

:func:`chart` draws series of (x, y) points as lines and/or markers on linear axes, with a
legend, optional labels beside points, a horizontal reference line and a caption (the trace's
attribution). Plain SVG text: it renders in any browser and in Markdown viewers.
"""

from __future__ import annotations

import dataclasses
import html
import textwrap


@dataclasses.dataclass
class Series:
    name: str
    points: list  # (x, y) pairs
    color: str = "black"
    line: bool = True
    dashed: bool = False
    width: float = 1.5
    labels: list | None = None  # text beside each point
    ring: list | None = None  # per point: draw a ring around it


@dataclasses.dataclass(frozen=True)
class Frame:
    """Pixel box of the plotting area and the data ranges it maps."""

    left: float
    top: float
    width: float
    height: float
    x_range: tuple
    y_range: tuple

    def x(self, v: float) -> float:
        lo, hi = self.x_range
        return self.left + (v - lo) / (hi - lo or 1.0) * self.width

    def y(self, v: float) -> float:
        lo, hi = self.y_range
        return self.top + self.height - (v - lo) / (hi - lo or 1.0) * self.height


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / n if hi > lo else 1.0
    return [lo + i * step for i in range(n + 1)]


def _range(values, pad: float = 0.05) -> tuple:
    lo, hi = min(values), max(values)
    span = (hi - lo) or max(abs(hi), 1.0)
    return (lo - pad * span, hi + pad * span)


def _axes(f: Frame, title: str, xlabel: str, ylabel: str) -> list[str]:
    out = [
        f'<rect x="{f.left}" y="{f.top}" width="{f.width}" height="{f.height}" fill="none" stroke="#444"/>',
        f'<text x="{f.left + f.width / 2}" y="{f.top - 8}" text-anchor="middle" font-size="12">'
        f"{html.escape(title)}</text>",
        f'<text x="{f.left + f.width / 2}" y="{f.top + f.height + 32}" text-anchor="middle" font-size="11">'
        f"{html.escape(xlabel)}</text>",
        f'<text transform="translate({f.left - 42},{f.top + f.height / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="11">{html.escape(ylabel)}</text>',
    ]
    for t in _ticks(*f.x_range):
        out.append(
            f'<line x1="{f.x(t):.1f}" y1="{f.top}" x2="{f.x(t):.1f}" y2="{f.top + f.height}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{f.x(t):.1f}" y="{f.top + f.height + 14}" text-anchor="middle" '
            f'font-size="9">{t:.3g}</text>'
        )
    for t in _ticks(*f.y_range):
        out.append(
            f'<line x1="{f.left}" y1="{f.y(t):.1f}" x2="{f.left + f.width}" y2="{f.y(t):.1f}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{f.left - 5}" y="{f.y(t) + 3:.1f}" text-anchor="end" font-size="9">{t:.3g}</text>'
        )
    return out


def _series(f: Frame, s: Series) -> list[str]:
    out = []
    pts = [(f.x(x), f.y(y)) for x, y in s.points]
    if s.line and len(pts) > 1:
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="{s.width}"{dash}/>'
        )
    for i, (x, y) in enumerate(pts):
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{s.color}"/>')
        if s.ring and s.ring[i]:
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="green" stroke-width="1.5"/>'
            )
        if s.labels:
            out.append(
                f'<text x="{x + 5:.1f}" y="{y - 4:.1f}" font-size="8">{html.escape(s.labels[i])}</text>'
            )
    return out


def chart(
    panels: list[dict], path: str, *, caption: str = "", panel_width: int = 430, height: int = 330
) -> None:
    """Write `panels` side by side to `path`. A panel: ``series`` (list of :class:`Series`),
    ``title``, ``xlabel``, ``ylabel``, optional ``hline`` (y of a dotted reference line) and
    ``legend`` (default True)."""
    total_w = panel_width * len(panels)
    body = []
    for i, p in enumerate(panels):
        xs = [x for s in p["series"] for x, _ in s.points]
        ys = [y for s in p["series"] for _, y in s.points] + (
            [p["hline"]] if p.get("hline") is not None else []
        )
        f = Frame(i * panel_width + 60, 30, panel_width - 80, height - 90, _range(xs), _range(ys))
        body += _axes(f, p.get("title", ""), p.get("xlabel", ""), p.get("ylabel", ""))
        if p.get("hline") is not None:
            y = f.y(p["hline"])
            body.append(
                f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.left + f.width}" y2="{y:.1f}" stroke="#666" '
                'stroke-dasharray="2,2"/>'
            )
        for s in p["series"]:
            body += _series(f, s)
        if p.get("legend", True):
            for j, s in enumerate(p["series"]):
                y = f.top + f.height + 48 + 11 * (j // 3)
                x = f.left + (j % 3) * (f.width / 3)
                body.append(f'<rect x="{x:.1f}" y="{y - 7:.1f}" width="10" height="3" fill="{s.color}"/>')
                body.append(f'<text x="{x + 14:.1f}" y="{y:.1f}" font-size="8">{html.escape(s.name)}</text>')
    rows = (
        max((len(p["series"]) + 2) // 3 for p in panels) if any(p.get("legend", True) for p in panels) else 0
    )
    caption_lines = textwrap.wrap(caption, max(20, int(total_w / 4.4)))  # about 4.4 px per 8-pt character
    total_h = height + 11 * rows + 11 * len(caption_lines) + 10
    for i, line in enumerate(caption_lines):
        y = total_h - 6 - 11 * (len(caption_lines) - 1 - i)
        body.append(f'<text x="6" y="{y}" font-size="8" fill="#333">{html.escape(line)}</text>')
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
        + "\n".join(body)
        + "</svg>\n"
    )
    with open(path, "w") as fh:
        fh.write(svg)
