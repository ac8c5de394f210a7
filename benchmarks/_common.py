"""What every benchmark shares: the machine it ran on, medians with their spread, and the paired method (variants
rotated in the same processes, per-round ratios, a verdict by the bound of their spread)."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

# Memory measurements run with glibc's mmap threshold fixed at 1 MiB: below its (rising) default threshold glibc serves
# allocations from freed heap pages, which a resident size keeps counting after they are freed (or which hide a new
# allocation); at 1 MiB every tensor that matters is mapped and unmapped on its own.
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, object]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),  # not imported: a benchmark that only launches jobs starts in a fraction of a second
        "lightning": version("lightning"),
    }


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rotated(variants: Sequence[str], round_index: int) -> list[str]:
    """The order in which round ``round_index`` runs ``variants``: rotated by one every round, so each variant runs
    in every position equally often (with two: the order swaps every round), and drift on a shared machine (a
    neighbour's job starting, the CPU warming) falls on every variant alike."""
    shift = round_index % len(variants)
    return [*variants[shift:], *variants[:shift]]


def paired_ratios(ratios: list[float]) -> dict[str, float]:
    """The per-round ratios of two variants measured in the same round: median, quartiles, min and max.

    Example:
        >>> paired_ratios([1.0, 1.02, 0.98, 1.01, 0.99])["upper_quartile"]
        1.01
    """
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {**spread(ratios), "lower_quartile": quartiles[0], "upper_quartile": quartiles[2], "rounds": len(ratios)}


def meets(ratios: dict[str, float], target: float, at_most: bool = True) -> bool:
    """The verdict on a target for per-round paired ratios (:func:`paired_ratios`), by the bound of their spread: a
    ``<= target`` holds when the upper quartile meets it, a ``>= target`` when the lower quartile does, so three rounds
    in four must meet it; a median that noise can move never decides."""
    return ratios["upper_quartile"] <= target if at_most else ratios["lower_quartile"] >= target
