"""One training run of the example transformer under ``ddp``, ``data_parallel`` or ``model_parallel``.

python -m tests.parallel.job CONFIG.json     (or several such configs under "runs": tests/jobs.py)
(config: out, steps, devices, strategy, strategy_kwargs, accumulate, clip, count_allreduce, save_to, resume_from,
contract: after fit, the strategy's collectives and a ``validate`` on the same Trainer, as Lightning's contract says)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.nn.parallel import DistributedDataParallel

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.parallel.data import training_state_bytes
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy
from tests.jobs import job_configs


class Model(CharTransformer):
    """The example with a learning rate that changes every 3 steps (the scheduler must follow a sharded optimizer)."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Record(Callback):
    """Per batch: the loss and how many all-reduce calls DDP made (when counting); the restored optimizer state."""

    def __init__(self, count_allreduce: bool) -> None:
        self.count_allreduce, self.calls = count_allreduce, 0
        self.losses: list[float] = []
        self.allreduce_calls: list[int] = []
        self.restored_state_sum: float | None = None
        self.restore: Any = None
        self.memory: list[dict[str, int]] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.count_allreduce and isinstance(trainer.strategy.model, DistributedDataParallel):

            def counting(state, bucket):  # no annotations: DDP checks them, and they are strings here
                self.calls += 1
                return default_hooks.allreduce_hook(state, bucket)

            trainer.strategy.model.register_comm_hook(None, counting)
        elif self.count_allreduce:  # ZeRO: its reduce-scatter calls
            start = distributed.reduce_scatter_start

            def counting_reductions(*args: Any) -> Any:
                self.calls += 1
                return start(*args)

            distributed.reduce_scatter_start = counting_reductions  # type: ignore[assignment]
            self.restore = start
        optimizer = trainer.optimizers[0]  # ZeRO: over this rank's chunks
        tensors = [t for per in optimizer.state.values() for name, t in per.items() if name != "step"]
        full = [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]  # model_parallel: DTensors
        self.restored_state_sum = float(sum(t.double().sum() for t in full))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        if trainer.global_step == trainer.max_steps - 1:  # the last step: reduced gradients and optimizer state held
            self.memory = distributed.all_gather_object(training_state_bytes(pl_module, trainer.optimizers))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.restore is not None:
            distributed.reduce_scatter_start = self.restore  # type: ignore[assignment]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        self.allreduce_calls.append(self.calls)


def run(config: dict) -> None:
    out = Path(config["out"])
    pl.seed_everything(0, verbose=False)
    record = Record(config.get("count_allreduce", False))
    kwargs = config.get("strategy_kwargs", {})
    strategies = {"ddp": DDPStrategy, "data_parallel": DataParallelStrategy, "model_parallel": ModelParallelStrategy}
    strategy = strategies[config["strategy"]](**kwargs)
    trainer = pl.Trainer(
        accelerator="cpu", devices=config["devices"], strategy=strategy, max_steps=config["steps"],
        callbacks=[record], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        accumulate_grad_batches=config.get("accumulate", 1), gradient_clip_val=config.get("clip"),
    )  # fmt: skip
    if config.get("user_configure_model"):
        from tests.parallel.models import UserShardedModel

        model: Model = UserShardedModel(dropout=0.0)
    elif config.get("linear_attention"):
        from tests.parallel.models import LinearAttentionModel

        model = LinearAttentionModel(dropout=0.0)
    else:
        model = Model(dropout=0.0)
    data = CharDataModule(batch_size=8)
    trainer.fit(model, datamodule=data, ckpt_path=config.get("resume_from"))
    if config.get("save_to"):
        trainer.save_checkpoint(config["save_to"])
    contract = inherited_contract(trainer, model, data) if config.get("contract") else None
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.global_rank == 0:
        torch.save(weights, out / "weights.pt")
        result = {"losses": record.losses, "allreduce_calls": record.allreduce_calls, "memory": record.memory,
                  "restored_state_sum": record.restored_state_sum, "contract": contract}  # fmt: skip
        (out / "result.json").write_text(json.dumps(result))


def inherited_contract(trainer: pl.Trainer, model: pl.LightningModule, data: pl.LightningDataModule) -> dict:
    """What a strategy promises as a Lightning ``Strategy``, seen from rank 0: collectives and ``validate``."""
    strategy, rank = trainer.strategy, trainer.global_rank
    trainer.limit_val_batches = 2
    return {
        "broadcast": strategy.broadcast(f"from rank {rank}"),
        "reduce_sum": float(strategy.reduce(torch.tensor(rank + 1.0), reduce_op="sum")),
        "reduce_mean": float(strategy.reduce(torch.tensor(rank + 1.0))),
        "all_gather": strategy.all_gather(torch.tensor([rank])).flatten().tolist(),
        "any_rank": strategy.reduce_boolean_decision(rank == 1, all=False),
        "every_rank": strategy.reduce_boolean_decision(rank == 1, all=True),
        "validate": trainer.validate(model, datamodule=data, verbose=False),
    }


if __name__ == "__main__":
    for config in job_configs(sys.argv[1]):
        run(config)
    distributed.destroy_process_group(process_ends=True)  # with the trainer out of scope
