"""The typed description of one test training job, and its JSON file: what the job runner reads in every process."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning_scale.testing.faults import Fault

__all__ = ["CHECKPOINTS", "MARKER", "CloudNotices", "CostModel", "JobConfig", "read_job", "write_job"]

CHECKPOINTS = "checkpoints"  # below the job's directory
MARKER = "interrupted.marker"  # written by the runner once the checkpoint at ``interrupt_at`` is durable
_RUNNER_TRAINER_ARGS = {
    "accelerator", "devices", "num_nodes", "strategy", "max_steps", "callbacks", "logger", "enable_progress_bar",
    "enable_model_summary",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A deterministic bill: ``StepClock`` time and ``CostTracker`` at a fixed price.

    Attributes:
        price_per_hour: USD per node-hour.
        seconds_per_step: Clock time per training step.
        restart_gap_seconds: Clock time added when a fit resumes from a checkpoint.
        rank_stretch: Rank r's steps take ``1 + r * rank_stretch`` times as long (the ranks' clocks disagree).
    """

    price_per_hour: float
    seconds_per_step: float
    restart_gap_seconds: float = 0.0
    rank_stretch: float = 0.0


@dataclasses.dataclass(frozen=True)
class CloudNotices:
    """``SpotPreemption`` with SIGTERM notices, and cloud metadata servers to poll (e.g. on loopback) when given.

    Attributes:
        grace_seconds: Time between the notice and the hard kill.
        aws_base_url: Base URL of an AWS instance metadata server.
        gcp_base_url: Base URL of a GCP metadata server.
        azure_base_url: Base URL of an Azure scheduled-events server.
    """

    grace_seconds: float = 25.0
    aws_base_url: str | None = None
    gcp_base_url: str | None = None
    azure_base_url: str | None = None


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One training job of the runner (``python -m lightning_scale.testing.runner CONFIG.json``), on CPU.

    Attributes:
        model_factory: ``"module:qualname"`` of a callable returning the ``LightningModule``.
        datamodule_factory: ``"module:qualname"`` of a callable returning the ``LightningDataModule``.
        steps: Optimizer steps to train (``Trainer(max_steps=...)``).
        checkpoint_every: Checkpoint every this many steps.
        devices: Processes per node (gloo).
        num_nodes: Nodes (torchrun agents); under torchrun the job takes the number its rendezvous formed.
        seed: Seed passed to ``seed_everything``.
        strategy: ``ddp`` (Lightning's), ``data_parallel`` or ``model_parallel`` (lightning-scale's).
        strategy_kwargs: Arguments of that strategy.
        distributed: Use ``strategy`` (default: when ``devices > 1``); ``False`` trains with ``"auto"``.
        checkpoint: ``"resumable"``: ``ResumableCheckpoint`` with auto-resume; ``"stock"``: Lightning's
            ``ModelCheckpoint`` and ``ckpt_path="last"``.
        checkpoint_kwargs: Extra ``ResumableCheckpoint`` arguments.
        checkpoint_dirpath: The checkpoint directory, a path or fsspec URL (default: ``CHECKPOINTS`` in the job's
            directory).
        trainer_kwargs: Extra ``Trainer`` arguments.
        trace_params: Record a digest of every parameter at every step.
        interrupt_at: A fresh attempt stops after the checkpoint at this step is durable, writes ``MARKER`` and
            waits to be killed; ``None``: no interruption.
        sys_path: Import path of the job's processes (default: this process's).
        max_restarts: torchrun's ``--max-restarts``.
        warm_restarts: Run each rank's training as warm-restarted children of the process torchrun started (at most
            this many warm restarts; 0: none, every failure goes to torchrun).
        launch_env: Extra environment variables of the job.
        faults: Faults to inject (:class:`~lightning_scale.testing.FaultInjector`).
        spot_preemption: Add ``SpotPreemption`` with these notice sources.
        divergence_rollback: Add ``DivergenceRollback`` with these arguments.
        cost: Add ``StepClock`` and ``CostTracker``; every rank writes its final bill to ``cost_rank{r}.json``.
        budget: Add ``BudgetedEarlyStopping`` with these arguments (needs ``cost``).
        monitor: Also keep the best checkpoint by this metric.
        wandb_dir: Log to an offline W&B run there.
        stuck_after_s: Dump every thread's stack into the log if no step has started this long after set-up.
        hang_watchdog: Add ``HangWatchdog`` with these arguments.
        data_state: Add ``DataStateCheckpoint`` with these arguments (else ``ResumableCheckpoint`` adds its own).
    """

    model_factory: str
    datamodule_factory: str
    steps: int
    checkpoint_every: int
    devices: int = 2
    num_nodes: int = 1
    seed: int = 0
    strategy: Literal["ddp", "data_parallel", "model_parallel"] = "ddp"
    strategy_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    distributed: bool | None = None
    checkpoint: Literal["resumable", "stock"] = "resumable"
    checkpoint_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    checkpoint_dirpath: str | None = None
    trainer_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    trace_params: bool = True
    interrupt_at: int | None = None
    sys_path: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(p for p in sys.path if p))
    max_restarts: int = 0
    warm_restarts: int = 0
    launch_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    faults: tuple[Fault, ...] = ()
    spot_preemption: CloudNotices | None = None
    divergence_rollback: Mapping[str, Any] | None = None
    cost: CostModel | None = None
    budget: Mapping[str, Any] | None = None
    monitor: str | None = None
    wandb_dir: str | None = None
    stuck_after_s: float = 60.0
    hang_watchdog: Mapping[str, Any] | None = None
    data_state: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.interrupt_at is not None:
            if not 0 < self.interrupt_at < self.steps:
                raise ValueError(
                    f"interrupt_at={self.interrupt_at} must be between 0 and steps={self.steps} (exclusive)."
                )
            if self.interrupt_at % self.checkpoint_every:
                raise ValueError(
                    f"interrupt_at={self.interrupt_at} is not a multiple of checkpoint_every={self.checkpoint_every}: "
                    "no checkpoint is written at that step. Choose interrupt_at as a multiple of checkpoint_every."
                )
        clashes = sorted(set(self.trainer_kwargs) & _RUNNER_TRAINER_ARGS)
        if clashes:
            raise ValueError(f"trainer_kwargs may not set {clashes}: the job runner sets them itself.")
        if self.budget is not None and self.cost is None:
            raise ValueError("budget needs cost: BudgetedEarlyStopping reads the CostTracker's bill.")

    @property
    def uses_strategy(self) -> bool:
        """Whether the job trains with ``strategy`` (else with Lightning's ``"auto"``)."""
        return self.devices * self.num_nodes > 1 if self.distributed is None else self.distributed

    def to_json(self) -> str:
        """The config as JSON, read back by :meth:`from_json`."""
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobConfig:
        """The config that :meth:`to_json` wrote."""
        data = json.loads(text)
        nested = {
            "sys_path": tuple(data["sys_path"]),
            "faults": tuple(Fault(**fault) for fault in data["faults"]),
            "spot_preemption": _optional(CloudNotices, data["spot_preemption"]),
            "cost": _optional(CostModel, data["cost"]),
        }
        return cls(**{**data, **nested})


def _optional(cls: type, fields: dict[str, Any] | None) -> Any:
    return None if fields is None else cls(**fields)


def write_job(out_dir: str | Path, config: JobConfig) -> Path:
    """Create ``out_dir`` (the job's directory: checkpoints, traces, logs) and write ``config.json`` there."""
    path = Path(out_dir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json())
    return path


def read_job(path: str | Path) -> JobConfig:
    """The config of the job file ``path`` (written by :func:`write_job`)."""
    return JobConfig.from_json(Path(path).read_text())
