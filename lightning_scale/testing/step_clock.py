"""A deterministic wall clock for cost tests, driven by the training steps."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["StepClock"]


class StepClock(Callback):
    """Time that passes ``seconds_per_step`` per training step, plus ``restart_gap_seconds`` when a fit starts from a
    checkpoint (the work lost and the restart), so cost figures are exact: pass ``clock=step_clock.now``.

    Put it FIRST among the Trainer's callbacks, so the others read the time after the step.

    Examples:
        >>> from lightning_scale.callbacks import CostTracker
        >>> clock = StepClock(seconds_per_step=450.0)
        >>> callbacks = [clock, CostTracker(price_per_hour=8.0, clock=clock.now)]  # exactly 1 USD per step
    """

    def __init__(self, seconds_per_step: float, restart_gap_seconds: float = 0.0, start: float = 1.0e9) -> None:
        self.seconds_per_step = seconds_per_step
        self.restart_gap_seconds = restart_gap_seconds
        self.offset = start
        self.steps = 0

    def now(self) -> float:
        return self.offset + self.steps * self.seconds_per_step

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps = trainer.global_step
        if trainer.global_step > 0:
            self.offset += self.restart_gap_seconds

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.steps = trainer.global_step
