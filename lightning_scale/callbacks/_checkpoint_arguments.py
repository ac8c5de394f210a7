"""The arguments ``ResumableCheckpoint`` refuses, each with the reason and the way that works."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.errors import ConfigurationError

__all__ = ["checked_every_n_minutes", "default_dirpath", "name_in_dir"]


def checked_every_n_minutes(
    *,
    filename: str | None,
    monitor: str | None,
    every_n_minutes: float | Literal["auto"] | None,
    mean_time_between_interruptions_hours: float | None,
    train_time_interval: timedelta | None,
    keep_last_k: int | None,
    save_top_k: int,
    save_weights_only: bool,
) -> float | Literal["auto"] | None:
    """Raise ``ConfigurationError`` for arguments that cannot work together; return the time trigger in minutes
    (``train_time_interval``, ``ModelCheckpoint``'s name for it, converted)."""
    if save_weights_only:
        raise ConfigurationError(
            "ResumableCheckpoint saves the full training state, so that a run resumes where it stopped; "
            "save_weights_only=True would make every checkpoint unresumable. For weights-only files, add a stock "
            "lightning.pytorch.callbacks.ModelCheckpoint(save_weights_only=True) beside it."
        )
    if save_top_k < -1:
        raise ConfigurationError(f"save_top_k={save_top_k} must be >= -1, as in ModelCheckpoint (-1 keeps all).")
    if monitor is None and save_top_k > 1:
        raise ConfigurationError(
            f"save_top_k={save_top_k} ranks checkpoints by a metric: set monitor=..., or keep the {save_top_k} "
            f"newest with keep_last_k={save_top_k} (without a monitor, save_top_k is -1, 0 or 1, as in "
            "ModelCheckpoint)."
        )
    if train_time_interval is not None:
        if every_n_minutes is not None:
            raise ConfigurationError(
                f"Pass either train_time_interval={train_time_interval} (ModelCheckpoint's name) or "
                f"every_n_minutes={every_n_minutes!r}, not both: they set the same trigger."
            )
        every_n_minutes = train_time_interval.total_seconds() / 60.0
    auto = every_n_minutes == "auto"
    if auto != (mean_time_between_interruptions_hours is not None):
        raise ConfigurationError(
            "every_n_minutes='auto' and mean_time_between_interruptions_hours go together: the interval comes "
            "from the save cost and that mean time (e.g. ResumableCheckpoint(every_n_minutes='auto', "
            "mean_time_between_interruptions_hours=6))."
        )
    if auto and not mean_time_between_interruptions_hours > 0:  # type: ignore[operator]
        raise ConfigurationError(
            f"mean_time_between_interruptions_hours={mean_time_between_interruptions_hours} must be > 0."
        )
    if every_n_minutes is not None and not auto and not every_n_minutes > 0:  # type: ignore[operator]
        raise ConfigurationError(
            f"every_n_minutes={every_n_minutes} must be > 0; use None to save on steps or epochs only "
            "(ResumableCheckpoint(every_n_minutes=...))."
        )
    if keep_last_k is not None and keep_last_k < 1:
        raise ConfigurationError(
            f"keep_last_k={keep_last_k} must be >= 1 so the newest checkpoint survives; use None to keep all "
            "(ResumableCheckpoint(keep_last_k=...))."
        )
    if filename is not None and "/" in filename:
        raise ConfigurationError(f"filename={filename!r} must not contain '/'; put directories into dirpath instead.")
    return every_n_minutes


def check_where_and_when(
    dirpath: str | None, every_n_train_steps: int | None, every_n_epochs: int | None, every_n_minutes: object
) -> None:
    """Raise ``ConfigurationError`` for a ``dirpath`` no installed filesystem opens (``UnusableStorageError``) or a
    negative cadence, before Lightning's ``ModelCheckpoint`` raises its own errors with a traceback; warn when no
    trigger saves during training."""
    if dirpath is not None:
        if not str(dirpath).strip():
            raise ConfigurationError(
                "dirpath='' names no directory: pass a directory or an fsspec URL, or leave it unset for "
                "<default_root_dir>/checkpoints (--checkpoint.dirpath)."
            )
        CheckpointStore(str(dirpath))  # an unknown scheme, or a known one whose package is missing
    for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and value < 0:
            raise ConfigurationError(f"{name}={value} must be >= 1, or 0 for no such trigger (--checkpoint.{name}).")
    lightnings_default = every_n_train_steps is None and every_n_epochs is None  # every epoch
    if not (every_n_train_steps or every_n_epochs or every_n_minutes is not None or lightnings_default):
        rank_zero_warn(
            f"ResumableCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs={every_n_epochs}) saves "
            "no checkpoint during training: a run that stops resumes only from a preemption's save, or starts over. "
            "Set every_n_train_steps, every_n_epochs or every_n_minutes (--checkpoint.every_n_train_steps 50)."
        )


def name_in_dir(filepath: str) -> str:
    """A checkpoint path's name inside ``dirpath``."""
    return str(filepath).rstrip("/").rsplit("/", 1)[-1]


def default_dirpath(trainer: pl.Trainer) -> str:
    """``<default_root_dir>/checkpoints``: the same on every restart."""
    return f"{str(trainer.default_root_dir).rstrip('/')}/checkpoints"
