"""Lightning's ``ModelCheckpoint`` with its save path written through a ``Saver``: the overrides of how a checkpoint is
written, pruned and found, on which ``ResumableCheckpoint`` builds its triggers, resume and lifecycle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lightning_scale._lightning_internals import dump_checkpoint
from lightning_scale.callbacks._checkpoint_arguments import default_dirpath, name_in_dir
from lightning_scale.callbacks._checkpoint_lineage import RunLineage, reported
from lightning_scale.callbacks._checkpoint_timer import TimeTrigger
from lightning_scale.callbacks.hang_watchdog import HangWatchdog
from lightning_scale.checkpoint.background import WriteResult
from lightning_scale.checkpoint.journal import EventKind, RunJournal
from lightning_scale.checkpoint.resume import choose_resume
from lightning_scale.checkpoint.saver import Saver, SaveRequest
from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["SavePath"]


class SavePath(ModelCheckpoint):
    """Every save as a :class:`~lightning_scale.checkpoint.saver.SaveRequest` to the subclass's ``Saver`` (atomic
    files under a manifest, asynchronous or sharded), timed and recorded in the run's journal; removals through the
    same files; the ``keep_last_k`` newest of the run kept; the last checkpoint found as a resume would choose it.

    The subclass sets the attributes below up (the ``Saver`` in ``setup``).
    """

    _trainer: pl.Trainer | None
    _saver: Saver | None
    _timer: TimeTrigger | None
    _lineage: RunLineage
    _clock: Callable[[], float]
    _synchronous: bool  # the next save waits until it is durable (a preemption's)
    _failed: list[str]
    keep_last_k: int | None
    last_save_seconds: float | None
    last_blocked_seconds: float | None
    failed_saves: int
    journal: RunJournal | None

    @property
    def _saving(self) -> Saver:
        if self._saver is None:
            raise RuntimeError("ResumableCheckpoint saves from setup() of fit on.")
        return self._saver

    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)  # may reuse the state staged for top-k
        finally:
            self._saving.forget_staged()

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        started = self._clock()
        request = SaveRequest(
            name=name_in_dir(filepath),
            step=trainer.global_step,
            state=lambda: dump_checkpoint(trainer, self.save_weights_only),  # on every rank
            fields=lambda checkpoint: self._lineage.manifest_fields(trainer, checkpoint),
        )
        with HangWatchdog.pausing(trainer, f"saving checkpoint {request.name}"):
            durable = self._saving.save(request, synchronous=self._synchronous)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        self.last_blocked_seconds = self._clock() - started
        self._journal(trainer, "checkpoint", name=request.name, seconds=self.last_blocked_seconds, durable=durable)
        if self._timer is not None:
            self._timer.record(self.last_blocked_seconds)
        if durable:
            self._notify_loggers(trainer)

    def _journal(self, trainer: pl.Trainer, kind: EventKind, **details: Any) -> None:
        """Rank 0 records ``kind`` at the current step in the run's journal."""
        if self.journal is not None and trainer.is_global_zero:
            self.journal.record(kind, trainer.global_step, **details)

    def _durable(self, seconds: float) -> None:
        self.last_save_seconds = seconds

    def _landed(self, results: list[WriteResult]) -> None:
        """Background saves of this rank ended (each failure was reported as it happened)."""
        self._failed = [result.what for result in results if result.error is not None]
        self.failed_saves += len(self._failed)
        if len(self._failed) < len(results) and self._trainer is not None:
            self._notify_loggers(self._trainer)

    def _notify_loggers(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _retain(self) -> None:
        """On the writing rank, once a checkpoint landed: keep the ``keep_last_k`` newest of this run."""
        if self.keep_last_k is not None and self.monitor is None and self.save_top_k != -1:
            last = name_in_dir(self.last_model_path) if self.last_model_path else None
            self._lineage.retain(self._saving.files.remove, self.keep_last_k, last)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            self._saving.files.remove(name_in_dir(filepath))

    @override
    def _save_none_monitor_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """Save as ``ModelCheckpoint`` does without a monitor, but leave the previous checkpoint to ``keep_last_k``."""
        filepath = self._get_metric_interpolated_filepath_name(monitor_candidates, trainer)
        self.best_model_path = filepath  # before saving: it is part of the state
        self._save_checkpoint(trainer, filepath)

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        choice = reported(choose_resume(CheckpointStore(str(self.dirpath or default_dirpath(trainer)))))
        return set() if choice.path is None else {choice.path}
