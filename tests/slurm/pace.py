"""A callback that makes a job's training last as long as a test needs, without changing what it computes."""

from __future__ import annotations

import os
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class Pace(Callback):
    """Sleep ``seconds_per_step`` after each training batch, on every rank alike, in the first run of a SLURM job only
    (``SLURM_RESTART_COUNT`` unset or 0): a requeued run goes at full speed."""

    def __init__(self, seconds_per_step: float) -> None:
        self.seconds_per_step = seconds_per_step if int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0 else 0.0

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        time.sleep(self.seconds_per_step)
