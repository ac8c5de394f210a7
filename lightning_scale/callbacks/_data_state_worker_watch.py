"""When ``DataStateCheckpoint`` watches DataLoader workers start: from a training epoch's or a fit's validation run's
start to its first batch (:class:`~lightning_scale.data.worker_start.WorkerStartWatchdog` does the watching)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from lightning_scale._lightning_internals import train_loaders
from lightning_scale.data.worker_start import WorkerStartWatchdog
from lightning_scale.errors import ConfigurationError

__all__ = ["WorkerStartWatch"]


class WorkerStartWatch:
    """The watchdog of one fit's loaders, armed at a training epoch's or a validation run's start, disarmed at its
    first batch; loaders without workers are not watched.

    Args:
        timeout_s: Seconds the workers may take to deliver the first batch.

    Raises:
        ConfigurationError: ``timeout_s`` is not positive (``DataStateCheckpoint``'s ``worker_start_timeout_s``).

    Examples:
        >>> watch = WorkerStartWatch(timeout_s=600)
        >>> watch.first_batch()
        >>> watch.close()
    """

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ConfigurationError(
                f"worker_start_timeout_s={timeout_s} must be > 0 (seconds for a loader's workers to deliver their "
                "first batch)."
            )
        self.timeout_s = timeout_s
        self._watchdog: WorkerStartWatchdog | None = None

    def training_epoch_starts(self, trainer: pl.Trainer) -> None:
        what = f"rank {trainer.global_rank}, training dataloader(s) of epoch {trainer.current_epoch}"
        self._arm(train_loaders(trainer), what)

    def validation_starts(self, trainer: pl.Trainer) -> None:
        """A fit's validation run (the sanity check's included) starts."""
        if trainer.val_dataloaders is None:
            return
        when = (
            "the sanity check"
            if trainer.sanity_checking
            else f"epoch {trainer.current_epoch}, step {trainer.global_step}"
        )
        what = f"rank {trainer.global_rank}, validation dataloader(s) of {when}"
        self._arm(CombinedLoader(trainer.val_dataloaders).flattened, what)

    @staticmethod
    def loader_prepared(trainer: pl.Trainer, loader: Any) -> None:
        """Lightning prepared ``loader``: a validation loader's workers are forked in the loop, before any hook that
        could arm the watchdog, so they are made able to report their stacks now."""
        if not trainer.training and getattr(loader, "num_workers", 0) > 0:
            WorkerStartWatchdog.let_workers_report_stacks()

    def first_batch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()

    def close(self) -> None:
        """Stop the watchdog's thread; safe to call twice."""
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    def _arm(self, loaders: list[Any], what: str) -> None:
        """From the start of a training epoch or a validation run to its first batch (which a restored position's
        fast-forward precedes); the first batch of a loader without a length is fetched ahead before this (for
        training, in the first epoch of a fit only), unwatched."""
        if not any(getattr(loader, "num_workers", 0) > 0 for loader in loaders):
            return
        if self._watchdog is None:
            self._watchdog = WorkerStartWatchdog(self.timeout_s)
        self._watchdog.arm(what)
