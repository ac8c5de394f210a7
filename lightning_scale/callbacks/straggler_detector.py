"""A rank that holds the others back is named, with what it costs: the Lightning glue of
:mod:`lightning_scale.health.stragglers`."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import log_step_metrics, trainer_logs_this_step
from lightning_scale._trainer_attributes import trainer_callbacks
from lightning_scale.callbacks.cost_tracker import CostTracker
from lightning_scale.health.stragglers import StragglerTally, WindowVerdict

__all__ = ["StragglerDetector"]


class StragglerDetector(Callback):
    """Name a rank that is persistently slower than the others (rank and host) in every logger and at the end of fit,
    with the share of the job's time spent waiting for it and, with a :class:`CostTracker`, its price.

    Each rank times its own steps without a collective: its **busy** time is the step's wall time minus the time
    between its last gradient being computed and the optimizer step, which is where it waited for the gradient
    all-reduce (with ``ddp``/``data_parallel``; with sharded strategies that interval also holds the reduce-scatter).
    The first optimizer step hooks every parameter to learn whose gradient comes last; later steps hook that one only
    (again all of them after a step where it got no gradient). Where no gradient passes through autograd's
    accumulation (gradients assigned by hand, or by a strategy that sets them itself), the wait cannot be timed: a
    warning says so and nothing is judged.
    At the Trainer's logging cadence (``log_every_n_steps``) one small all-gather brings every rank's busy time of
    the window to every rank, which judge it alike (:class:`~lightning_scale.health.stragglers.StragglerTally`).
    Timestamps are the host's: on GPU they are when kernels were launched, which a step that synchronises (a loss
    ``.item()``, the optimizer) keeps close to when they ran.

    Logged metrics (every logging window): ``stragglers/slowdown`` (the slowest rank's busy time over the others'
    median), ``stragglers/slowest_rank``, ``stragglers/rank`` (the straggler, -1 for none), ``stragglers/idle_fraction``
    (the job's rank-time spent waiting for the slowest rank), ``stragglers/usd`` (with a ``CostTracker``: the price of
    that wait in the windows where a straggler was slow, the ``patience`` windows that made it one included, so far;
    a single slow window of a balanced job costs nothing here). A straggler is also logged as a hyperparameter
    ``straggler_rank_<r>`` holding its host.

    Args:
        factor: A rank is slow in a window when its busy time is this many times the others' median.
        patience: Consecutive slow windows before it is named.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[StragglerDetector(factor=1.5)], logger=False, enable_progress_bar=False)
    """

    def __init__(self, factor: float = 1.2, patience: int = 3) -> None:
        self.factor, self.patience = factor, patience
        self.tally = StragglerTally(factor, patience)  # checks the arguments
        self.usd = 0.0
        """What waiting for stragglers cost so far (with a CostTracker; see :attr:`StragglerTally.usd`)."""
        self.named: dict[int, str] = {}
        """Every rank named a straggler during this fit, with its host."""
        self.measurable = True
        """Whether this fit's gradients pass through autograd's accumulation, where the wait is timed."""
        self._clock: Callable[[], float] = time.perf_counter
        self._hosts: list[str] = []
        self._module: pl.LightningModule | None = None
        self._hooks: dict[int, Any] = {}
        self._calibrating = False
        self._last_parameter: int | None = None
        self._window_start: float | None = None
        self._waited = 0.0  # in this window, between a last gradient and the optimizer step
        self._last_grad: float | None = None
        self._last: WindowVerdict | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tally = StragglerTally(self.factor, self.patience)
        self.usd, self.named, self._last = 0.0, {}, None
        self._hosts = distributed.all_gather_object(socket.gethostname())
        self._module, self.measurable = pl_module, True
        self._watch_every_gradient()
        self._window_start = None

    def _watch_every_gradient(self) -> None:
        """Hook every trainable parameter for one optimizer step, to learn whose gradient comes last."""
        self._remove_hooks()
        assert self._module is not None
        self._hooks = {
            id(parameter): parameter.register_post_accumulate_grad_hook(self._gradient_ready)
            for parameter in self._module.parameters()
            if parameter.requires_grad
        }
        self._calibrating = True

    def _give_up(self, trainer: pl.Trainer) -> None:
        """No gradient passed through autograd's accumulation (gradients assigned by hand, or by a strategy that sets
        them itself): the wait cannot be told apart from work."""
        self._remove_hooks()
        self._calibrating, self.measurable = False, False
        rank_zero_warn(
            f"StragglerDetector: the gradients of this fit ({type(trainer.strategy).__name__}) are not accumulated by "
            "autograd, so the time spent waiting for other ranks cannot be told apart from work; stragglers are not "
            "judged. Remove the callback (--stragglers null) to silence this."
        )

    def _gradient_ready(self, parameter: torch.Tensor) -> None:
        self._last_grad, self._last_parameter = self._clock(), id(parameter)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._window_start is None:  # the window starts with a step; set-up and the first batch's wait are not in it
            self._window_start, self._waited = self._clock(), 0.0

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._last_grad is None and self._calibrating:  # every parameter hooked, no hook ran
            self._give_up(trainer)
            return
        if self._last_grad is None:  # the parameter watched got no gradient this step (a dynamic graph)
            if self.measurable:
                self._watch_every_gradient()
            return
        self._waited += self._clock() - self._last_grad
        self._last_grad = None
        if self._calibrating:  # from now on one hook per step: on the parameter whose gradient came last
            for key, hook in list(self._hooks.items()):
                if key != self._last_parameter:
                    hook.remove()
                    del self._hooks[key]
            self._calibrating = False

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._window_start is None or not self.measurable or not trainer_logs_this_step(trainer):
            return
        wall = self._clock() - self._window_start
        window = torch.tensor([wall - self._waited, wall], dtype=torch.float64, device=pl_module.device)
        gathered = distributed.all_gather_stacked(window).cpu()  # Lightning's all_gather warns of torch's deprecation
        self._window_start = None
        wall_seconds = float(gathered[:, 1].max())
        tracker = next((cb for cb in trainer_callbacks(trainer) if isinstance(cb, CostTracker)), None)
        meter = tracker.meter if tracker is not None else None
        priced = meter is not None
        usd = meter.usd(wall_seconds) if meter is not None else 0.0
        verdict = self.tally.judge(gathered[:, 0].tolist(), wall_seconds=wall_seconds, usd=usd)
        self._last = verdict
        self.usd = self.tally.usd
        metrics = {
            "stragglers/slowdown": verdict.slowdown,
            "stragglers/slowest_rank": float(verdict.slowest_rank),
            "stragglers/rank": float(-1 if verdict.straggler is None else verdict.straggler),
            "stragglers/idle_fraction": verdict.idle_fraction,
        }
        if priced:
            metrics["stragglers/usd"] = self.usd
        log_step_metrics(trainer, metrics)  # the same values on every rank
        if verdict.straggler is not None and verdict.straggler not in self.named:
            self._name(trainer, verdict)

    def _name(self, trainer: pl.Trainer, verdict: WindowVerdict) -> None:
        rank = verdict.straggler
        assert rank is not None
        self.named[rank] = self._hosts[rank] if rank < len(self._hosts) else "?"
        rank_zero_warn(
            f"StragglerDetector: rank {rank} on {self.named[rank]} is a straggler: {verdict.slowdown:.2f}x the "
            f"others' busy time in {self.patience} logging windows in a row; the job spends "
            f"{verdict.idle_fraction:.0%} of its time waiting for it. Look at that host (thermal throttling, a noisy "
            "neighbour, a slow disk or data path) or replace it."
        )
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_hyperparams({f"straggler_rank_{rank}": self.named[rank]})

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove_hooks()
        rank_zero_info(self.report())

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._remove_hooks()

    def report(self) -> str:
        """The end-of-fit line: the stragglers named, their slow windows and what waiting for them cost."""
        windows = self.tally.windows
        if not self.measurable:
            return "Stragglers: not judged (the wait for other ranks cannot be timed in this fit)."
        if not self.named:
            worst = f"; the last window's slowest rank was {self._last.slowdown:.2f}x the others" if self._last else ""
            return f"Stragglers: none in {windows} logging windows (factor {self.factor}){worst}."
        named = ", ".join(
            f"rank {rank} on {host} (slow in {self.tally.slow_windows.get(rank, 0)} of {windows} windows)"
            for rank, host in self.named.items()
        )
        cost = f"; waiting for stragglers cost ${self.usd:.4f}" if self.usd else ""
        return f"Stragglers: {named}{cost}."

    def _remove_hooks(self) -> None:
        for hook in self._hooks.values():
            hook.remove()
        self._hooks = {}
