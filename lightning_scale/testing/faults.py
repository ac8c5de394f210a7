"""Faults injected into a training job at a known rank and step: a crash, a hang, a slow phase, or a signal to a rank
or its whole job."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_scale.testing.processes import descendants

__all__ = ["Fault", "FaultInjector"]


@dataclasses.dataclass(frozen=True)
class Fault:
    """``kind`` on ``rank`` at the start of training step ``step`` (after ``step`` optimizer steps).

    Attributes:
        step: ``trainer.global_step`` at which the fault happens.
        rank: Global rank it hits; ``None``: every rank.
        kind: ``"crash"`` raises ``RuntimeError("machine lost ...")``; ``"hang"`` blocks the rank's main thread
            forever; ``"sleep"`` makes it ``seconds`` slower; a signal name (``"SIGTERM"``, ``"SIGKILL"``,
            ``"SIGSTOP"``, ...) sends that signal to the rank's process.
        val_batch: When given, the fault happens at this batch of the validation that runs after step ``step``.
        whole_job: Another process sends the signal to the rank and every process below it (its DataLoader
            workers), as SLURM signals every process of a job step.
        seconds: How long a ``"sleep"`` lasts.
        save: The fault happens while the checkpoint at step ``step`` is saved (``on_save_checkpoint``).

    Examples:
        >>> Fault(step=5, rank=1, kind="SIGTERM")
        Fault(step=5, rank=1, kind='SIGTERM', val_batch=None, whole_job=False, seconds=0.0, save=False)
    """

    step: int
    rank: int | None = None
    kind: str = "SIGTERM"
    val_batch: int | None = None
    whole_job: bool = False
    seconds: float = 0.0
    save: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("crash", "hang", "sleep") and self.kind not in signal.Signals.__members__:
            raise ValueError(
                f"kind={self.kind!r} is none of 'crash', 'hang', 'sleep' and a signal name such as 'SIGTERM'."
            )
        if self.whole_job and self.kind not in signal.Signals.__members__:
            raise ValueError(f"whole_job=True needs a signal kind (e.g. kind='SIGTERM'), not kind={self.kind!r}.")
        if (self.kind == "sleep") != (self.seconds > 0):
            raise ValueError(f"seconds={self.seconds} goes with kind='sleep' only, and must then be > 0.")
        if self.save and self.val_batch is not None:
            raise ValueError("save=True and val_batch are exclusive: a fault happens during one phase.")


class FaultInjector(Callback):
    """Injects each of ``faults`` once per job: a fault that happened is recorded in ``record_dir``, so the restarted
    or re-run job (which may resume from a checkpoint before the fault's step) goes past it.

    Args:
        faults: What to inject, where and when.
        record_dir: Directory shared by every attempt of the job (e.g. the job's output directory).

    Examples:
        >>> injector = FaultInjector([Fault(step=6, rank=0, kind="crash")], record_dir="/tmp/job")
    """

    def __init__(self, faults: Sequence[Fault], record_dir: str | Path) -> None:
        self.faults = list(faults)
        self.record_dir = Path(record_dir)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._inject(trainer, None)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self._inject(trainer, batch_idx)

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._inject(trainer, None, save=True)

    def _inject(self, trainer: pl.Trainer, val_batch: int | None, save: bool = False) -> None:
        rank = trainer.global_rank
        for index, fault in enumerate(self.faults):
            if fault.step != trainer.global_step or fault.rank not in (None, rank):
                continue
            if fault.val_batch != val_batch or fault.save != save:
                continue
            record = self.record_dir / f"fault{index}_rank{rank}.happened"
            if record.exists():
                continue
            self.record_dir.mkdir(parents=True, exist_ok=True)
            record.write_text(f"step {fault.step}\n")  # first: a SIGKILL leaves no time after it
            _happen(fault)


def _happen(fault: Fault) -> None:
    if fault.kind == "crash":
        raise RuntimeError(f"machine lost (an injected fault at step {fault.step})")
    if fault.kind == "sleep":
        time.sleep(fault.seconds)
        return
    if fault.kind == "hang":
        while True:  # stuck in Python, where a stack dump shows it
            time.sleep(1)
    number = int(signal.Signals[fault.kind])
    if not fault.whole_job:
        os.kill(os.getpid(), number)
        return
    targets = [os.getpid(), *descendants(os.getpid())]
    kill = f"import os; [os.kill(pid, {number}) for pid in {targets!r}]"
    subprocess.run([sys.executable, "-c", kill], check=True)
