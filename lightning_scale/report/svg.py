"""Small inline SVG charts for the run report: no script, no stylesheet or font from the network."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Bar", "Line", "Mark", "line_chart", "nice_ticks", "stacked_bar", "timeline"]

WIDTH, HEIGHT = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 44


@dataclass(frozen=True)
class Line:
    """One series of a line chart."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str


@dataclass(frozen=True)
class Bar:
    """A span of a timeline row (an attempt, or the gap before one)."""

    start: float
    end: float
    color: str
    label: str
    hatched: bool = False


@dataclass(frozen=True)
class Mark:
    """A moment on the timeline (a checkpoint, a preemption, a hang)."""

    at: float
    color: str
    label: str
    tall: bool = False


def _finite_points(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    kept = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    return [x for x, _ in kept], [y for _, y in kept]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values covering ``[low, high]``.

    Examples:
        >>> nice_ticks(0.0, 0.93)
        [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    """
    if not high > low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(math.ceil((high - first) / step) + 1)]


def _label(value: float) -> str:
    return f"{value:.3g}"


def _scale(low: float, high: float, out_low: float, out_high: float) -> Callable[[float], float]:
    span = (high - low) or 1.0
    return lambda v: out_low + (v - low) / span * (out_high - out_low)


def line_chart(lines: Sequence[Line], x_label: str, y_label: str, title: str) -> str:
    """An SVG line chart of ``lines`` (each drawn with its points), with axes, ticks and a legend."""
    finite = [Line(line.label, *_finite_points(line.xs, line.ys), line.color) for line in lines]  # no NaN, no inf
    drawn = [line for line in finite if line.xs]
    xs = [x for line in drawn for x in line.xs] or [0.0, 1.0]
    ys = [y for line in drawn for y in line.ys] or [0.0, 1.0]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    sx = _scale(x_ticks[0], x_ticks[-1], LEFT, WIDTH - RIGHT)
    sy = _scale(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP)
    parts = [
        f'<svg class="plot" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
        'fill="#fafafa" stroke="#ccc"/>',
    ]
    for tick in x_ticks:
        x = sx(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{_label(tick)}</text>')
    for tick in y_ticks:
        y = sy(tick)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    parts.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(y_label)}</text>'
    )
    for number, line in enumerate(drawn):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(line.xs, line.ys, strict=True))
        parts.append(
            f'<polyline class="series" data-label="{escape(line.label)}" points="{points}" fill="none" '
            f'stroke="{line.color}" stroke-width="1.5"/>'
        )
        for x, y in zip(line.xs, line.ys, strict=True):
            parts.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{line.color}">'
                f"<title>{escape(line.label)}: {_label(y)} at {_label(x)}</title></circle>"
            )
        legend_y = TOP + 14 + 16 * number
        parts.append(
            f'<rect x="{WIDTH - RIGHT - 170}" y="{legend_y - 9}" width="10" height="10" fill="{line.color}"/>'
            f'<text x="{WIDTH - RIGHT - 155}" y="{legend_y}">{escape(line.label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def timeline(rows: Sequence[tuple[str, Sequence[Bar], Sequence[Mark]]], end: float, title: str) -> str:
    """An SVG timeline: one row per attempt (its bars and marks), time in minutes from 0 to ``end`` seconds."""
    row_height = 34
    height = TOP + row_height * max(1, len(rows)) + BOTTOM
    ticks = nice_ticks(0.0, max(end, 60.0) / 60.0)  # a minute at least
    sx = _scale(0.0, ticks[-1] * 60.0, LEFT + 60, WIDTH - RIGHT)
    parts = [
        f'<svg class="timeline" role="img" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        '<defs><pattern id="gap" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="3" height="6" fill="#d9d9d9"/></pattern></defs>',
    ]
    for tick in ticks:
        x = sx(tick * 60.0)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{height - BOTTOM}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{_label(tick)}</text>')
    parts.append(f'<text x="{(LEFT + WIDTH) / 2}" y="{height - 6}" text-anchor="middle">minutes since the start</text>')
    for number, (name, bars, marks) in enumerate(rows):
        y = TOP + row_height * number
        parts.append(f'<text x="{LEFT + 52}" y="{y + 21}" text-anchor="end">{escape(name)}</text>')
        for bar in bars:
            fill = "url(#gap)" if bar.hatched else bar.color
            width = max(1.0, sx(bar.end) - sx(bar.start))
            parts.append(
                f'<rect class="span" x="{sx(bar.start):.1f}" y="{y + 6}" width="{width:.1f}" height="22" '
                f'fill="{fill}" stroke="{bar.color}"><title>{escape(bar.label)}</title></rect>'
            )
        for mark in marks:
            x, (top, bottom, width) = sx(mark.at), ((y + 2, y + 32, 3) if mark.tall else (y + 10, y + 24, 1.5))
            parts.append(
                f'<line class="mark" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{mark.color}" '
                f'stroke-width="{width}"><title>{escape(mark.label)}</title></line>'
            )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bar(parts_usd: Sequence[tuple[str, float, str]], title: str) -> str:
    """One horizontal bar split into ``(label, value, color)`` parts, proportional to their values."""
    total = sum(max(0.0, value) for _, value, _ in parts_usd) or 1.0
    x, height = float(LEFT), 40
    svg = [
        f'<svg class="split" role="img" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    ]
    for label, value, color in parts_usd:
        width = max(0.0, value) / total * (WIDTH - LEFT - RIGHT)
        if width > 0:
            svg.append(
                f'<rect x="{x:.1f}" y="4" width="{width:.1f}" height="32" fill="{color}">'
                f"<title>{escape(label)}: {value / total:.1%}</title></rect>"
            )
        x += width
    svg.append("</svg>")
    return "".join(svg)
