"""``ResumableCheckpoint``'s time trigger: a :class:`~lightning_scale.checkpoint.cadence.SaveTimer` whose expiry every
rank agrees on through the step vote (ranks' clocks differ), and the interval it logs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info

from lightning_scale._lightning_internals import trainer_logs_this_step
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.checkpoint.cadence import SaveTimer

__all__ = ["TimeTrigger"]


class TimeTrigger:
    """Save when ``every_n_minutes`` passed since the last save (``"auto"``: the Young/Daly interval).

    Args:
        every_n_minutes: Minutes between saves, or ``"auto"``.
        mtbi_hours: Expected hours between interruptions, for ``"auto"``.
        clock: Seconds, monotonic.
        owner: The callback whose vote this is.

    Examples:
        >>> trigger = TimeTrigger(30.0, None, clock=lambda: 0.0, owner=object())
        >>> trigger.timer.due()
        False
    """

    def __init__(self, every_n_minutes: float | Literal["auto"], mtbi_hours: float | None, clock: Callable[[], float],
                 owner: object) -> None:  # fmt: skip
        self.timer = SaveTimer(every_n_minutes, mtbi_hours, clock)
        self._owner = owner

    def join(self, trainer: pl.Trainer) -> None:
        """Take part in the Trainer's step vote; its result is read a step later (``deferred``)."""
        StepVote.of(trainer).join(self._owner, lambda trainer, outputs: self.timer.due(), deferred=True)

    def restart(self) -> None:
        """Count the interval from now (training starts)."""
        self.timer.restart()

    def fires(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch_idx: int) -> bool:
        """At a batch's end: log the interval in use and the measured save time, and whether every rank agreed that
        a save is due (the timer then starts again, also when top-k declines, so the next try is an interval away)."""
        cadence = self.timer.cadence
        if cadence is not None and trainer_logs_this_step(trainer):
            minutes = self.timer.interval_seconds() / 60.0
            pl_module.log("checkpoint/interval_minutes", minutes, on_step=True, on_epoch=False)
            pl_module.log("checkpoint/save_seconds", cadence.save_seconds, on_step=True, on_epoch=False)
        if not StepVote.of(trainer).agreed(self._owner, trainer, outputs, batch_idx):
            return False
        self.timer.restart()
        return True

    def record(self, blocked_seconds: float) -> None:
        """A save blocked training this long: ``"auto"`` adapts its interval, and says so when it changes."""
        change = self.timer.record(blocked_seconds)
        if change:
            rank_zero_info(f"ResumableCheckpoint: {change}")
