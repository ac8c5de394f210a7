"""Typed access to the public ``Trainer`` attributes that Lightning assigns from outside the ``Trainer`` class.

Lightning's helpers set ``trainer.callbacks`` (``_CallbackConnector``, which also replaces the list when it adds the
model's callbacks) and ``trainer.fast_dev_run`` (``trainer/setup.py``) on the instance, so the ``Trainer`` class
declares neither and a type checker rejects ``trainer.callbacks``. Both are public; these functions only give them
their types, and read them on each call.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

__all__ = ["trainer_callbacks", "trainer_fast_dev_run"]


def trainer_callbacks(trainer: pl.Trainer) -> list[Callback]:
    """``trainer.callbacks``: the Trainer's own list (appending to it adds a callback)."""
    return trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's _CallbackConnector


def trainer_fast_dev_run(trainer: pl.Trainer) -> int | bool:
    """``trainer.fast_dev_run``: ``False``, ``True`` or the number of batches of a development run."""
    return trainer.fast_dev_run  # type: ignore[attr-defined]  # set by Lightning's _init_debugging_flags
