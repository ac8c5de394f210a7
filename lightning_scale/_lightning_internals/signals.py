"""Lightning's signal handling: its per-step SIGTERM broadcast and its SLURM auto-requeue (item 6)."""

from __future__ import annotations

from collections.abc import Callable

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import SLURMEnvironment

__all__ = [
    "skip_sigterm_broadcast",
    "turn_off_slurm_auto_requeue",
]


def skip_sigterm_broadcast(trainer: pl.Trainer) -> Callable[[], None]:
    """Stop the training loop's per-step broadcast of ``trainer.received_sigterm`` (rank 0's), while a handler other
    than Lightning's holds SIGTERM; returns the undo. Call on every rank alike: the broadcast is a collective."""
    loop = trainer.fit_loop.epoch_loop
    loop._broadcast_sigterm_tensor = _skip  # type: ignore[method-assign]  # an instance attribute hides the method
    return lambda: loop.__dict__.pop("_broadcast_sigterm_tensor", None)


def _skip() -> None:
    return None


def turn_off_slurm_auto_requeue(trainer: pl.Trainer) -> Callable[[], None]:
    """Keep Lightning from installing its SLURM auto-requeue signal handlers in this fit (call before the stage starts:
    the setup hook); returns the undo. Nothing to do outside a SLURM environment or where it is off already."""
    environment = trainer._accelerator_connector.cluster_environment
    if not (isinstance(environment, SLURMEnvironment) and environment.auto_requeue):
        return _skip
    environment.auto_requeue = False

    def undo() -> None:
        environment.auto_requeue = True

    return undo
