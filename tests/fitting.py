"""The one quick single-process fit that unit tests share, and the callbacks they use to act at a step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch import Callback, Trainer, seed_everything

from examples.char_transformer import CharDataModule, CharTransformer


def fit(
    callbacks: Sequence[Callback],
    trainer_kwargs: dict[str, Any],
    max_steps: int,
    *,
    model: Callable[[], pl.LightningModule] | None = None,
    datamodule: pl.LightningDataModule | None = None,
    ckpt_path: str | None = None,
    **overrides: Any,
) -> Trainer:
    """Seed 0, then build the model with ``model()`` (default: the example's ``CharTransformer(vocab_size=64)`` on
    ``CharDataModule(batch_size=8)``, or ``datamodule``) and fit it for ``max_steps`` with ``trainer_kwargs`` (the
    ``tiny_trainer_kwargs`` fixture) updated by ``overrides``; returns the Trainer (the model is
    ``trainer.lightning_module``). A given model without ``datamodule`` uses its own loaders."""
    seed_everything(0)
    trainer = Trainer(max_steps=max_steps, callbacks=list(callbacks), **{**trainer_kwargs, **overrides})
    if model is None:
        module: pl.LightningModule = CharTransformer(vocab_size=64)
        datamodule = datamodule or CharDataModule(batch_size=8)
    else:
        module = model()
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


class AtStep(Callback):
    """Calls ``fn(trainer)`` after the optimizer step that reaches global step ``step`` (before later callbacks)."""

    def __init__(self, step: int, fn: Callable[[Trainer], object]) -> None:
        self.step, self.fn = step, fn

    def on_train_batch_end(self, trainer: Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.fn(trainer)


class FirstStep(Callback):
    """Records the global step at which training (re)started."""

    def __init__(self) -> None:
        self.first_step: int | None = None

    def on_train_start(self, trainer: Trainer, pl_module: pl.LightningModule) -> None:
        self.first_step = trainer.global_step
