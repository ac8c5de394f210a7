"""One 2-process data-parallel benchmark job (run under torchrun by benchmarks/data_parallel_step.py).

python -m benchmarks._data_parallel_job --variants V[,V...] --rounds R --steps S [--d-model D] [--n-layers L]
    [--memory] --out OUT
V: raw (a torch DDP loop), ddp (Lightning's), data_parallel, zero1, zero2, fp16, powersgd, fsdp (lightning-scale's);
peers: torch_zero (torch's ZeroRedundancyOptimizer under Lightning's ddp), lightning_model_parallel (Lightning's
ModelParallelStrategy, ``fully_shard`` on each block and the root in ``configure_model``, as model_parallel does).
Lightning's ``FSDPStrategy`` refuses the CPU accelerator, so it is no peer here.

Timing: ``R`` rounds of one fit per variant in the same processes and process group, the order rotated every round;
writes each round's median seconds per step (rank 0's), and from the first round the bytes each rank holds for
training (from tensor sizes) and the all-reduced payload bytes. ``--memory``: one fit of one variant (a fresh pair of
processes: a process's resident peak is its own) whose peak over the steady steps each rank measures
(``_peak_memory.py``), next to the bytes it holds by construction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from benchmarks._common import rotated
from benchmarks._peak_memory import PeakMemory
from benchmarks._step_times import StepEnds, median_step
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.parallel.data import training_state_bytes
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy

WARMUP = 10
POWERSGD = {"grad_compression": "powersgd", "powersgd_rank": 2, "powersgd_warmup_steps": 2}
VARIANTS: dict[str, dict[str, Any]] = {
    "data_parallel": {},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "fp16": {"grad_compression": "fp16"},
    "powersgd": POWERSGD,
}


def payload_bytes(variant: str, model: torch.nn.Module, strategy: Any) -> float:
    """Bytes each rank all-reduces per step: fp32 gradients, half of that in fp16, PowerSGD's measured ratio (FSDP2
    all-gathers parameters and reduce-scatters gradients instead: not comparable, reported as 0)."""
    if variant in ("fsdp", "lightning_model_parallel"):
        return 0.0
    full = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4
    if variant == "fp16":
        return full / 2
    if variant == "powersgd":  # after warm-up; torch counts the elements it compressed and sent
        state = strategy._hook.state
        return full * state.total_numel_after_compression / max(1, state.total_numel_before_compression)
    return float(full)


class ZeroRedundancyTransformer(CharTransformer):
    """The example with torch's ``ZeroRedundancyOptimizer`` around its AdamW, as a ``ddp`` user shards the state."""

    def configure_optimizers(self) -> Any:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        config = super().configure_optimizers()
        zero = ZeroRedundancyOptimizer(self.parameters(), optimizer_class=torch.optim.AdamW, lr=self.hparams.lr)
        config["optimizer"] = config["lr_scheduler"]["scheduler"].optimizer = zero
        return config


