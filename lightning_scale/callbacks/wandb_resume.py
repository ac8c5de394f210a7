"""One W&B run per training job, not one per attempt: the run's id travels in the checkpoint."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_scale._lightning_internals import reopen_wandb_run
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version

__all__ = ["WandbResume"]


class WandbResume(Callback):
    """After a preemption and restart, continue the SAME W&B run, so metrics and the cost curve are one line.

    The run's id is kept in the checkpoint. When a fit resumes from a checkpoint written under another run, the
    Trainer's first ``WandbLogger`` (rank 0; other ranks never write to W&B) continues that run with
    ``resume="allow"``. Lightning opens a fresh run before any callback runs; it is finished unused (offline, its
    directory is removed; online, W&B keeps it as an empty run — a logger created with ``id=`` avoids it).
    Offline, each attempt writes its own directory under the same run id: ``wandb sync`` them in order.
    :class:`ResumableCheckpoint` adds this callback when the Trainer has a ``WandbLogger``.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.loggers import WandbLogger
        >>> from lightning_scale.callbacks import ResumableCheckpoint
        >>> logger = WandbLogger(project="demo", offline=True)
        >>> trainer = Trainer(callbacks=[ResumableCheckpoint(dirpath="memory://run"), WandbResume()], logger=logger)
    """

    def __init__(self) -> None:
        self._saved_id: str | None = None  # the run id found in the checkpoint this fit resumed from
        self._trainer: pl.Trainer | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        logger = _wandb_logger(self._trainer) if self._trainer is not None else None
        return {"version": STATE_VERSION, "run_id": logger.version if logger is not None else self._saved_id}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "WandbResume", missing=None)
        self._saved_id = state_dict["run_id"]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._continue(trainer)  # before Lightning logs the hyperparameters into the run

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Strategies that restore after their setup load the checkpoint only now; the hyperparameters that Lightning
        # already logged into the fresh run are logged again into the continued one.
        if self._continue(trainer):
            logger = _wandb_logger(trainer)
            if logger is not None:
                logger.log_hyperparams(pl_module.hparams_initial)

    def _continue(self, trainer: pl.Trainer) -> bool:
        logger = _wandb_logger(trainer)
        if logger is None or self._saved_id is None or not trainer.is_global_zero or logger.version == self._saved_id:
            return False
        reopen_wandb_run(logger, self._saved_id)
        rank_zero_info(f"Continuing W&B run {self._saved_id} from the checkpoint (resume='allow').")
        return True


def _wandb_logger(trainer: pl.Trainer) -> WandbLogger | None:
    return next((logger for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)
