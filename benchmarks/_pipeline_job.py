"""One pipeline benchmark job (run by benchmarks/pipeline_throughput.py): median seconds per training step.

python -m benchmarks._pipeline_job single WIDTH STEPS ROUNDS OUT.json
    one process: each round trains STEPS steps with a raw loop on 1 thread, on 2 threads, and with a stock Lightning
    Trainer on 1 thread (its training_step logs the loss, as pipeline_parallel does): Lightning's own cost per step
torchrun --nproc-per-node=2 -m benchmarks._pipeline_job pipeline WIDTH MICROBATCHES STEPS ROUNDS OUT.json
    each round trains STEPS steps with a raw torch.distributed.pipelining loop, STEPS with pipeline_parallel and STEPS
    with pipeline_parallel without Lightning's per-step broadcast of rank 0's SIGTERM flag (``quiet``: as under the
    command, whose SpotPreemption replaces it), in the same processes, the order rotated every round: measured seconds
    apart, which the drift of a shared machine cannot tell apart (separate launches drifted by 10-30 % here)

python -m benchmarks._pipeline_job memory WIDTH OUT.json
    one process, a stock Lightning Trainer on the whole model: its peak memory in a step (``_peak_memory.py``)
torchrun --nproc-per-node=2 -m benchmarks._pipeline_job memory WIDTH MICROBATCHES OUT.json
    pipeline_parallel: each stage's peak memory in a step

Writes the median step of each round per variant: ``{"variant": [seconds, ...]}`` (rank 0's); for ``memory``, each
rank's peak bytes and the bytes of parameters and gradients it holds: ``{"peak": [...], "held": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import rotated
from benchmarks._peak_memory import PeakMemory
from benchmarks._step_times import StepEnds, median_step
from lightning_scale import distributed
from lightning_scale._lightning_internals import skip_sigterm_broadcast
from lightning_scale.strategies import PipelineParallelStrategy

DEPTH, BATCH, WARMUP = 8, 64, 5


def stack(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(DEPTH)])


def data(width: int, steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH * steps, width, generator=generator)
    return DataLoader(TensorDataset(x, torch.randn(BATCH * steps, width, generator=generator)), batch_size=BATCH)


class Model(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.model = stack(width)

    def pipeline_loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)

    def training_step(self, batch, batch_idx):
        loss = self.pipeline_loss_fn(self.model(batch[0]), batch[1])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def single(width: int, steps: int) -> float:
    model, ends = stack(width), []
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for x, y in data(width, steps):
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()  # after the forward, as Lightning's closure does: the freed gradients' memory is reused
        loss.backward()  # at once (zeroing first was ~10 % slower at D=1024 on this machine)
        optimizer.step()
        ends.append(time.perf_counter())
    return median_step(ends, WARMUP)


def raw(width: int, microbatches: int, steps: int) -> float:
    rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    full = stack(width)
    per = DEPTH // size
    module = nn.Sequential(*list(full.children())[rank * per : (rank + 1) * per])
    stage = pipelining.PipelineStage(module, rank, size, torch.device("cpu"))
    schedule = pipelining.Schedule1F1B(stage, microbatches, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    ends = []
    for x, y in data(width, steps):
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == size - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        optimizer.step()
        ends.append(time.perf_counter())
    return median_step(ends, WARMUP)


def lightning(width: int, steps: int, *callbacks: pl.Callback, **trainer: object) -> float:
    """Median step of a stock Lightning Trainer (``trainer``: its devices and strategy) on the benchmark model."""
    times = StepEnds()
    pl.Trainer(
        accelerator="cpu", max_steps=steps, callbacks=[times, *callbacks], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False, **trainer,
    ).fit(Model(width), train_dataloaders=data(width, steps))  # fmt: skip
    return times.median_step_s(WARMUP)


class Held(pl.Callback):
    """The bytes of parameters and gradients this rank holds once training ends (SGD keeps no state)."""

    def __init__(self) -> None:
        self.bytes = 0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.bytes = 2 * sum(p.numel() * p.element_size() for p in pl_module.parameters())


def memory(width: int, microbatches: int | None) -> dict[str, int]:
    peak, held = PeakMemory(), Held()  # the baseline: before the model is built
    if microbatches is None:
        lightning(width, 20, peak, held, devices=1)
    else:
        strategy = PipelineParallelStrategy(schedule="1f1b", n_microbatches=microbatches)
        lightning(width, 20, peak, held, devices=2, strategy=strategy)
    assert peak.peak_bytes is not None
    return {"peak": peak.peak_bytes, "held": held.bytes}


class NoSigtermBroadcast(pl.Callback):
    """Lightning's training loop without its per-step broadcast of rank 0's SIGTERM flag (a collective every step)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        skip_sigterm_broadcast(trainer)


def ours(width: int, microbatches: int, steps: int, *callbacks: pl.Callback) -> float:
    strategy = PipelineParallelStrategy(schedule="1f1b", n_microbatches=microbatches)
    return lightning(width, steps, *callbacks, devices=2, strategy=strategy)


def quiet(width: int, microbatches: int, steps: int) -> float:
    return ours(width, microbatches, steps, NoSigtermBroadcast())


def main() -> None:
    kind, width = sys.argv[1], int(sys.argv[2])
    results: dict[str, list] = {}
    torch.set_num_threads(1)
    if kind == "memory":
        microbatches, out = (int(sys.argv[3]), sys.argv[4]) if len(sys.argv) > 4 else (None, sys.argv[3])
        ranks = distributed.all_gather_object(memory(width, microbatches))
        results = {"peak": [r["peak"] for r in ranks], "held": [r["held"] for r in ranks]}
    elif kind == "single":
        steps, rounds, out = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        for _ in range(rounds):
            for threads, variant in ((1, "single"), (2, "single-2t")):
                torch.set_num_threads(threads)
                results.setdefault(variant, []).append(single(width, steps))
            torch.set_num_threads(1)
            results.setdefault("lightning", []).append(lightning(width, steps, devices=1))
    else:
        microbatches, steps, rounds, out = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        torch.distributed.init_process_group("gloo")
        variants = {"raw": raw, "ours": ours, "quiet": quiet}
        for index in range(rounds):
            for variant in rotated(list(variants), index):  # raw first, then ours first, then quiet first, ...
                results.setdefault(variant, []).append(variants[variant](width, microbatches, steps))
    distributed.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
