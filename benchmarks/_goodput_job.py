"""The job of benchmarks/goodput.py: a user's module and data, the callback that records every step, the stock
Lightning script, and the snapshot-overhead fits.

- ``GoodputMLP`` and ``GoodputData``: plain user code, nothing of lightning-scale: an MLP whose parameters and Adam
  state make ~200 MB of training state (``width=2048, depth=4``), with dropout, trained on points with noise drawn
  in ``__getitem__``, through torch's ``DataLoader(shuffle=True, num_workers=1)``.
- ``StepRecords``: appends one JSON line per event to ``records_rank<r>.jsonl`` in ``out_dir``: ``setup`` (an attempt
  starts training: its process group is up; with the training process's pid), ``loaded`` (a checkpoint or snapshot
  was read and the model's state loaded from it), ``train_start`` (the optimizer's state restored, the model
  wrapped, the training loader's worker started: with the global step it resumes from), ``step`` (an optimizer step
  ended); rank 0 writes its final weights to ``final_rank0.pt`` when the run reaches ``max_steps``.
- ``python _goodput_job.py stock ...`` (under torchrun): the stock Lightning script, ``ModelCheckpoint(
  every_n_train_steps=K, save_last=True)`` and ``trainer.fit(ckpt_path="last")``.
- ``python _goodput_job.py overhead ...`` (under torchrun, one process per node): one fit with every callback of the
  ``lightning-scale`` command's defaults, memory snapshots on (``"auto"``, as the goodput run uses them: on two nodes,
  each snapshot is also copied to the other node) and off in blocks of whole cadences (:class:`SnapshotBlocks`); rank
  0 writes each pair of blocks' mean step times and the cadence ``"auto"`` chose, with its measured costs, to
  ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 64


class NoisyPoints(Dataset):
    """Fixed points and targets; every draw adds fresh noise (the data loader worker's random stream)."""

    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(samples, FEATURES, generator=generator)
        self.y = torch.randn(samples, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.1 * torch.randn(FEATURES), self.y[index]


class GoodputData(pl.LightningDataModule):
    """Shuffled batches of :class:`NoisyPoints` from one worker process."""

    def __init__(self, samples: int = 16384, batch_size: int = 32) -> None:
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(NoisyPoints(self.samples), batch_size=self.batch_size, shuffle=True, num_workers=1)


class GoodputMLP(pl.LightningModule):
    """An MLP of ``depth`` hidden layers of ``width``, with dropout, trained with Adam (state: 12 bytes a weight)."""

    def __init__(self, width: int = 2048, depth: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1)]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class StepRecords(pl.Callback):
    """Appends what each attempt does to ``records_rank<r>.jsonl`` (see the module's description).

    Args:
        out_dir: Where the records and the final weights go.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self._file: Any = None
        self._attempt = 0.0
        self._step = -1

    def _write(self, **record: Any) -> None:
        self._file.write(json.dumps({"t": time.time(), "attempt": self._attempt, **record}) + "\n")
        self._file.flush()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._attempt, self._step = time.time(), -1
        self._file = open(self.out_dir / f"records_rank{trainer.global_rank}.jsonl", "a")  # noqa: SIM115
        self._write(event="setup", pid=os.getpid())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(event="train_start", step=trainer.global_step)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        self._write(event="loaded", step=checkpoint.get("global_step"))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self._step:  # an optimizer step ended
            self._step = trainer.global_step
            self._write(event="step", step=self._step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0 and trainer.max_steps is not None and trainer.global_step >= trainer.max_steps:
            partial = self.out_dir / ".final_rank0.pt.partial"
            torch.save({k: v.detach().clone() for k, v in pl_module.state_dict().items()}, partial)
            partial.rename(self.out_dir / "final_rank0.pt")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _trainer(steps: int, callbacks: list[pl.Callback], devices: int = 1, num_nodes: int | None = None) -> pl.Trainer:
    """A CPU Trainer without logger or progress bar; one process per node under torchrun by default."""
    num_nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1")) if num_nodes is None else num_nodes
    return pl.Trainer(
        accelerator="cpu", devices=devices, num_nodes=num_nodes, max_steps=steps, callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip


def stock(args: argparse.Namespace) -> None:
    """The stock Lightning script: durable checkpoints every ``--every`` steps and ``last.ckpt``, resumed from it."""
    pl.seed_everything(0, verbose=False)
    checkpoint = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True)
    trainer = _trainer(args.steps, [checkpoint, StepRecords(args.out_dir)])
    trainer.fit(GoodputMLP(args.width, args.depth), datamodule=GoodputData(), ckpt_path="last")


class SnapshotBlocks(pl.Callback):
    """Memory snapshots on and off in turn, in blocks of steps, after ``warmup`` steps with them on (``"auto"``: the
    first snapshots and copies allocate their memory, here and on the other node, and the cadence measures its costs);
    ``pairs`` pairs of blocks, the order swapped every pair, then the fit stops. "On" blocks snapshot every ``k``
    steps, ``k`` being what ``"auto"`` chose by the warm-up's end (rank 0's), and a block is as many times ``k`` steps
    as make at least ``min_block``: each "on" block holds the same number of snapshots, those of the cadence
    ``"auto"`` settled on. Each step's time is the time from the end of the step before: it holds the snapshot decided
    at that end, and the switch is made on every rank at the same step, before ``ResumableCheckpoint`` (which
    Lightning runs last) decides.

    Args:
        checkpoint: The fit's ``ResumableCheckpoint``, with ``snapshot_every_n_steps="auto"``.
        warmup: Steps before the first block.
        min_block: The fewest steps of a block.
        pairs: Pairs of blocks.
    """

    def __init__(self, checkpoint: Any, warmup: int, min_block: int, pairs: int) -> None:
        self.cadence = checkpoint.snapshot_cadence
        self.warmup, self.min_block, self.pairs = warmup, min_block, pairs
        self.block: int | None = None
        self.every: int | None = None
        self.ends: list[float] = []
        self.seen = -1

    def mode(self, step_index: int) -> str:
        """``"on"`` or ``"off"`` for the step of index ``step_index`` (0 is the fit's first)."""
        if self.block is None or step_index < self.warmup:
            return "on"
        block = (step_index - self.warmup) // self.block
        first = "on" if (block // 2) % 2 == 0 else "off"
        return first if block % 2 == 0 else ("off" if first == "on" else "on")

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.seen:
            return
        self.seen = trainer.global_step
        self.ends.append(time.perf_counter())
        if len(self.ends) == self.warmup:
            self.every = int(trainer.strategy.broadcast(self.cadence.steps(), src=0))
            self.block = self.every * math.ceil(self.min_block / self.every)
        if self.every is not None:
            self.cadence.every_n_steps = self.every if self.mode(len(self.ends)) == "on" else 10**9
        if self.block is not None and len(self.ends) >= self.warmup + 2 * self.pairs * self.block:
            trainer.should_stop = True

    def results(self) -> list[dict[str, Any]]:
        """Per pair of blocks, each block's mean step time, and the cadence "auto" had (its costs at the end)."""
        assert self.block is not None, "the fit ended before its warm-up did"
        times: dict[tuple[int, str], list[float]] = {}
        for index in range(self.warmup, len(self.ends)):
            block = (index - self.warmup) // self.block
            times.setdefault((block // 2, self.mode(index)), []).append(self.ends[index] - self.ends[index - 1])
        c = self.cadence
        c.every_n_steps = None  # for its measured costs below
        cadence = {"snapshot_every_n_steps": self.every, "snapshot_s": c.snapshot_seconds, "cost_s": c.cost_seconds(),
                   "copy_steps": c.copy_steps, "copying_step_s": c.copying_step_seconds,
                   "quiet_step_s": c.step_seconds}  # fmt: skip
        mean = {key: sum(values) / len(values) for key, values in times.items()}
        pairs = sorted({pair for pair, _ in times})
        return [{"off": {"step_s": mean[p, "off"]}, "on": {"step_s": mean[p, "on"], **cadence}}
                for p in pairs if (p, "off") in mean and (p, "on") in mean]  # fmt: skip


def overhead(args: argparse.Namespace) -> None:
    """One fit with the ``lightning-scale`` command's default callbacks, memory snapshots in blocks on and off
    (:class:`SnapshotBlocks`); rank 0 writes the pairs to ``--out``."""
    from lightning_scale import distributed
    from lightning_scale.callbacks import (
        CostTracker,
        HangWatchdog,
        ResumableCheckpoint,
        SpotPreemption,
        StragglerDetector,
    )
    from lightning_scale.data.forkserver import start_forkserver_early

    start_forkserver_early()  # as the command's ranks do
    pl.seed_everything(0, verbose=False)
    # no durable save inside the timed steps
    checkpoint = ResumableCheckpoint(str(Path(args.out_dir) / "ckpt"), every_n_train_steps=10**9)
    blocks = SnapshotBlocks(checkpoint, args.warmup, args.block, args.pairs)
    defaults = [SpotPreemption(), CostTracker(price_per_hour=1.0), HangWatchdog(), StragglerDetector()]
    trainer = _trainer(10**7, [blocks, checkpoint, *defaults])  # SnapshotBlocks stops it
    trainer.fit(GoodputMLP(args.width, args.depth), datamodule=GoodputData())
    if distributed.rank() == 0:
        Path(args.out).write_text(json.dumps(blocks.results()))
    distributed.destroy_process_group(process_ends=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["stock", "overhead"])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--steps", type=int, help="stock: the steps to train")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--ckpt-dir", help="stock: the checkpoints' folder")
    parser.add_argument("--every", type=int, help="stock: steps between durable checkpoints")
    parser.add_argument("--pairs", type=int, default=1, help="overhead: pairs of blocks, snapshots on and off")
    parser.add_argument("--block", type=int, default=42, help="overhead: the fewest steps of a block")
    parser.add_argument("--warmup", type=int, default=30, help="overhead: steps with snapshots on before the blocks")
    parser.add_argument("--out", help="overhead: the JSON rank 0 writes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    (stock if args.part == "stock" else overhead)(args)


if __name__ == "__main__":
    main()
