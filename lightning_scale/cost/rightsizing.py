"""Right-sizing: is the machine bigger than the job? Peak memory against capacity, and how busy it was."""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

import torch

__all__ = ["RightSizingReport", "measure_peak_memory"]

GIB = 1024**3
LOW_MEMORY_FRACTION = 0.4
HIGH_MEMORY_FRACTION = 0.9
LOW_BUSY_FRACTION = 0.6


def measure_peak_memory(device: torch.device, processes_on_node: int = 1) -> tuple[int, int]:
    """``(peak bytes, capacity bytes)`` of this process: accelerator memory on CUDA, resident memory on CPU.

    On CPU the capacity is this process's share of the node's physical memory (``processes_on_node`` share it).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = max_rss if sys.platform == "darwin" else max_rss * 1024  # bytes on macOS, KiB on Linux
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return peak, physical // max(1, processes_on_node)


@dataclass(frozen=True)
class RightSizingReport:
    """Peak memory of the busiest rank against its capacity, and the fraction of wall time spent in training steps."""

    device_type: str
    peak_memory_bytes: int
    capacity_bytes: int
    busy_fraction: float

    @property
    def memory_fraction(self) -> float:
        return self.peak_memory_bytes / self.capacity_bytes if self.capacity_bytes else 0.0

    def metrics(self, prefix: str = "rightsizing/") -> dict[str, float]:
        return {
            f"{prefix}peak_memory_gib": self.peak_memory_bytes / GIB,
            f"{prefix}memory_capacity_gib": self.capacity_bytes / GIB,
            f"{prefix}peak_memory_fraction": self.memory_fraction,
            f"{prefix}busy_fraction": self.busy_fraction,
        }

    def suggestions(self) -> list[str]:
        """Plain-language advice; empty when the machine fits the job."""
        memory = "accelerator memory" if self.device_type == "cuda" else "memory (resident, per process)"
        advice = []
        known = self.capacity_bytes > 0  # no memory advice when the capacity is unknown
        if known and self.memory_fraction < LOW_MEMORY_FRACTION:
            advice.append(
                f"Peak {memory} is {self.memory_fraction:.0%} of capacity: the job fits a smaller instance (or fewer "
                "or smaller accelerators); alternatively raise the batch size to use what you pay for."
            )
        elif known and self.memory_fraction > HIGH_MEMORY_FRACTION:
            advice.append(
                f"Peak {memory} is {self.memory_fraction:.0%} of capacity: close to running out; bf16-mixed "
                "precision, activation checkpointing or sharding (model_parallel) make room."
            )
        if self.busy_fraction < LOW_BUSY_FRACTION:
            advice.append(
                f"Training steps took only {self.busy_fraction:.0%} of the wall time: data loading (num_workers), "
                "validation frequency, checkpoint cadence or restarts cost more than the compute. Fix those before "
                "paying for faster hardware."
            )
        return advice

    def text(self) -> str:
        used = f"{self.peak_memory_bytes / GIB:.2f} of {self.capacity_bytes / GIB:.2f} GiB"
        head = f"Right-sizing: peak memory {used} ({self.memory_fraction:.0%}), busy {self.busy_fraction:.0%}."
        advice = self.suggestions()
        return " ".join([head, *advice]) if advice else f"{head} The machine fits the job."
