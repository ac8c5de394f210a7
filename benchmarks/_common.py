"""What every benchmark reports alongside its figures: the machine, and medians with their spread."""

from __future__ import annotations

import os
import platform
import statistics
from importlib.metadata import version
from pathlib import Path


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
