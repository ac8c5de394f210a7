"""One training attempt of a :class:`~lightning_scale.testing.JobConfig` (``assert_exact_resume``'s, and the test
jobs'), run as ``python -m lightning_scale.testing.runner CONFIG.json`` (under torchrun).

It trains the user's factories on CPU, records what every rank did at every step (batch digest, sample ids, loss,
parameter digests) and the final weights, and — on the first attempt only — blocks right after the checkpoint at
``interrupt_at`` becomes durable, so that the harness can kill the whole job with SIGKILL at a known point.
"""

from __future__ import annotations

import faulthandler
import hashlib
import importlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies import DDPStrategy, Strategy
from typing_extensions import override

from lightning_scale import distributed, knobs
from lightning_scale._python_internals import start_method_of
from lightning_scale._torch_internals import tree_flatten
from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DataStateCheckpoint,
    DivergenceRollback,
    HangWatchdog,
    ResumableCheckpoint,
    SpotPreemption,
)
from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.data.forkserver import start_forkserver_early
from lightning_scale.preemption import (
    AWSSpotNotice,
    AzureScheduledEvents,
    GCPPreemptionNotice,
    NoticeSource,
    SignalNotice,
)
from lightning_scale.restart import supervise, warm_restarts_apply
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy
from lightning_scale.testing.faults import FaultInjector
from lightning_scale.testing.job import CHECKPOINTS, MARKER, CloudNotices, JobConfig, read_job
from lightning_scale.testing.step_clock import StepClock


