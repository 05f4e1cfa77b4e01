"""A small inline-SVG line chart: the report's charts, with no JS and no external assets.

Why not a plotting library: the report must be one self-contained file that renders in any
browser (and in a mail or a ticket attachment), and the controller should not need
matplotlib. A line chart with axes, ticks and a legend is about a hundred lines.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from markupsafe import Markup, escape

# Distinguishable on white and for the common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442")


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 2.5 or 5 times a power of ten apart;
    whole numbers only with integer=True, for an axis of steps)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw
                and (not integer or float(m * power).is_integer()))
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value < high + step * 0.999:
        ticks.append(round(value, 10))
        value += step
    return ticks


def format_number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}K"
    if magnitude >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}"


def line_chart(series: dict[str, Sequence[tuple[float, float]]], *, title: str,
               x_label: str = "", y_label: str = "", width: int = 640, height: int = 260,
               y_from_zero: bool = False, css_class: str = "chart",
               reference: Optional[tuple[str, float]] = None, x_integer: bool = True) -> Markup:
    """One SVG chart with a polyline per series; `reference` draws a dashed horizontal line
    (e.g. the baseline's throughput). Points with a None y are skipped."""
    clean = {name: [(float(x), float(y)) for x, y in points if y is not None and x is not None]
             for name, points in series.items()}
    clean = {name: points for name, points in clean.items() if points}
    left, right, top, bottom = 62, 16, 30, 44      # bottom: tick labels and the x-axis label
    legend_rows = math.ceil(len(clean) / 4) if clean else 0
    legend_h = legend_rows * 16 + (6 if legend_rows else 0)
    height += legend_h
    plot_w, plot_h = width - left - right, height - top - bottom - legend_h
    parts = _opened(css_class, title, width, height, left)
    if not clean:
        return _empty(parts, width, height, "no data recorded")

    xs, ys = _coordinates(clean)
    if reference:
        ys.append(reference[1])
    y_ticks = nice_ticks(0.0 if y_from_zero else min(ys), max(ys))
    x_ticks = nice_ticks(min(xs), max(xs), count=6, integer=x_integer)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1.0) * plot_h

    # grid and axes
    for tick in y_ticks:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" '
                     f'stroke="#e5e5e5"/>'
                     f'<text x="{left - 6}" y="{sy(tick) + 4:.1f}" text-anchor="end" fill="#555">'
                     f"{format_number(tick)}</text>")
    for tick in x_ticks:
        parts.append(f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{top + plot_h}" '
                     f'y2="{top + plot_h + 4}" stroke="#555"/>'
                     f'<text x="{sx(tick):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                     f'fill="#555">{format_number(tick)}</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
                 f'stroke="#999"/>')
    if x_label:
        parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 32}" text-anchor="middle" '
                     f'fill="#333">{escape(x_label)}</text>')
    if y_label:
        parts.append(f'<text x="14" y="{top + plot_h / 2}" text-anchor="middle" fill="#333" '
                     f'transform="rotate(-90 14 {top + plot_h / 2})">{escape(y_label)}</text>')
    if reference:
        label, value = reference
        parts.append(f'<line class="reference" x1="{left}" x2="{left + plot_w}" y1="{sy(value):.1f}" '
                     f'y2="{sy(value):.1f}" stroke="#666" stroke-dasharray="5 4"/>'
                     f'<text x="{left + plot_w - 4}" y="{sy(value) - 4:.1f}" text-anchor="end" '
                     f'fill="#666">{escape(label)}</text>')

    # one polyline per series, plus dots so a single point still shows
    for index, (name, points) in enumerate(clean.items()):
        color = PALETTE[index % len(PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(points))
        parts.append(f'<polyline data-series="{escape(name)}" fill="none" stroke="{color}" '
                     f'stroke-width="1.8" stroke-linejoin="round" points="{coords}"/>')
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
    # legend under the x axis label
    for index, name in enumerate(clean):
        row, col = divmod(index, 4)
        lx = left + col * (plot_w / 4)
        ly = top + plot_h + bottom + 12 + row * 16
        color = PALETTE[index % len(PALETTE)]
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 8}" width="12" height="3" fill="{color}"/>'
                     f'<text x="{lx + 16:.1f}" y="{ly - 4}" fill="#333">{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(values: Sequence[float]) -> str:
    """A text sparkline for Markdown: one block character per value (at most 40)."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    if len(values) > 40:
        stride = len(values) / 40
        values = [values[int(i * stride)] for i in range(40)]
    blocks = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(blocks[min(7, int((v - low) / span * 7.999))] for v in values)


# ------------------------------------------------------------------ a history with its change points
MARK_COLORS = {"drop": "#cf222e", "rise": "#1a7f37", "spread": "#9a6700", "over": "#8c959f"}
LABEL_ROWS = 6         # change points labelled above the plot, one row each (no overlaps)


def history_chart(series: dict[str, Sequence[tuple[float, Optional[float]]]],
                  marks: Sequence[dict], *, title: str, width: int = 900, height: int = 300,
                  css_class: str = "chart chart-history") -> Markup:
    """Levels night by night (a polyline and a dot per night for each series) with the
    change points marked: MARKS are dicts of series, night (the first night of the new
    level), label (its size, shown above the plot), tone (MARK_COLORS' keys), title (the
    culprit line: a tooltip) and segments [(first night, last night, level)], the levels
    either side drawn as dashed steps, or slopes [(first night, last night, first level,
    last level)], a trend's fitted line, dashed. The vertical line sits between the last
    night of the old level and the first of the new."""
    clean = {name: [(float(x), float(y)) for x, y in points if y is not None]
             for name, points in series.items()}
    clean = {name: points for name, points in clean.items() if points}
    rows = min(len(marks), LABEL_ROWS)
    left, right, top, bottom = 62, 16, 30 + 14 * rows, 44
    legend_h = (math.ceil(len(clean) / 4) * 16 + 6) if len(clean) > 1 else 0
    height += legend_h + 14 * rows
    plot_w, plot_h = width - left - right, height - top - bottom - legend_h
    parts = _opened(css_class, title, width, height, left)
    if not clean:
        return _empty(parts, width, height, "no throughput recorded")
    xs, ys = _coordinates(clean)
    ys += [level for mark in marks for _, _, level in mark.get("segments", [])]
    ys += [level for mark in marks for _, _, *ends in mark.get("slopes", []) for level in ends]
    y_ticks = nice_ticks(min(ys), max(ys))
    x_ticks = nice_ticks(min(xs) - 0.5, max(xs) + 0.5, count=8, integer=True)
    x0, x1, y0, y1 = min(xs) - 0.5, max(xs) + 0.5, y_ticks[0], y_ticks[-1]
    x_ticks = [t for t in x_ticks if x0 <= t <= x1] or [min(xs)]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1.0) * plot_h

    parts += _history_axes(x_ticks, y_ticks, sx, sy, left, top, plot_w, plot_h)
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(clean)}
    for name, points in clean.items():
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(points))
        parts.append(f'<polyline data-series="{escape(name)}" fill="none" stroke="{colors[name]}" '
                     f'stroke-width="1.4" stroke-opacity="0.7" points="{coords}"/>')
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.2" fill="{colors[name]}">'
                  f"<title>{escape(name)}, night {x:.0f}: {format_number(y)} tok/s</title></circle>"
                  for x, y in points]
    for index, mark in enumerate(marks):
        parts += _history_mark(mark, index if index < LABEL_ROWS else None,
                               colors.get(mark["series"], "#333"), sx, sy, top, plot_w + left, plot_h)
    if legend_h:
        for index, name in enumerate(clean):
            row, col = divmod(index, 4)
            lx, ly = left + col * (plot_w / 4), top + plot_h + bottom + 12 + row * 16
            parts.append(f'<rect x="{lx:.1f}" y="{ly - 8}" width="12" height="3" '
                         f'fill="{colors[name]}"/><text x="{lx + 16:.1f}" y="{ly - 4}" '
                         f'fill="#333">{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _history_axes(x_ticks, y_ticks, sx, sy, left, top, plot_w, plot_h) -> list[str]:
    parts = []
    for tick in y_ticks:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" '
                     f'y2="{sy(tick):.1f}" stroke="#e5e5e5"/><text x="{left - 6}" '
                     f'y="{sy(tick) + 4:.1f}" text-anchor="end" fill="#555">'
                     f"{format_number(tick)}</text>")
    for tick in x_ticks:
        parts.append(f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{top + plot_h}" '
                     f'y2="{top + plot_h + 4}" stroke="#555"/><text x="{sx(tick):.1f}" '
                     f'y="{top + plot_h + 16}" text-anchor="middle" fill="#555">'
                     f"{format_number(tick)}</text>")
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
                 f'stroke="#999"/><text x="{left + plot_w / 2}" y="{top + plot_h + 32}" '
                 f'text-anchor="middle" fill="#333">night</text><text x="14" '
                 f'y="{top + plot_h / 2}" text-anchor="middle" fill="#333" '
                 f'transform="rotate(-90 14 {top + plot_h / 2})">tok/s</text>')
    return parts


def _history_mark(mark: dict, row: Optional[int], series_color: str, sx, sy, top, right_edge,
                  plot_h) -> list[str]:
    """One change point: its levels either side (dashed, the series' colour), a vertical line
    at its night and its label above the plot (the tone's colour), the culprit as tooltip."""
    color = MARK_COLORS.get(mark.get("tone"), "#333")
    x = sx(mark["night"] - 0.5)
    parts = [f'<g class="change-point {escape(mark.get("tone", ""))}" '
             f'data-series="{escape(mark["series"])}" data-night="{mark["night"]}">'
             f"<title>{escape(mark.get('title', ''))}</title>"]
    for first, last, level in mark.get("segments", []):
        parts.append(f'<line class="level" x1="{sx(first - 0.5):.1f}" x2="{sx(last + 0.5):.1f}" '
                     f'y1="{sy(level):.1f}" y2="{sy(level):.1f}" stroke="{series_color}" '
                     f'stroke-width="2" stroke-dasharray="6 3"/>')
    for first, last, start, end in mark.get("slopes", []):
        # the fitted levels are at the nights themselves, not at their edges
        parts.append(f'<line class="trend" x1="{sx(first):.1f}" x2="{sx(last):.1f}" '
                     f'y1="{sy(start):.1f}" y2="{sy(end):.1f}" stroke="{series_color}" '
                     f'stroke-width="2" stroke-dasharray="6 3"/>')
    if row is None:        # past LABEL_ROWS: the line, its tooltip and the list under the chart
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" '
                     f'stroke="{color}" stroke-width="1.5" stroke-dasharray="3 2"/></g>')
        return parts
    label_y = top - 6 - 14 * row
    # Left-aligned at the line where it fits, else pulled left to end at the edge (about
    # 6.5 px a character of 11 px bold text).
    label_x = max(4.0, min(x + 4, right_edge - 6.5 * len(mark["label"])))
    parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{label_y + 3}" y2="{top + plot_h}" '
                 f'stroke="{color}" stroke-width="1.5" stroke-dasharray="3 2"/>'
                 f'<text x="{label_x:.1f}" y="{label_y}" fill="{color}" '
                 f'font-weight="600">{escape(mark["label"])}</text></g>')
    return parts


def _opened(css_class: str, title: str, width: int, height: int, left: int) -> list[str]:
    """A chart's <svg> element opened, with its title (for screen readers and on the page)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="{escape(css_class)}" role="img" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'font-family="system-ui, sans-serif" font-size="11">',
            f"<title>{escape(title)}</title>",
            f'<text x="{left}" y="18" font-size="13" font-weight="600">{escape(title)}</text>']


def _coordinates(clean: dict[str, list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """Every x and every y of all the series' points: what the axes' ranges must hold."""
    points = [point for series in clean.values() for point in series]
    return [x for x, _ in points], [y for _, y in points]


def _empty(parts: list[str], width: int, height: int, words: str) -> Markup:
    """A chart with nothing to draw: it says so in its middle."""
    parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#888">'
                 f"{escape(words)}</text></svg>")
    return Markup("".join(parts))
