"""Early stopping that also watches the bill: a cost or time budget, and the improvement each dollar still buys."""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._trainer_attributes import trainer_callbacks, trainer_fast_dev_run
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.callbacks._state_key import settings_state_key
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.callbacks.cost_tracker import CostTracker
from lightning_scale.errors import ConfigurationError

__all__ = ["BudgetedEarlyStopping"]

BudgetReason = Literal["max_cost_usd", "max_hours", "min_improvement_per_usd"]
REASON_CODES: dict[str, int] = {"max_cost_usd": 1, "max_hours": 2, "min_improvement_per_usd": 3}
T = TypeVar("T")


class BudgetedEarlyStopping(EarlyStopping):
    """Lightning's ``EarlyStopping`` (patience, thresholds, non-finite metric), plus three reasons to stop that cost.

    - ``max_cost_usd``: the run's bill, as the Trainer's :class:`CostTracker` counts it (earlier attempts and restart
      gaps included), reached this;
    - ``max_hours``: the run's billed wall time reached this;
    - ``min_improvement_per_usd``: over the last ``window`` evaluations, the best ``monitor`` value improved by less
      than this per USD spent (a run that can no longer pay off).

    The budget is checked every ``check_every_n_steps`` training steps, the improvement at each evaluation; every
    decision is a vote, so all ranks stop after the same step (on several processes the budget's vote is read at the
    next one, so no step waits for it: the stop comes a check later). The reason is printed, logged (``stopping_reason_
    message``; W&B summary ``early_stopping/reason``) and, with the evaluations seen, kept in the checkpoint, so a
    resumed run keeps its budget. Metrics logged when it stops (rank 0): ``early_stopping/stopped_step``,
    ``early_stopping/usd_total``, ``early_stopping/reason_code`` (1 ``max_cost_usd``, 2 ``max_hours``, 3
    ``min_improvement_per_usd``). It stops once; Lightning honours the stop only after ``min_steps``/``min_epochs``.

    Args:
        monitor: Metric for patience and ``min_improvement_per_usd``; ``None`` for a budget only.
        max_cost_usd: Stop once the run cost this many USD (> 0).
        max_hours: Stop once the run took this many billed hours (> 0).
        min_improvement_per_usd: Stop when the best ``monitor`` improved by less than this per USD over ``window``
            evaluations (>= 0; needs ``monitor``).
        window: Evaluations that ``min_improvement_per_usd`` looks back over (>= 1).
        check_every_n_steps: Training steps between two budget votes (>= 1).
        mode: ``"min"`` or ``"max"`` for ``monitor``.
        patience: Evaluations without improvement before stopping, as in ``EarlyStopping`` (default 3).
        min_delta: Smallest change that counts as improvement, as in ``EarlyStopping``.
        strict: Fail when ``monitor`` is missing, as in ``EarlyStopping``.
        check_finite: Stop when ``monitor`` is NaN or infinite, as in ``EarlyStopping``.
        verbose: Log improvements, as in ``EarlyStopping``.
        stopping_threshold: Stop once ``monitor`` reaches this, as in ``EarlyStopping``.
        divergence_threshold: Stop once ``monitor`` is worse than this, as in ``EarlyStopping``.
        check_on_train_epoch_end: Check ``monitor`` at the end of the training epoch, as in ``EarlyStopping``.
        log_rank_zero_only: Log the stopping reason on rank 0 only, as in ``EarlyStopping``.

    Without a cost criterion (``max_cost_usd``, ``max_hours``, ``min_improvement_per_usd``) it is ``EarlyStopping``
    and needs no :class:`CostTracker`.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_scale.callbacks import CostTracker
        >>> stopper = BudgetedEarlyStopping(monitor="val_loss", max_cost_usd=250.0, min_improvement_per_usd=1e-4)
        >>> trainer = Trainer(callbacks=[CostTracker(price_per_hour=3.0), stopper], logger=False)
    """

    METRIC_KEYS = ("early_stopping/stopped_step", "early_stopping/usd_total", "early_stopping/reason_code")

    def __init__(
        self,
        monitor: str | None = None,
        max_cost_usd: float | None = None,
        max_hours: float | None = None,
        min_improvement_per_usd: float | None = None,
        window: int = 3,
        check_every_n_steps: int = 1,
        mode: Literal["min", "max"] = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        strict: bool = True,
        check_finite: bool = True,
        verbose: bool = False,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        for name, value in (("max_cost_usd", max_cost_usd), ("max_hours", max_hours)):
            if value is not None and not value > 0:
                raise ConfigurationError(f"{name}={value} must be > 0; use None for no limit (BudgetedEarlyStopping).")
        if min_improvement_per_usd is not None:
            if not min_improvement_per_usd >= 0:
                raise ConfigurationError(f"min_improvement_per_usd={min_improvement_per_usd} must be >= 0.")
            if monitor is None:
                raise ConfigurationError(
                    "min_improvement_per_usd needs the metric whose improvement is bought: pass monitor= (e.g. "
                    "BudgetedEarlyStopping(monitor='val_loss', min_improvement_per_usd=...))."
                )
        if window < 1 or check_every_n_steps < 1:
            raise ConfigurationError(f"window={window} and check_every_n_steps={check_every_n_steps} must be >= 1.")
        super().__init__(
            monitor=monitor or "",
            min_delta=min_delta,
            patience=patience,
            verbose=verbose,
            mode=mode,
            strict=strict,
            check_finite=check_finite,
            stopping_threshold=stopping_threshold,
            divergence_threshold=divergence_threshold,
            check_on_train_epoch_end=check_on_train_epoch_end,
            log_rank_zero_only=log_rank_zero_only,
        )
        self.max_cost_usd = max_cost_usd
        self.max_hours = max_hours
        self.min_improvement_per_usd = min_improvement_per_usd
        self.window = window
        self.check_every_n_steps = check_every_n_steps
        self.budget_reason: BudgetReason | None = None
        """Which budget stopped the run (``None``: none did)."""
        self.evaluations: list[tuple[float, float]] = []
        """``(usd_total, monitor value)`` at each evaluation."""
        self._tracker: CostTracker | None = None
        self._last_checked_step = -1
        self._reached: tuple[BudgetReason, str] | None = None  # this rank's budget reached, at the last vote

    @property
    @override
    def state_key(self) -> str:
        return settings_state_key(self, self._generate_state_key, monitor=self.monitor, mode=self.mode, budget=True)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        trackers = [cb for cb in trainer_callbacks(trainer) if isinstance(cb, CostTracker)]
        costed = (self.max_cost_usd, self.max_hours, self.min_improvement_per_usd) != (None, None, None)
        if not trackers and stage == "fit" and costed:
            raise ConfigurationError(
                "BudgetedEarlyStopping counts the cost with the Trainer's CostTracker, and there is none: add "
                "lightning_scale.callbacks.CostTracker(price_per_hour=...) (a price of 0 works for max_hours only)."
            )
        self._tracker = trackers[0] if trackers else None
        self._last_checked_step = -1
        if stage == "fit":
            StepVote.of(trainer).join(self, self._ballot, deferred=True)
        if stage == "fit" and (trainer.min_steps or trainer.min_epochs) and (self.max_cost_usd or self.max_hours):
            rank_zero_warn(
                f"Trainer(min_steps={trainer.min_steps}, min_epochs={trainer.min_epochs}) keeps training past a "
                "reached budget until that minimum: Lightning ignores a stop request before it."
            )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        StepVote.of(trainer).leave(self)

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(version=STATE_VERSION, evaluations=list(self.evaluations), budget_reason=self.budget_reason)
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "BudgetedEarlyStopping", missing=None)
        super().load_state_dict(state_dict)
        self.evaluations = [tuple(item) for item in state_dict["evaluations"]]
        self.budget_reason = state_dict["budget_reason"]

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if not StepVote.of(trainer).agreed(self, trainer, outputs, batch_idx):
            return
        rank, (reason, reached) = _first_of(self._reached)
        where = f" on rank {rank}" if trainer.world_size > 1 else ""
        self._stop(trainer, reason, f"Budget reached ({reason}){where}: {reached} after step {trainer.global_step}.")

    def _ballot(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> bool | None:
        step = trainer.global_step
        if self._tracker is None or self.budget_reason is not None or _skipped(trainer):
            return None
        if step == self._last_checked_step or step % self.check_every_n_steps:
            return None  # inside a gradient accumulation window, or not a checking step: same on every rank
        self._last_checked_step = step
        meter = self._tracker.meter  # its two figures, not a whole report: this runs every step
        assert meter is not None, "CostTracker creates its meter in setup('fit')"
        self._reached = None
        if self.max_cost_usd is not None and (usd_total := meter.usd_total()) >= self.max_cost_usd:
            self._reached = ("max_cost_usd", f"${usd_total:.4f} >= ${self.max_cost_usd}")
        elif self.max_hours is not None and (hours := meter.seconds() / 3600.0) >= self.max_hours:
            self._reached = ("max_hours", f"{hours:.3f} h >= {self.max_hours} h")
        return self._reached is not None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.monitor:
            return
        super().on_validation_end(trainer, pl_module)
        if self._tracker is not None and self.budget_reason is None and not _skipped(trainer):
            self._check_value_for_money(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor:
            super().on_train_epoch_end(trainer, pl_module)

    def _check_value_for_money(self, trainer: pl.Trainer) -> None:
        assert self._tracker is not None
        value = trainer.callback_metrics.get(self.monitor)
        message = None
        if value is not None and not trainer_fast_dev_run(trainer):
            self.evaluations.append((self._tracker.report(trainer.global_step).usd_total, float(value)))
            message = self._low_value_message()
        agreed = _first_on_any_rank(message)  # every rank votes, also one that lacks the metric
        if agreed is not None:
            self._stop(trainer, "min_improvement_per_usd", agreed[1])

    def _low_value_message(self) -> str | None:
        if self.min_improvement_per_usd is None or len(self.evaluations) <= self.window:
            return None
        best = min if self.mode == "min" else max
        usd_then = self.evaluations[-self.window - 1][0]
        before = best(value for _, value in self.evaluations[: -self.window])
        now = best(value for _, value in self.evaluations)
        spent = self.evaluations[-1][0] - usd_then
        if not (math.isfinite(before) and math.isfinite(now)) or spent <= 0:
            return None
        gained = (before - now) if self.mode == "min" else (now - before)
        if gained / spent >= self.min_improvement_per_usd:
            return None
        return (
            f"Best {self.monitor} improved by {gained:.6g} for ${spent:.4f} over the last {self.window} evaluations: "
            f"{gained / spent:.6g} per USD < min_improvement_per_usd={self.min_improvement_per_usd}."
        )

    def _stop(self, trainer: pl.Trainer, reason: BudgetReason, message: str) -> None:
        trainer.should_stop = True
        self.stopped_epoch = trainer.current_epoch
        self.budget_reason = reason
        self.stopping_reason_message = f"{message} Stopping."
        rank_zero_info(self.stopping_reason_message)
        if trainer.is_global_zero:
            usd = self._tracker.report(trainer.global_step).usd_total if self._tracker else float("nan")
            metrics = {
                "early_stopping/stopped_step": float(trainer.global_step),
                "early_stopping/usd_total": usd,
                "early_stopping/reason_code": float(REASON_CODES[reason]),
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
                if isinstance(logger, WandbLogger):
                    logger.experiment.summary["early_stopping/reason"] = self.stopping_reason_message


def _skipped(trainer: pl.Trainer) -> bool:
    return trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking


def _first_on_any_rank(local: T | None) -> tuple[int, T] | None:
    """``(rank, value)`` of the lowest rank with a value, the same on every rank; ``None`` when no rank has one."""
    return _first_of(local) if distributed.any_rank(local is not None) else None


def _first_of(local: T | None) -> tuple[int, T]:
    """``(rank, value)`` of the lowest rank with a value, on every rank; call when some rank has one."""
    return next((rank, value) for rank, value in enumerate(distributed.all_gather_object(local)) if value is not None)