class FullyShardedTransformer(CharTransformer):
    """The example sharded by its user for Lightning's ``ModelParallelStrategy``: ``fully_shard`` on each entry of its
    ``ModuleList`` (embedding, blocks, head), then the root: the units ``model_parallel`` picks by itself here."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for unit in self.model:
            fully_shard(unit, mesh=mesh)
        fully_shard(self, mesh=mesh)


def strategy_of(variant: str) -> Any:
    if variant == "fsdp":  # model_parallel: FSDP2 on each transformer block and the root
        return ModelParallelStrategy(min_params_to_shard=1000)
    if variant == "lightning_model_parallel":
        from lightning.pytorch.strategies import ModelParallelStrategy as LightningModelParallel

        # Lightning's default gives every process to tensor parallelism; data parallel over both, as FSDP2
        return LightningModelParallel(data_parallel_size=2, tensor_parallel_size=1)
    return DDPStrategy() if variant in ("ddp", "torch_zero") else DataParallelStrategy(**VARIANTS[variant])


def reduction_buffer_bytes(variant: str, model: torch.nn.Module, strategy: Any) -> int:
    """Bytes a rank keeps for gradient reductions besides the gradients: DDP's buckets hold a copy of every gradient
    (``gradient_as_bucket_view=False``, Lightning's default), ZeRO-1 its persistent reduce-scatter buffers, ZeRO-2 and
    FSDP none between steps."""
    if variant in ("ddp", "torch_zero", "data_parallel", "fp16", "powersgd"):
        return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if variant == "zero1":
        return sum(
            b.buffer.numel() * b.buffer.element_size()
            for z in strategy._zero
            for b in z.buckets
            if b.buffer is not None
        )
    return 0


def lightning_run(variant: str, steps: int, d_model: int, n_layers: int, memory: bool) -> dict[str, Any]:
    ends = StepEnds()
    strategy = strategy_of(variant)
    peak = PeakMemory() if memory else None
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=steps, callbacks=[ends, *([peak] if peak else [])],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    cls = {"torch_zero": ZeroRedundancyTransformer, "lightning_model_parallel": FullyShardedTransformer}
    with trainer.init_module(empty_init=memory):  # memory: built on the meta device, sharded ones allocate shards only
        model = cls.get(variant, CharTransformer)(d_model=d_model, n_layers=n_layers, dropout=0.0)
    trainer.fit(model, datamodule=CharDataModule(batch_size=8))
    return {
        "step_s": ends.median_step_s(WARMUP) if not memory else None,
        "memory": {
            **training_state_bytes(model, trainer.optimizers),
            "buffers": reduction_buffer_bytes(variant, model, strategy),
        },
        "payload_bytes": payload_bytes(variant, model, strategy),
        "peak_bytes": peak.peak_bytes if peak else None,
        "rest_bytes": peak.rest_bytes if peak else None,
        "zero_ms": strategy.shardings[0].breakdown_ms_per_step() if variant in ("zero1", "zero2") else None,
    }


def raw_run(steps: int) -> dict[str, Any]:
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    data = CharDataModule(batch_size=8)
    data.setup("fit")
    model = CharTransformer(dropout=0.0)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=model.hparams.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    ends: list[float] = []
    loader = data.train_dataloader()
    epoch, batches = 0, iter(loader)
    for _ in range(steps):
        batch = next(batches, None)
        if batch is None:  # a new epoch, as Lightning's loop would start it
            epoch += 1
            loader.sampler.set_epoch(epoch)
            batches = iter(loader)
            batch = next(batches)
        logits = ddp(batch["x"])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["y"].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        ends.append(time.perf_counter())
    memory = {**training_state_bytes(model, [optimizer]), "buffers": reduction_buffer_bytes("ddp", model, None)}
    return {"step_s": median_step(ends, WARMUP), "memory": memory, "payload_bytes": payload_bytes("raw", model, None),
            "peak_bytes": None, "rest_bytes": None, "zero_ms": None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", required=True, help="comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--n-layers", type=int, default=2, help="transformer blocks (the example's 2 by default)")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants = args.variants.split(",")
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    for index in range(args.rounds):
        for variant in rotated(variants, index):
            pl.seed_everything(0, verbose=False)
            if variant == "raw":
                result = raw_run(args.steps)
            else:
                result = lightning_run(variant, args.steps, args.d_model, args.n_layers, args.memory)
            ranks = distributed.all_gather_object(result)
            entry = results.setdefault(variant, {"step_s": [], "memory": [r["memory"] for r in ranks],
                                                 "payload_bytes": ranks[0]["payload_bytes"],
                                                 "peak_bytes": [r["peak_bytes"] for r in ranks],
                                                 "rest_bytes": [r["rest_bytes"] for r in ranks],
                                                 "zero_ms": []})  # fmt: skip
            entry["step_s"].append(ranks[0]["step_s"])
            entry["zero_ms"].append(ranks[0]["zero_ms"])
    if distributed.rank() == 0:
        Path(args.out).write_text(json.dumps(results))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
