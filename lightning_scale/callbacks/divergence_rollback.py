"""Do not pay for a dead run: on a non-finite or spiking loss, roll back to the last good checkpoint and go on."""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import restore_training_state
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.callbacks._state_key import settings_state_key
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.errors import ConfigurationError

__all__ = ["DivergenceRollback"]

log = logging.getLogger(__name__)


class DivergenceRollback(Callback):
    """On a non-finite loss, or one ``spike_factor`` times the median of the last ``window`` losses, on ANY rank,
    every rank reloads the weights, optimizer, LR scheduler and precision states of the newest valid checkpoint of the
    Trainer's :class:`ResumableCheckpoint` and training goes on from the current data position: the batches since
    that checkpoint, the offending ones included, are skipped. After ``max_rollbacks`` rollbacks, the next divergence
    rolls back once more (so no later checkpoint holds diverged weights) and stops the run.

    The decision is a vote after each optimizer step (with gradient accumulation, a bad micro-batch is remembered
    until the step). The loss is read from ``training_step``'s output (a tensor or ``{"loss": ...}``); manual
    optimization without a returned loss is not watched. Logged metrics (rank 0, at each rollback):
    ``divergence/rollbacks``, ``divergence/rolled_back_to_step``, ``divergence/loss``.

    Args:
        spike_factor: A finite loss above this multiple of the recent median is a spike (> 1); ``None``: only
            non-finite losses count.
        window: Recent losses kept for the median (>= 2); spikes are checked once half of it is filled.
        max_rollbacks: Rollbacks allowed before a divergence stops the run (>= 0).

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_scale.callbacks import ResumableCheckpoint
        >>> callbacks = [ResumableCheckpoint(dirpath="memory://run", every_n_train_steps=100), DivergenceRollback()]
        >>> trainer = Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False)
    """

    METRIC_KEYS = ("divergence/rollbacks", "divergence/rolled_back_to_step", "divergence/loss")

    def __init__(self, spike_factor: float | None = 10.0, window: int = 50, max_rollbacks: int = 2) -> None:
        if spike_factor is not None and not spike_factor > 1:
            raise ConfigurationError(
                f"spike_factor={spike_factor} must be > 1, or None to watch non-finite losses only."
            )
        if window < 2:
            raise ConfigurationError(f"window={window} must be >= 2 (DivergenceRollback).")
        if max_rollbacks < 0:
            raise ConfigurationError(f"max_rollbacks={max_rollbacks} must be >= 0 (DivergenceRollback).")
        self.spike_factor = spike_factor
        self.window = window
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        """Rollbacks done in this run (earlier attempts included)."""
        self._losses: deque[float] = deque(maxlen=window)
        self._bad_loss: float | None = None  # the worst loss seen since the last optimizer step
        self._voted_loss: float | None = None  # this rank's bad loss at the last vote
        self._checkpoint: ResumableCheckpoint | None = None
        self._last_step = -1

    @property
    @override
    def state_key(self) -> str:
        return settings_state_key(self, self._generate_state_key, spike_factor=self.spike_factor)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._checkpoint = ResumableCheckpoint.of(trainer, "DivergenceRollback (to roll back to its newest checkpoint)")
        StepVote.of(trainer).join(self, self._ballot)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        StepVote.of(trainer).leave(self)

    @override
    def state_dict(self) -> dict[str, Any]:
        # the recent losses differ per rank and are not kept: the median window fills again after a resume
        return {"version": STATE_VERSION, "rollbacks": self.rollbacks}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "DivergenceRollback", missing=None)
        self.rollbacks = state_dict["rollbacks"]

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step, self._bad_loss = trainer.global_step, None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if StepVote.of(trainer).agreed(self, trainer, outputs, batch_idx):
            self._roll_back(trainer, self._voted_loss)

    def _ballot(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> bool | None:
        loss = _loss_of(outputs)
        if loss is not None:
            if self._diverged(loss):
                self._bad_loss = loss if self._bad_loss is None else max(self._bad_loss, loss, key=_badness)
            else:
                self._losses.append(loss)
        if trainer.global_step == self._last_step:
            return None  # inside a gradient accumulation window: decide at the optimizer step
        self._last_step = trainer.global_step
        self._voted_loss, self._bad_loss = self._bad_loss, None
        return self._voted_loss is not None

    def _diverged(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        if self.spike_factor is None or len(self._losses) < max(2, self.window // 2):
            return False
        median = statistics.median(self._losses)
        return median > 0 and loss > self.spike_factor * median

    def _roll_back(self, trainer: pl.Trainer, loss: float | None) -> None:
        assert self._checkpoint is not None
        path = self._checkpoint.newest_valid_checkpoint()
        step = trainer.global_step
        seen = "on another rank" if loss is None else f"loss {loss:.6g}"
        if path is None:
            rank_zero_warn(f"Divergence at step {step} ({seen}) and no checkpoint to roll back to: stopping.")
            trainer.should_stop = True
            return
        try:  # a read failing on one rank fails on all, instead of leaving the others in their next collective
            checkpoint = distributed.on_every_rank(lambda: trainer.strategy.load_checkpoint(path))
        except distributed.RankFailedError as err:
            raise RuntimeError(f"Rolling back to {path} after a divergence at step {step} failed: {err}") from err
        restore_training_state(trainer, checkpoint)
        self._checkpoint.discard_snapshots()  # they hold the diverged state
        self.rollbacks += 1
        stop = self.rollbacks > self.max_rollbacks
        rank_zero_warn(
            f"Divergence at step {step} ({seen}): rolled back to the weights and optimizer of step "
            f"{checkpoint['global_step']} ({path}), skipping the batches since. "
            + (f"Rollback {self.rollbacks} > max_rollbacks={self.max_rollbacks}: stopping." if stop else "Going on.")
        )
        trainer.should_stop = trainer.should_stop or stop
        if trainer.is_global_zero:
            metrics = {
                "divergence/rollbacks": float(self.rollbacks),
                "divergence/rolled_back_to_step": float(checkpoint["global_step"]),
                "divergence/loss": float("nan") if loss is None else loss,
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
        rank_zero_info(f"Training continues at step {step} with the state of step {checkpoint['global_step']}.")


def _loss_of(outputs: STEP_OUTPUT) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return float(loss.detach()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _badness(loss: float) -> float:
    return math.inf if not math.isfinite(loss) else loss
