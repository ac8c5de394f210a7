"""Methods replaced on one instance of a Lightning object, and the strategies' own settings read back (items 13, 16,
18, 19)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

__all__ = [
    "configure_model_stand_in",
    "process_group_timeout",
    "route_norm_clipping",
    "route_trainer_saves",
]


def process_group_timeout(strategy: Any) -> timedelta:
    """The timeout a strategy gave its process group (Lightning's DDP, FSDP and model-parallel strategies, and
    ours); torch's default for others."""
    timeout = getattr(strategy, "_timeout", None)
    return timeout if isinstance(timeout, timedelta) else default_pg_timeout


def route_norm_clipping(plugin: Any, clip: Callable[[Any, float], bool]) -> Callable[[], None]:
    """Make the precision ``plugin`` clip by norm through ``clip(optimizer, max_norm)``, which returns ``False`` for
    an optimizer it leaves to the plugin; returns the undo."""
    original = plugin.clip_grad_by_norm

    def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
        if not clip(optimizer, clip_val):
            original(optimizer, clip_val)

    plugin.clip_grad_by_norm = clip_grad_by_norm
    return lambda: vars(plugin).pop("clip_grad_by_norm", None)


def route_trainer_saves(trainer: pl.Trainer, around: Callable[[], ContextManager[Any]]) -> Callable[[], None]:
    """Run every ``trainer.save_checkpoint(...)`` of this Trainer inside ``around()`` (item 18); returns the undo."""
    had_own = "save_checkpoint" in vars(trainer)
    original = trainer.save_checkpoint

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with around():
            return original(*args, **kwargs)

    trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]

    def undo() -> None:
        if had_own:
            trainer.save_checkpoint = original  # type: ignore[method-assign]
        else:
            vars(trainer).pop("save_checkpoint", None)

    return undo


@contextmanager
def configure_model_stand_in(module: pl.LightningModule) -> Iterator[None]:
    """A no-op ``configure_model`` on ``module`` while the block runs (item 19)."""
    module.configure_model = lambda: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.configure_model
