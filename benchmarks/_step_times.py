"""Wall time per training step, measured one way in every benchmark: the median time between the ends of
consecutive training batches, after a warm-up (the same period a raw loop measures between its iterations)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning.pytorch as pl


def median_step(ends: list[float], warmup: int) -> float:
    """The median of the intervals between consecutive ``ends`` (``time.perf_counter()`` values) after ``warmup``."""
    return statistics.median(b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :], strict=False))


class StepEnds(pl.Callback):
    """Records ``time.perf_counter()`` at the end of every training batch."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def median_step_s(self, warmup: int) -> float:
        return median_step(self.ends, warmup)
