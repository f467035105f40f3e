"""Charts as inline SVG in a self-contained HTML page: no script, no stylesheet or font to fetch, no plotting library.

``svg_chart`` draws lines and markers on linear axes with rounded ticks, horizontal reference lines (an SLO) and
labelled points; ``html_page`` wraps charts and text in one file that any browser opens offline. ``report`` and
``tune`` make their charts with it.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from pathlib import Path

from pyserve.errors import ConfigError

PLOT_SUFFIXES = (".html", ".svg")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
_WIDTH, _HEIGHT = 760, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 150, 40, 56


@dataclasses.dataclass(frozen=True)
class Series:
    """Points drawn in one colour: joined by a line (in order) or markers only; ``labels`` name points."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str
    line: bool = True
    labels: Sequence[str] = ()
    marker_radius: float = 3.5


@dataclasses.dataclass(frozen=True)
class Chart:
    """A chart: its series, axis labels, and horizontal reference lines (y value, label)."""

    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    hlines: Sequence[tuple[float, str]] = ()


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks = [round(math.floor(low / step) * step, 10)]
    while ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10000:
        return f"{value:,.0f}"
    return f"{value:g}"


def svg_chart(chart: Chart) -> str:
    """The chart as an ``<svg>`` element."""
    points = [point for series in chart.series for point in series.points]
    xs = [x for x, _ in points] or [0.0, 1.0]
    ys = [y for _, y in points] + [y for y, _ in chart.hlines] or [0.0, 1.0]
    x_ticks = nice_ticks(0.0, max(xs) * 1.05 if max(xs) > 0 else 1.0)
    y_ticks = nice_ticks(0.0, max(ys) * 1.1 if max(ys) > 0 else 1.0)
    x_max, y_max = x_ticks[-1], y_ticks[-1]
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + plot_w * x / x_max

    def py(y: float) -> float:
        return _TOP + plot_h * (1 - y / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<text x="{_LEFT}" y="22" font-size="15" font-weight="bold">{html.escape(chart.title)}</text>',
    ]
    for tick in x_ticks:
        x = px(tick)
        out.append(f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_TOP + plot_h}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{x:.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{_number(tick)}</text>')
    for tick in y_ticks:
        y = py(tick)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + plot_w}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    x_label = html.escape(chart.x_label)
    out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 14}" text-anchor="middle">{x_label}</text>')
    out.append(
        f'<text transform="translate(18 {_TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{html.escape(chart.y_label)}</text>"
    )
    for value, label in chart.hlines:
        y = py(value)
        out.append(
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + plot_w}" y2="{y:.1f}" stroke="#d62728" '
            'stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{_LEFT + plot_w - 4}" y="{y - 5:.1f}" text-anchor="end" fill="#d62728">'
            f"{html.escape(label)}</text>"
        )
    for index, series in enumerate(chart.series):
        coordinates = [(px(x), py(y)) for x, y in series.points]
        if series.line and len(coordinates) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coordinates)
            out.append(f'<polyline points="{path}" fill="none" stroke="{series.color}" stroke-width="2"/>')
        for number, (x, y) in enumerate(coordinates):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{series.marker_radius}" fill="{series.color}"/>')
            if number < len(series.labels) and series.labels[number]:
                label = html.escape(series.labels[number])
                out.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="10">{label}</text>')
        legend_y = _TOP + 10 + 18 * index
        legend_x = _LEFT + plot_w + 14
        out.append(f'<circle cx="{legend_x}" cy="{legend_y}" r="5" fill="{series.color}"/>')
        out.append(f'<text x="{legend_x + 10}" y="{legend_y + 4}">{html.escape(series.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(title: str, parts: Sequence[str]) -> str:
    """A self-contained HTML page: ``parts`` are HTML fragments (charts, ``<pre>`` tables) in order."""
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n"
        '<body style="font-family: sans-serif; margin: 24px; max-width: 1100px">\n'
        f'<h1 style="font-size: 20px">{html.escape(title)}</h1>\n{body}\n</body></html>\n'
    )


def preformatted(text: str) -> str:
    """Text shown as it is (a table), escaped."""
    return f'<pre style="font-size: 12px; background: #f7f7f7; padding: 12px">{html.escape(text)}</pre>'


def write_plot(path: Path, title: str, charts: Sequence[Chart], text: str) -> None:
    """Write the charts to ``path``: an HTML page with ``text`` (a table) under them, or, for ``.svg``, the first
    chart alone."""
    suffix = path.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot {path}: write .html (or .svg), got {suffix or 'no suffix'!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".svg":
        path.write_text(svg_chart(charts[0]) + "\n")
        return
    path.write_text(html_page(title, [*(svg_chart(chart) for chart in charts), preformatted(text)]))
