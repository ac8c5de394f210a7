"""Lightning's loggers: whether this step's metrics are sent, and W&B runs opened and reopened (items 7, 9, 17)."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger

__all__ = [
    "drop_unset_wandb_anonymous",
    "log_step_metrics",
    "reopen_wandb_run",
    "trainer_logs_this_step",
]


def trainer_logs_this_step(trainer: pl.Trainer) -> bool:
    """In ``on_train_batch_end``: whether the Trainer sends the metrics logged at this step to its loggers."""
    return bool(trainer._logger_connector.should_update_logs)


def log_step_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    """In ``on_train_batch_end`` of a step :func:`trainer_logs_this_step` says is logged: send ``metrics`` to the
    Trainer's loggers now, at the step the metrics ``self.log`` gave in this step are sent with (the count of batches
    that stepped, as ``LearningRateMonitor`` logs). ``self.log`` costs ~0.3 ms a metric in Lightning 2.6 (it
    deep-copies the metric's description to move it to the device at every call): for a dozen figures at every
    logging step, several percent of a step of a few milliseconds. Loggers write on rank 0 only."""
    if trainer.is_global_zero:
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def drop_unset_wandb_anonymous(logger: WandbLogger) -> None:
    """Leave ``anonymous`` out of the arguments ``logger`` opens its run with, unless the user set it (item 17)."""
    if logger._wandb_init.get("anonymous") is None:
        logger._wandb_init.pop("anonymous", None)


def reopen_wandb_run(logger: WandbLogger, run_id: str) -> None:
    """Make ``logger`` continue the W&B run ``run_id`` (``resume="allow"``) instead of the run it opened at setup.

    Call on rank 0, before anything was logged to the run being replaced. That run is finished; offline, its local
    directory (empty but for W&B's own files) is removed, so only the continued run remains.
    """
    fresh = logger.experiment
    if fresh.id == run_id:
        return
    fresh_dir = Path(fresh.dir).parent if fresh.offline else None
    fresh.finish()
    if fresh_dir is not None:
        shutil.rmtree(fresh_dir, ignore_errors=True)
    logger._wandb_init.update(id=run_id, resume="allow")
    logger._id = run_id
    logger._experiment = None
    _ = logger.experiment  # opens the continued run now, as Lightning's setup did for the fresh one
