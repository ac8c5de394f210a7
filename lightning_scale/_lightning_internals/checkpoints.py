"""Checkpoints as Lightning restores and writes them: choosing the one to resume after the process group exists,
building the dict without a barrier, restoring a training state mid-fit, and loading through the strategy instance
(items 1, 5, 8, 20)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

__all__ = [
    "dump_checkpoint",
    "load_checkpoints_with",
    "restore_from_when_unset",
    "restore_training_state",
    "writes_sharded_checkpoints",
]


def restore_from_when_unset(trainer: pl.Trainer, choose: Callable[[], str | None]) -> None:
    """Make this fit restore ``choose()`` when it was started without ``ckpt_path``.

    ``choose`` runs on every rank at the moment Lightning restores a checkpoint (after ``setup`` and
    ``configure_model``, so collectives and the model's parameters are available). An explicit ``ckpt_path``
    always wins and ``choose`` is not called; outside ``fit`` (validate, test, predict) nothing changes.
    """
    connector = trainer._checkpoint_connector
    connector.__dict__.pop("resume_start", None)  # a fit that failed before restoring left its wrapper behind
    original = connector.resume_start

    def resume_start(checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        connector.__dict__.pop("resume_start", None)  # one-shot: the class method is visible again
        if not checkpoint_path and trainer.state.fn == TrainerFn.FITTING:
            checkpoint_path = choose()
        original(checkpoint_path, weights_only)

    connector.resume_start = resume_start  # type: ignore[method-assign]  # on this instance, until it runs


def dump_checkpoint(trainer: pl.Trainer, weights_only: bool) -> dict[str, Any]:
    """The checkpoint dict ``Trainer.save_checkpoint`` would write; call on every rank (callbacks may gather)."""
    if trainer.model is None:
        raise RuntimeError("Saving a checkpoint is only possible if a model is attached to the Trainer.")
    return trainer._checkpoint_connector.dump_checkpoint(weights_only)


def restore_training_state(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Load weights, optimizers, LR schedulers and the precision plugin's state; loops and data positions stay."""
    trainer.strategy.load_model_state_dict(checkpoint, strict=True)
    trainer.strategy.load_optimizer_state_dict(checkpoint)
    for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", []), strict=True):
        config.scheduler.load_state_dict(state)
    precision_state = checkpoint.get(type(trainer.precision_plugin).__qualname__)  # as Lightning's dump names it
    if precision_state is not None:
        trainer.precision_plugin.load_state_dict(precision_state)
    for optimizer in trainer.optimizers:
        optimizer.zero_grad(set_to_none=True)


def writes_sharded_checkpoints(strategy: Any) -> bool:
    """Whether the strategy saves a checkpoint as a directory of per-rank shards (Lightning's ModelParallelStrategy
    with ``save_distributed_checkpoint=True``, FSDPStrategy with ``state_dict_type="sharded"``)."""
    return bool(getattr(strategy, "_save_distributed_checkpoint", False)) or (
        getattr(strategy, "_state_dict_type", None) == "sharded"
    )


def load_checkpoints_with(
    strategy: Any, load: Callable[[Callable[..., dict[str, Any]], str, bool | None], Any]
) -> None:
    """Make ``strategy`` load checkpoints through ``load(lightning_load, path, weights_only)``, where
    ``lightning_load(path, weights_only)`` is the strategy class's own loader (item 20). Idempotent."""
    if getattr(strategy.load_checkpoint, "_lightning_scale_load", False):
        return
    lightning_load = type(strategy).load_checkpoint

    def load_checkpoint(checkpoint_path: str | Path, weights_only: bool | None = None) -> Any:
        return load(lambda path, only: lightning_load(strategy, path, only), str(checkpoint_path), weights_only)

    load_checkpoint._lightning_scale_load = True  # type: ignore[attr-defined]
    strategy.load_checkpoint = load_checkpoint
