"""One training attempt for :func:`lightning_scale.testing.assert_exact_resume`, run as ``python -m`` (torchrun).

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
import subprocess
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
from lightning_scale._torch_internals import tree_flatten
from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DivergenceRollback,
    ResumableCheckpoint,
    SpotPreemption,
)
from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.preemption import AWSSpotNotice, AzureScheduledEvents, GCPPreemptionNotice, SignalNotice
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy
from lightning_scale.testing.processes import descendants
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

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        record: dict[str, Any] = {
            "step": trainer.global_step,
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
        forked = [p for p in multiprocessing.active_children() if _start_method(p) == "fork"]
        for process in [None, *forked]:
            os.kill(os.getpid() if process is None else process.pid, signal.SIGUSR2)  # type: ignore[arg-type]
            time.sleep(0.5)  # one process at a time in the log


def _start_method(process: multiprocessing.process.BaseProcess) -> str:
    return getattr(process, "_start_method", None) or multiprocessing.get_start_method()


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


class _Faults(Callback):
    """Send signals to this process at given steps: ``{"restart", "step", "rank", "signal", "val_batch", "job"}``.

    ``restart`` is torchrun's restart count of the attempt the fault belongs to (0 = the first attempt);
    ``val_batch``, when given, sends it at that batch of the validation that runs after ``step``; with ``"job":
    true`` another process sends it to this rank and every process below it (its DataLoader workers), as SLURM
    signals every process of a job step.
    """

    def __init__(self, faults: list[dict[str, Any]]) -> None:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.faults = [f for f in faults if f.get("restart", 0) == restart]

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        self._maybe_signal(trainer, None)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx, *_
    ) -> None:
        if not trainer.sanity_checking:
            self._maybe_signal(trainer, batch_idx)

    def _maybe_signal(self, trainer: pl.Trainer, val_batch: int | None) -> None:
        for fault in self.faults:
            if (
                trainer.global_step == fault["step"]
                and trainer.global_rank == fault["rank"]
                and fault.get("val_batch") == val_batch
            ):
                if not fault.get("job"):
                    os.kill(os.getpid(), signal.Signals[fault["signal"]])
                    continue
                targets = [os.getpid(), *descendants(os.getpid())]
                kill = f"import os; [os.kill(pid, {int(signal.Signals[fault['signal']])}) for pid in {targets!r}]"
                subprocess.run([sys.executable, "-c", kill], check=True)


def _cost_callbacks(config: dict[str, Any]) -> list[Callback]:
    """``cost``: ``{"price_per_hour", "seconds_per_step", "restart_gap_seconds", "rank_stretch"}`` (rank r's
    steps take ``1 + r * rank_stretch`` times as long); ``budget``:
    BudgetedEarlyStopping arguments."""
    if config.get("cost") is None:
        return []
    cost = config["cost"]
    stretch = 1.0 + int(os.environ.get("RANK", "0")) * cost.get("rank_stretch", 0.0)  # ranks' clocks disagree
    clock = StepClock(cost["seconds_per_step"] * stretch, cost["restart_gap_seconds"])
    callbacks: list[Callback] = [clock, CostTracker(price_per_hour=cost["price_per_hour"], clock=clock.now)]
    if config.get("budget"):
        callbacks.append(BudgetedEarlyStopping(**config["budget"]))
    return callbacks


def _wandb_logger(save_dir: str | None) -> WandbLogger | bool:
    return WandbLogger(save_dir=save_dir, offline=True, project="runner") if save_dir else False


def _strategy(name: str, kwargs: dict[str, Any]) -> Strategy:
    """``ddp``, ``data_parallel`` or ``model_parallel``; a collective that hangs fails with a traceback instead of
    waiting forever."""
    classes = {"ddp": DDPStrategy, "data_parallel": DataParallelStrategy, "model_parallel": ModelParallelStrategy}
    return classes[name](timeout=timedelta(seconds=knobs.COLLECTIVE_TIMEOUT_S), **kwargs)


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    sys.path[:0] = [p for p in config["sys_path"] if p not in sys.path]
    out_dir = Path(config["out_dir"])
    stock = config["checkpoint"] == "stock"
    pl.seed_everything(config["seed"], verbose=False)
    model = _load(config["model_factory"])()
    datamodule = _load(config["datamodule_factory"])()

    every = config["checkpoint_every"]
    checkpoint: ModelCheckpoint
    if stock:
        checkpoint = ModelCheckpoint(
            dirpath=config["ckpt_dir"], every_n_train_steps=every, save_top_k=-1, save_last=True
        )
    else:
        checkpoint = ResumableCheckpoint(
            dirpath=config["ckpt_dir"],
            every_n_train_steps=every,
            keep_last_k=None,
            **config.get("checkpoint_kwargs", {}),
        )
    tracer, watchdog = _Tracer(out_dir, config["trace_params"]), _StackDumpIfStuck(config.get("stuck_after_s", 60.0))
    callbacks: list[Callback] = [*_cost_callbacks(config), tracer, watchdog, checkpoint]
    if config.get("monitor"):
        callbacks.append(ModelCheckpoint(dirpath=out_dir / "best", monitor=config["monitor"], save_top_k=1))
    if config["interrupt_at"] is not None:
        callbacks.append(_BlockAfterCheckpoint(config["interrupt_at"], config["ckpt_dir"], config["marker"], stock))
    if config.get("spot_preemption") is not None:
        grace = config["spot_preemption"].get("grace_seconds", 25.0)
        sources: list = [SignalNotice(signals=("SIGTERM",), grace_seconds=grace)]
        for kind, cls in (("aws", AWSSpotNotice), ("gcp", GCPPreemptionNotice), ("azure", AzureScheduledEvents)):
            if url := config["spot_preemption"].get(f"{kind}_base_url"):
                sources.append(cls(base_url=url, poll_interval=0.05))
        callbacks.append(SpotPreemption(sources=sources))
    if config.get("divergence_rollback") is not None:
        callbacks.append(DivergenceRollback(**config["divergence_rollback"]))
    if config.get("faults"):
        callbacks.append(_Faults(config["faults"]))

    devices = config["devices"]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=config.get("num_nodes", 1),
        strategy=_strategy(config.get("strategy", "ddp"), config.get("strategy_kwargs", {}))
        if config.get("distributed", devices > 1)
        else "auto",
        max_steps=config["steps"],
        callbacks=callbacks,
        logger=_wandb_logger(config.get("wandb_dir")),
        enable_progress_bar=False,
        enable_model_summary=False,
        **config["trainer_kwargs"],
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path="last" if stock else None)
    weights = {name: _local(tensor).detach().cpu() for name, tensor in trainer.lightning_module.state_dict().items()}
    torch.save(weights, out_dir / f"final_rank{trainer.global_rank}.pt")
    for tracker in (cb for cb in trainer.callbacks if isinstance(cb, CostTracker)):
        report = tracker.report(trainer.global_step).metrics()
        (out_dir / f"cost_rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if isinstance(trainer.logger, WandbLogger) and trainer.is_global_zero:
        trainer.logger.experiment.finish()  # Lightning never finishes the run; the run file is complete only then


if __name__ == "__main__":
    main(sys.argv[1])
    distributed.destroy_process_group(process_ends=True)  # with the trainer out of scope