def _load(spec: str) -> Any:
    module, _, qualname = spec.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) tensor; the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(_local(tensor).detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _batch_digest(batch: Any) -> str:
    digest = hashlib.sha256()
    leaves, _ = tree_flatten(batch)
    for leaf in leaves:
        digest.update(_digest(leaf).encode() if isinstance(leaf, torch.Tensor) else repr(leaf).encode())
    return digest.hexdigest()[:16]


class _Tracer(Callback):
    def __init__(self, out_dir: Path, trace_params: bool) -> None:
        self.out_dir = out_dir
        self.trace_params = trace_params
        self.attempt = 0.0
        self.step_before = 0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.attempt = distributed.broadcast_object(time.time())  # one id for every rank of this attempt

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        self.step_before = trainer.global_step

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        record: dict[str, Any] = {
            "step": trainer.global_step,
            "for_step": self.step_before + 1,  # the optimizer step this batch's gradient goes into
            "attempt": self.attempt,
            "world": trainer.world_size,
            "epoch": trainer.current_epoch,
            "batch": _batch_digest(batch),
            "loss": float(outputs["loss"]).hex() if isinstance(outputs, dict) else None,
        }
        if isinstance(batch, dict) and "sample_id" in batch:
            record["sample_ids"] = batch["sample_id"].tolist()
        if self.trace_params:
            record["params"] = {name: _digest(p) for name, p in pl_module.named_parameters()}
        with open(self.out_dir / f"trace_rank{trainer.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")


class _StackDumpIfStuck(Callback):
    """Diagnosis of a hang at start-up (e.g. a DataLoader worker deadlocked inside ``os.fork()``, see README): if no
    training step has started ``seconds`` after set-up (normally ~10 s), dump every thread of this rank and of its
    forked worker processes (which inherit the SIGUSR2 handler; others would die of it) into the job's log; the job
    goes on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        faulthandler.register(signal.SIGUSR2, all_threads=True)
        threading.Thread(target=self._watch, args=(trainer.global_rank,), daemon=True).start()

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        self.started.set()

    def _watch(self, rank: int) -> None:
        if self.started.wait(self.seconds):
            return
        print(f"STACK DUMP: rank {rank} has not started a step after {self.seconds:.0f} s", file=sys.stderr, flush=True)
        forked = [p for p in multiprocessing.active_children() if start_method_of(p) == "fork"]
        for process in [None, *forked]:
            os.kill(os.getpid() if process is None else process.pid, signal.SIGUSR2)  # type: ignore[arg-type]
            time.sleep(0.5)  # one process at a time in the log


class _BlockAfterCheckpoint(Callback):
    """On a fresh attempt, stop every rank right after the checkpoint at ``step`` is durable and wait to be killed."""

    def __init__(self, step: int, ckpt_dir: str, marker: str, stock: bool) -> None:
        self.step, self.ckpt_dir, self.marker, self.stock = step, ckpt_dir, marker, stock
        self.resumed = False

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.resumed = trainer.global_step > 0

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        if self.resumed or trainer.global_step != self.step:
            return
        if trainer.is_global_zero:
            while not self._durable():
                time.sleep(0.05)
            Path(self.marker).write_text(str(self.step))
        while True:  # the harness sends SIGKILL to the whole process group
            time.sleep(1)

    def _durable(self) -> bool:
        if self.stock:
            return any(name.endswith(".ckpt") and f"step={self.step}" in name for name in os.listdir(self.ckpt_dir))
        manifest, _ = find_newest_valid(CheckpointStore(self.ckpt_dir))
        return manifest is not None and manifest.global_step >= self.step


def _cost_callbacks(config: JobConfig) -> list[Callback]:
    if config.cost is None:
        return []
    stretch = 1.0 + int(os.environ.get("RANK", "0")) * config.cost.rank_stretch  # ranks' clocks disagree
    clock = StepClock(config.cost.seconds_per_step * stretch, config.cost.restart_gap_seconds)
    callbacks: list[Callback] = [clock, CostTracker(price_per_hour=config.cost.price_per_hour, clock=clock.now)]
    if config.budget:
        callbacks.append(BudgetedEarlyStopping(**config.budget))
    return callbacks


def _spot_preemption(notices: CloudNotices) -> SpotPreemption:
    sources: list[NoticeSource] = [SignalNotice(signals=("SIGTERM",), grace_seconds=notices.grace_seconds)]
    for url, cls in (
        (notices.aws_base_url, AWSSpotNotice),
        (notices.gcp_base_url, GCPPreemptionNotice),
        (notices.azure_base_url, AzureScheduledEvents),
    ):
        if url:
            sources.append(cls(base_url=url, poll_interval=0.05))
    return SpotPreemption(sources=sources)


def _checkpoint(config: JobConfig, ckpt_dir: str) -> ModelCheckpoint:
    every = config.checkpoint_every
    if config.checkpoint == "stock":
        return ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1, save_last=True)
    return ResumableCheckpoint(
        dirpath=str(ckpt_dir), every_n_train_steps=every, keep_last_k=None, **config.checkpoint_kwargs
    )


def _callbacks(config: JobConfig, out_dir: Path) -> list[Callback]:
    """Every callback of the job, in order: the clock first, the tracer before the checkpoint."""
    ckpt_dir = config.checkpoint_dirpath or str(out_dir / CHECKPOINTS)
    callbacks: list[Callback] = [
        *_cost_callbacks(config),
        _Tracer(out_dir, config.trace_params),
        _StackDumpIfStuck(config.stuck_after_s),
        _checkpoint(config, ckpt_dir),
    ]
    if config.monitor:
        callbacks.append(ModelCheckpoint(dirpath=out_dir / "best", monitor=config.monitor, save_top_k=1))
    if config.interrupt_at is not None:
        stock = config.checkpoint == "stock"
        callbacks.append(_BlockAfterCheckpoint(config.interrupt_at, ckpt_dir, str(out_dir / MARKER), stock))
    if config.spot_preemption is not None:
        callbacks.append(_spot_preemption(config.spot_preemption))
    if config.divergence_rollback is not None:
        callbacks.append(DivergenceRollback(**config.divergence_rollback))
    if config.faults:
        callbacks.append(FaultInjector(config.faults, record_dir=out_dir))
    if config.hang_watchdog is not None:
        callbacks.append(HangWatchdog(**config.hang_watchdog))
    if config.data_state is not None:
        callbacks.append(DataStateCheckpoint(**config.data_state))
    return callbacks


def _wandb_logger(save_dir: str | None) -> WandbLogger | bool:
    return WandbLogger(save_dir=save_dir, offline=True, project="runner") if save_dir else False


def _strategy(config: JobConfig) -> Strategy | str:
    """``ddp``, ``data_parallel`` or ``model_parallel``; a collective that hangs fails with a traceback instead of
    waiting forever."""
    if not config.uses_strategy:
        return "auto"
    classes = {"ddp": DDPStrategy, "data_parallel": DataParallelStrategy, "model_parallel": ModelParallelStrategy}
    return classes[config.strategy](timeout=timedelta(seconds=knobs.COLLECTIVE_TIMEOUT_S), **config.strategy_kwargs)


def main(config_path: str | Path) -> None:
    """Run the job of ``config_path`` (:func:`~lightning_scale.testing.write_job`) in this process, one rank of it.

    Args:
        config_path: The job file; the job's outputs go to its directory.
    """
    config, out_dir = read_job(config_path), Path(config_path).parent
    sys.path[:0] = [p for p in config.sys_path if p not in sys.path]
    pl.seed_everything(config.seed, verbose=False)
    model = _load(config.model_factory)()
    datamodule = _load(config.datamodule_factory)()
    callbacks = _callbacks(config, out_dir)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=config.devices,
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", config.num_nodes)),  # torchrun's, in an elastic job
        strategy=_strategy(config),
        max_steps=config.steps,
        callbacks=callbacks,
        logger=_wandb_logger(config.wandb_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        **config.trainer_kwargs,
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path="last" if config.checkpoint == "stock" else None)
    weights = {name: _local(tensor).detach().cpu() for name, tensor in trainer.lightning_module.state_dict().items()}
    torch.save(weights, out_dir / f"final_rank{trainer.global_rank}.pt")
    for tracker in (cb for cb in callbacks if isinstance(cb, CostTracker)):
        report = tracker.report(trainer.global_step).metrics()
        (out_dir / f"cost_rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if isinstance(trainer.logger, WandbLogger) and trainer.is_global_zero:
        trainer.logger.experiment.finish()  # Lightning never finishes the run; the run file is complete only then


def _attempt(config_path: str) -> None:
    main(config_path)
    distributed.destroy_process_group(process_ends=True)  # with the trainer out of scope


if __name__ == "__main__":
    warm = read_job(sys.argv[1]).warm_restarts
    if warm_restarts_apply(warm):
        sys.exit(supervise(lambda: _attempt(sys.argv[1]), warm))
    start_forkserver_early()  # as the command does
    _attempt(sys.argv[1])
