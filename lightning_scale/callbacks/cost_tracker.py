"""Cost per run, per step and per result, logged next to the metrics: a thin callback over :class:`CostMeter`."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import log_step_metrics, trainer_logs_this_step
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.cost import CostMeter, CostReport, RightSizingReport, measure_peak_memory, resolve_pricing
from lightning_scale.cost.wandb_report import log_cost_table, write_pricing_config, write_summary
from lightning_scale.errors import ConfigurationError

__all__ = ["CostTracker"]

log = logging.getLogger(__name__)

IN_THE_STEPS_ROW = ("cost/usd_total", "cost/hours")
"""Logged with ``self.log``, into the loggers' row of the step's own metrics (the loss against dollars, in the W&B
workspace and ``lightning-scale report``); the other figures of a step go to the loggers directly, in a row of their
own at the same step (``_lightning_internals.log_step_metrics``)."""


class CostTracker(Callback):
    """Price every run, step and result, across restarts, in every Lightning logger.

    The hourly price is ``price_per_hour`` per node, or the shipped price catalog's row for ``provider`` +
    ``instance_type`` (on-demand, or spot with ``spot=True``), times the number of nodes. Wall time is billed from
    the run's first start, across restarts: the tracker's state is in the checkpoint, and a resumed attempt adds the
    gap since that checkpoint (work lost plus restart time, counted as preemption waste). An attempt on another
    number of nodes (an elastic job that lost or gained nodes) bills its own nodes from its start, keeps what the
    earlier attempts cost at theirs, and says so in the log. Time inside training steps is busy; the rest (data
    waits, checkpoint saves, validation, restarts) is idle.

    Metrics go through ``LightningModule.log`` at the steps the Trainer logs (``log_every_n_steps``) and at each
    validation end, so every logger gets them in the same rows as the run's own metrics (``cost/usd_total`` can be
    the x-axis of any chart), a checkpoint or early stopping can monitor them, and the progress bar shows the total.
    With a ``WandbLogger`` (rank 0 only) the pricing assumptions go to the run config, the final figures to the
    summary, and ``cost/table`` (price and metrics of every validation) with a line plot per checkpoint monitor.

    Logged metrics: ``cost/usd_total``, ``cost/usd_per_hour``, ``cost/usd_per_step``, ``cost/usd_per_1k_samples``,
    ``cost/projected_usd`` (total at ``max_steps``/``max_epochs`` at the recent rate), ``cost/preemption_waste_usd``,
    ``cost/savings_vs_on_demand_usd`` (what on-demand capacity would have cost for the useful time, minus the
    bill; only when the price paid differs from a known on-demand price: spot or a discount), ``cost/idle_fraction``,
    ``cost/hours``, ``cost/nodes``; ``cost/usd_at_best_<monitor>`` for each checkpoint monitor; at the end of fit
    ``rightsizing/peak_memory_gib``, ``rightsizing/memory_capacity_gib``, ``rightsizing/peak_memory_fraction`` and
    ``rightsizing/busy_fraction`` (busiest rank), with a printed report.

    Args:
        price_per_hour: USD per hour of ONE node (>= 0); or use ``provider`` + ``instance_type``.
        provider: Cloud of the catalog lookup.
        instance_type: Instance type of the catalog lookup, as the provider spells it (e.g. ``p4d.24xlarge``).
        spot: Bill the catalog's spot price (with ``price_per_hour``: say that the price is a spot price).
        catalog_path: A CSV of your own prices (columns as in ``lightning_scale.cost.catalog.COLUMNS``).
        on_demand_price_per_hour: On-demand USD per node-hour for ``cost/savings_vs_on_demand_usd`` (default: the
            catalog's, or ``price_per_hour`` when ``spot=False``).
        num_nodes: Nodes billed (default: the Trainer's ``num_nodes``).
        max_restart_gap_minutes: Longest restart gap billed; a longer one (a job that waited in a queue, or was
            resumed by hand later) is billed up to this.
        progress_bar: Show ``cost/usd_total`` in the progress bar.
        rightsizing: Print and log the right-sizing report at the end of fit.
        clock: Wall-clock seconds (default ``time.time``), injectable for tests; must agree across processes.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> tracker = CostTracker(provider="gcp", instance_type="g2-standard-4", spot=True)
        >>> trainer = Trainer(callbacks=[tracker], logger=False, enable_progress_bar=False)
    """

    METRIC_KEYS = (
        *(f"cost/{name}" for name in CostReport.__dataclass_fields__),
        "cost/nodes",
        *RightSizingReport(device_type="cpu", peak_memory_bytes=0, capacity_bytes=1, busy_fraction=0.0).metrics(),
    )
    """Every metric key logged, except ``cost/usd_at_best_<monitor>``."""

    def __init__(
        self,
        price_per_hour: float | None = None,
        provider: Literal["aws", "gcp", "azure"] | None = None,
        instance_type: str | None = None,
        spot: bool = False,
        catalog_path: str | None = None,
        on_demand_price_per_hour: float | None = None,
        num_nodes: int | None = None,
        max_restart_gap_minutes: float = 30.0,
        progress_bar: bool = True,
        rightsizing: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.pricing = resolve_pricing(
            price_per_hour, provider, instance_type, spot, catalog_path, on_demand_price_per_hour
        )
        if num_nodes is not None and num_nodes < 1:
            raise ConfigurationError(f"num_nodes={num_nodes} must be >= 1 (CostTracker(num_nodes=...)).")
        if not max_restart_gap_minutes >= 0:
            raise ConfigurationError(f"max_restart_gap_minutes={max_restart_gap_minutes} must be >= 0.")
        self.num_nodes = num_nodes
        self.max_restart_gap_minutes = max_restart_gap_minutes
        self.progress_bar = progress_bar
        self.rightsizing = rightsizing
        self.clock = clock
        self.meter: CostMeter | None = None
        self.evaluations: list[dict[str, Any]] = []
        """Price and metrics at every validation of the run (earlier attempts included)."""
        self.best: dict[str, dict[str, float]] = {}
        """Per checkpoint monitor: the best value, its step and the USD spent when it was reached."""
        self._pending_state: dict[str, Any] | None = None
        self._total_steps: int | None = None
        self._last_logged_step = -1
        self._batch_size_warned = False
        self._config_written = False
        self._at_last_step = False
        self._resumed = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.barebones:
            raise ConfigurationError(
                "CostTracker logs through LightningModule.log, which Trainer(barebones=True) disables."
            )
        self._config_written = False
        if self.meter is None or trainer.global_step == 0:  # a second fit on the same Trainer keeps counting
            self._new_meter(trainer)
        self._meter().start()  # from setup on: model setup and the sanity check are paid time too

    def _new_meter(self, trainer: pl.Trainer) -> None:
        nodes = self.num_nodes or trainer.num_nodes
        on_demand = self.pricing.node_savings_baseline_usd_per_hour
        kwargs: dict[str, Any] = {} if self.clock is None else {"clock": self.clock}
        self.meter = CostMeter(
            usd_per_hour=self.pricing.node_usd_per_hour * nodes,
            on_demand_usd_per_hour=None if on_demand is None else on_demand * nodes,
            max_restart_gap_seconds=self.max_restart_gap_minutes * 60.0,
            **kwargs,
        )
        self._nodes = nodes
        self.evaluations, self.best = [], {}
        if self._pending_state is not None:
            self._load(self._pending_state)

    @override
    def state_dict(self) -> dict[str, Any]:
        if self.meter is None:
            return {}
        return {
            "version": STATE_VERSION,
            "meter": self.meter.state_dict(final=self._at_last_step),
            "nodes": self._nodes,
            "evaluations": list(self.evaluations),
            "best": dict(self.best),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return  # saved before the tracker's setup (no fit yet)
        check_state_version(state_dict, "CostTracker", missing=None)
        self._pending_state = state_dict
        if self.meter is not None:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        assert self.meter is not None
        self.meter.load_state_dict(state["meter"])
        saved_nodes = state.get("nodes", self._nodes)
        if saved_nodes != self._nodes:
            rank_zero_info(
                f"CostTracker: the job runs on {self._nodes} node(s) now, {saved_nodes} before: "
                f"{_usd(self.meter.usd_total())} so far (each attempt at its own nodes), "
                f"{_usd(self.meter.usd_per_hour)}/h from here."
            )
        self.evaluations = list(state["evaluations"])
        self.best = dict(state["best"])
        self._pending_state = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meter = self._meter()
        meter.start()  # after a restore: bills the gap since the checkpoint's state
        steps = trainer.estimated_stepping_batches  # max_steps when set; -1 or inf when unknown
        self._total_steps = int(steps) if math.isfinite(steps) and steps > 0 else None
        self._last_logged_step = trainer.global_step
        self._resumed = trainer.global_step > 0  # restored from a checkpoint

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._meter().step_started()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        self._meter().step_ended(trainer.global_step, self._batch_size(batch) * trainer.world_size)
        self._at_last_step = self._total_steps is not None and trainer.global_step >= self._total_steps
        if not self._config_written:  # every on_train_start ran: a continued W&B run is in place by now
            self._config_written = True
            for run in self._wandb_runs(trainer):
                write_pricing_config(run, self.pricing.describe(self._nodes))
        step = trainer.global_step
        if step != self._last_logged_step and trainer_logs_this_step(trainer):  # only then: logging is not free
            self._last_logged_step = step
            self._log(trainer, pl_module, self.report(step), on_step=True)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting(trainer):  # into the same logger rows as the validation metrics
            self._log(trainer, pl_module, self.report(trainer.global_step), on_step=False)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._fitting(trainer):
            return
        report = self.report(trainer.global_step)
        metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if not name.startswith(("cost/", "rightsizing/")) and _is_scalar(value)
        }
        step = trainer.global_step
        evaluation = {"step": step, "usd_total": report.usd_total, "hours": report.hours, "metrics": metrics}
        self.evaluations.append(evaluation)
        improved = {}
        for monitor, mode in _checkpoint_monitors(trainer):
            value, best = metrics.get(monitor), self.best.get(monitor)
            if value is not None and (best is None or _better(value, best["value"], mode)):
                self.best[monitor] = {"value": value, "step": step, "usd": report.usd_total}
                improved[f"cost/usd_at_best_{monitor}"] = report.usd_total
        if improved and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(improved, step=step)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meter = self._meter()
        report = self.report(trainer.global_step)
        meter.stop()
        final = report.metrics()
        final.update({f"cost/usd_at_best_{monitor}": best["usd"] for monitor, best in self.best.items()})
        sizing = self._rightsizing(trainer, pl_module) if self.rightsizing else None
        if sizing is not None:
            final.update(sizing.metrics())
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(final, step=trainer.global_step)
            for run in self._wandb_runs(trainer):
                write_summary(run, final)
                if self.evaluations:
                    log_cost_table(run, self.evaluations, [monitor for monitor, _ in _checkpoint_monitors(trainer)])
        rank_zero_info(_summary_line(report, trainer.global_step))
        if sizing is not None:
            rank_zero_info(sizing.text())

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.meter is not None:
            self.meter.stop()

    def resume_summary(self) -> str | None:
        """After a restore: the cost so far and the restart gap billed (for the resume banner); else ``None``."""
        meter = self.meter
        if meter is None or not self._resumed:
            return None
        line = f"Cost so far: {_usd(meter.usd_total())}"
        if meter.last_gap_seconds is None:  # resumed from the end of a finished run: no restart gap
            return line + "."
        gap = min(meter.last_gap_seconds, meter.max_restart_gap_seconds)
        capped = "" if gap == meter.last_gap_seconds else f" (billed {gap:.0f} s: max_restart_gap_minutes)"
        return f"{line}, including a restart gap of {meter.last_gap_seconds:.1f} s{capped} billed as preemption waste."

    def report(self, step: int) -> CostReport:
        """The cost figures now, at optimizer step ``step``."""
        return self._meter().report(step, self._total_steps)

    def _meter(self) -> CostMeter:
        if self.meter is None:
            raise RuntimeError("CostTracker measures during fit; its meter is created in setup('fit').")
        return self.meter

    def _fitting(self, trainer: pl.Trainer) -> bool:
        return self.meter is not None and self.meter.running and not trainer.sanity_checking

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, report: CostReport, on_step: bool) -> None:
        # one value per call, so the step or epoch figure is the value right now. Every rank bills the same job on its
        # own clock: per step rank 0's figures are logged; at validation their mean (one all-reduce per metric, as
        # Lightning asks of epoch-level metrics in a distributed run), in the rows of the validation metrics
        metrics = {**report.metrics(), "cost/nodes": float(self._nodes)}
        options: dict[str, Any] = {
            "on_step": on_step,
            "on_epoch": not on_step,
            "batch_size": 1,
            "sync_dist": not on_step,
        }
        if on_step:  # self.log costs ~0.3 ms a metric: only those plotted against the step's metrics, in their row
            pl_module.log_dict({key: metrics.pop(key) for key in IN_THE_STEPS_ROW}, **options)
            log_step_metrics(trainer, metrics)
        else:
            pl_module.log_dict(metrics, **options)
        if self.progress_bar:
            pl_module.log("cost/usd", report.usd_total, prog_bar=True, logger=False, **options)

    def _batch_size(self, batch: Any) -> int:
        try:
            return extract_batch_size(batch)
        except Exception as err:  # a batch without tensors: samples are not counted, the rest still is
            if not self._batch_size_warned:
                self._batch_size_warned = True
                log.warning(f"CostTracker cannot tell the batch size ({err}); cost/usd_per_1k_samples is not logged.")
            return 0

    def _rightsizing(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> RightSizingReport:
        peak, capacity = measure_peak_memory(pl_module.device, processes_on_node=trainer.num_devices)
        per_rank = distributed.all_gather_object((peak, capacity))
        peak, capacity = max(per_rank, key=lambda item: item[0] / item[1] if item[1] else 0.0)
        busy = 1.0 - self.report(trainer.global_step).idle_fraction
        return RightSizingReport(pl_module.device.type, peak, capacity, busy)

    @staticmethod
    def _wandb_runs(trainer: pl.Trainer) -> list[Any]:
        if not trainer.is_global_zero:
            return []  # on other ranks a WandbLogger's experiment is a dummy
        return [logger.experiment for logger in trainer.loggers if isinstance(logger, WandbLogger)]


def _better(value: float, best: float, mode: str) -> bool:
    return value < best if mode == "min" else value > best


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)


def _checkpoint_monitors(trainer: pl.Trainer) -> list[tuple[str, str]]:
    return [
        (cb.monitor, cb.mode) for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor
    ]


def _usd(value: float) -> str:
    """Dollars to the cent and beyond for large amounts, to 3 significant digits for the tiny per-step figures."""
    return f"${value:.4f}" if value == 0 or abs(value) >= 0.01 else f"${value:.3g}"


def _summary_line(report: CostReport, step: int) -> str:
    parts = [f"Cost: {_usd(report.usd_total)} for {step} steps over {report.hours * 60:.1f} min"]
    if report.usd_per_step is not None:
        parts.append(f"{_usd(report.usd_per_step)}/step")
    if report.usd_per_1k_samples is not None:
        parts.append(f"{_usd(report.usd_per_1k_samples)}/1k samples")
    parts.append(f"preemption waste {_usd(report.preemption_waste_usd)}")
    if report.savings_vs_on_demand_usd is not None:
        parts.append(f"saved vs on-demand {_usd(report.savings_vs_on_demand_usd)}")
    parts.append(f"idle {report.idle_fraction:.0%}")
    return ", ".join(parts) + "."
