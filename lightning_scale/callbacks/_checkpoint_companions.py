"""The callbacks ``ResumableCheckpoint`` adds to a Trainer that lacks them: a ``DataStateCheckpoint``, so that the
training data resumes exactly, and a ``WandbResume`` beside a ``WandbLogger``, so that a restart continues its run."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.loggers import WandbLogger

from lightning_scale._trainer_attributes import trainer_callbacks
from lightning_scale.callbacks.data_state import DataStateCheckpoint
from lightning_scale.callbacks.wandb_resume import WandbResume

__all__ = ["add_companions"]


def add_companions(trainer: pl.Trainer, data_state: bool, strict_resume: bool, wandb_resume: bool) -> None:
    """Add what is missing (Lightning's setup loop reaches an appended callback next); with ``strict_resume`` every
    ``DataStateCheckpoint`` of the Trainer becomes strict."""
    data_states = [cb for cb in trainer_callbacks(trainer) if isinstance(cb, DataStateCheckpoint)]
    if data_state and not data_states:
        data_states = [DataStateCheckpoint()]
        trainer_callbacks(trainer).append(data_states[0])
    for callback in data_states if strict_resume else []:
        callback.strict = True
    wandb = any(isinstance(logger, WandbLogger) for logger in trainer.loggers)
    if wandb_resume and wandb and not any(isinstance(cb, WandbResume) for cb in trainer_callbacks(trainer)):
        trainer_callbacks(trainer).append(WandbResume())
