"""What a rank holds at its peak during training steps, measured rather than added up from tensor sizes.

On the CPU: the process's resident set (Linux ``/proc/self/status``): its high-water mark ``VmHWM`` is reset once
training runs its steady steps (``/proc/self/clear_refs``), read when training ends, and the resident size before the
model was built is subtracted: parameters, gradients, optimizer state, activations, all-gathered parameters and the
allocator's slack, everything training added; and the resident size at the end of each step, less the same baseline
(the state training keeps between steps). On a GPU: ``torch.cuda.max_memory_allocated`` over the same steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def resident_bytes() -> int:
    """This process's resident set size now."""
    return _status_kib("VmRSS") * 1024


class PeakMemory(pl.Callback):
    """Records the peak over training steps from ``from_step`` on, less the resident size when it was created (create
    it right before the model)."""

    def __init__(self, from_step: int = 5) -> None:
        self.from_step = from_step
        self.baseline = resident_bytes()
        self.peak_bytes: int | None = None
        self.rest_bytes: int | None = None
        self.device = "cpu"

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step != self.from_step:
            return
        if pl_module.device.type == "cuda":
            self.device = "cuda"
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from the current size

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.device == "cpu":  # the training state at rest, between steps (the last step's is kept)
            self.rest_bytes = resident_bytes() - self.baseline

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.device == "cuda":
            self.peak_bytes = torch.cuda.max_memory_allocated()
        else:
            self.peak_bytes = _status_kib("VmHWM") * 1024 - self.baseline
