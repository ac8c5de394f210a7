"""What every benchmark's summary shares: a row of the summary table (a figure, its target and verdict) and the
Markdown helpers of its figures on the Performance page (medians, with min-max where a spread was measured)."""

from __future__ import annotations

from typing import Any

from benchmarks._common import meets

Row = dict[str, Any]


def summary_row(benchmark: str, measure: str, value: float, low_high: tuple[float, float] | None, unit: str,
                target: str | None = None, holds: bool | None = None) -> Row:  # fmt: skip
    """One summary line: ``value`` (``low_high`` = min-max over repeats) in ``unit``, its target and verdict."""
    figure = f"{value:.3g} {unit}".strip() if unit != "x" else f"{value:.3f}"
    if low_high is not None:
        figure += f" ({low_high[0]:.3g}-{low_high[1]:.3g})"
    return {"benchmark": benchmark, "measure": measure, "value": value, "figure": figure, "target": target,
            "holds": holds}  # fmt: skip


def span_of(spread: dict[str, float]) -> tuple[float, float]:
    """The min-max of a spread."""
    return spread["min"], spread["max"]


def bound_text(ratio: dict[str, float], target: float, at_most: bool = True) -> str:
    """A target as the table states it, with the bound of the paired ratios' spread that decides it."""
    if at_most:
        return f"≤ {target} (upper quartile {ratio['upper_quartile']:.3f})"
    return f"≥ {target} (lower quartile {ratio['lower_quartile']:.3f})"


def verdict_of(ratio: dict[str, float], target: float | None) -> tuple[str | None, bool | None]:
    """A ``<=`` target's text and verdict by the upper quartile of the paired ratios (``None``: no target)."""
    if target is None:
        return None, None
    return bound_text(ratio, target), meets(ratio, target)


def md_ms(spread: dict[str, float]) -> str:
    return f"{spread['median'] * 1e3:.2f} ({spread['min'] * 1e3:.2f}-{spread['max'] * 1e3:.2f})"


def md_s(spread: dict[str, float]) -> str:
    return f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})"


def md_ratio(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"


def md_mb(value: float) -> str:
    return f"{value / 1e6:.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])
