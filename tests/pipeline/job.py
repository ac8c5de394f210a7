"""One training run of StackModel (single process or under torchrun), writing losses and the final full weights.

python -m tests.pipeline.job CONFIG.json     (config: out, steps, strategy kwargs or null, model kwargs, ...;
or several such configs under "runs": tests/jobs.py)
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption
from lightning_scale.strategies import PipelineParallelStrategy
from lightning_scale.testing import Fault, FaultInjector
from tests.jobs import job_configs
from tests.pipeline.stack_model import ListModel, StackModel, TokenModel, loader


class Losses(Callback):
    def __init__(self) -> None:
        self.train: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.train.append(float(loss))


def run(config: dict) -> None:
    out = Path(config["out"])
    pl.seed_everything(0, verbose=False)
    losses = Losses()
    callbacks: list[Callback] = [losses]
    if "checkpoint_every" in config:
        callbacks.append(
            ResumableCheckpoint(str(out.parent / "checkpoints"), every_n_train_steps=config["checkpoint_every"])
        )
    faults = []
    if "crash_at" in config:  # every rank, as a lost machine would
        faults.append(Fault(step=config["crash_at"], kind="crash"))
    if "sigterm_at" in config:  # rank 1, as a spot notice would
        callbacks.append(SpotPreemption())
        faults.append(Fault(step=config["sigterm_at"], rank=1, kind="SIGTERM"))
    if faults:
        callbacks.append(FaultInjector(faults, record_dir=out))
    pipeline = config.get("pipeline")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=config.get("devices", 1),
        strategy=PipelineParallelStrategy(**pipeline) if pipeline is not None else config.get("strategy", "auto"),
        max_steps=config["steps"],
        callbacks=callbacks,
        logger=False,
        enable_checkpointing="checkpoint_every" in config,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=config.get("limit_val_batches", 0),
        val_check_interval=config.get("val_check_interval"),
        accumulate_grad_batches=config.get("accumulate_grad_batches", 1),
        gradient_clip_val=config.get("gradient_clip_val"),
        use_distributed_sampler=config.get("use_distributed_sampler", True),
        precision=config.get("precision", "32-true"),
    )
    with trainer.init_module(empty_init=True) if config.get("meta_init") else nullcontext():
        model_class = TokenModel if config.get("tokens") else ListModel if config.get("module_list") else StackModel
        model = model_class(**config.get("model", {}))
    batch_size = config.get("batch_size", 16)
    tokens = config.get("tokens", False)
    val = loader(batch_size, drop_last=False, n=40, tokens=tokens) if config.get("limit_val_batches") else None
    train = loader(batch_size, drop_last=config.get("drop_last", True), n=config.get("n", 256), tokens=tokens)
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    weights = trainer.strategy.lightning_module_state_dict()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if config.get("predict"):  # forward-only after training, on held-out rows
        weights["predictions"] = torch.cat(trainer.predict(model, loader(batch_size, drop_last=False, n=48)))
    if trainer.global_rank == 0:
        torch.save(weights, out / "weights.pt")
        (out / "result.json").write_text(json.dumps({"train": losses.train, "metrics": metrics}))


if __name__ == "__main__":
    for config in job_configs(sys.argv[1]):
        run(config)
    distributed.destroy_process_group(process_ends=True)  # with the trainer out of scope
