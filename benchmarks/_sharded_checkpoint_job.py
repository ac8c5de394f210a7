"""One 2-process job of benchmarks/sharded_checkpoint.py (run under torchrun, gloo, CPU): sharded checkpoints of one
Trainer, several ``ResumableCheckpoint`` variants saved at the same steps in alternating order.

python -m benchmarks._sharded_checkpoint_job --part model_parallel|zero1 --width W --layers L --rounds R --out OUT.json
    --dir LABEL=DIRPATH [--dir ...]

``model_parallel``: FSDP2 over a stack of ``L`` Linear(W, W) layers; per directory a synchronous and an
``async_save=True`` callback. ``zero1``: ``data_parallel`` with ``zero_stage=1``; per directory each rank saving its
own share (``sharded=True``) and one file consolidated on rank 0 (``sharded=False``). Each callback's own triggers never
fire: at every ``EVERY`` steps a round saves with each of them, after a warm-up round, in the order listed on even
rounds and reversed on odd ones (ABBA). Per save: what training waited (the slowest rank), the time until durable, and
rank 0's resident memory (sampled every 2 ms from a thread, through the background write too) against the RSS just
before the save. Rank 0 writes them as JSON, with the bytes of rank 0's shard and of the full state.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import lightning.pytorch as pl
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.parallel.data import training_state_bytes
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy

EVERY = 2  # training steps between rounds
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "model_parallel": {"sync": {}, "async": {"async_save": True}},
    "zero1": {"per_rank": {"sharded": True}, "consolidated": {"sharded": False}},
}


class Stack(pl.LightningModule):
    """``layers`` Linear(width, width) layers in an ``nn.ModuleList`` (FSDP2 shards each), trained with Adam: 12 bytes
    of checkpoint state per parameter (fp32 weights and two moments)."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))
        self.width = width

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        out = batch
        for block in self.blocks:
            out = torch.tanh(block(out))
        return out.square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> StatefulDataLoader:
        return StatefulDataLoader(torch.randn(2048, self.width), batch_size=16)


class RssPeak:
    """The resident set size of this process (``/proc/self/statm``), sampled every ``interval_s`` on a thread
    between :meth:`start` and :meth:`stop`."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.before = self.peak = 0

    def rss(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page

    def start(self) -> None:
        self.before = self.peak = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.rss())

    def stop(self) -> dict[str, int]:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        after = self.rss()
        self.peak = max(self.peak, after)
        return {
            "rss_before": self.before,
            "peak_increase": self.peak - self.before,
            "after_increase": after - self.before,
        }


def state_bytes(module: nn.Module, trainer: pl.Trainer) -> dict[str, Any]:
    """Bytes of checkpoint state (weights and optimizer state, no gradients): rank 0's own, and the full state
    (every weight once, at its full shape, plus every rank's optimizer state); call on every rank."""
    mine = training_state_bytes(module, trainer.optimizers)
    ranks = distributed.all_gather_object(mine)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())  # a DTensor's numel is its full size
    return {
        "own_shard": ranks[0]["parameters"] + ranks[0]["optimizer"],
        "full_state": weights + sum(r["optimizer"] for r in ranks),
        "by_rank": ranks,
    }


def storage_bytes(url: str) -> int:
    fs, path = fsspec.core.url_to_fs(url)
    return int(fs.du(path))


class Rounds(pl.Callback):
    """Every ``EVERY`` steps, one round: a save with each checkpoint callback in turn (the order alternates between
    rounds), each waited for (background write included) before the next; round 0 is a warm-up."""

    def __init__(self, checkpoints: dict[tuple[str, str], ResumableCheckpoint], rounds: int, part: str) -> None:
        self.checkpoints = checkpoints
        self.rounds = rounds
        self.part = part
        self.is_rank_zero = False
        self.sampler: RssPeak | None = None
        self.saves: list[dict[str, Any]] = []
        self.bytes: dict[str, Any] = {}
        self.checkpoint_bytes: dict[str, int] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.is_rank_zero = trainer.is_global_zero
        self.sampler = RssPeak() if self.is_rank_zero else None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        number = trainer.global_step // EVERY - 1
        if trainer.global_step % EVERY or not 0 <= number <= self.rounds:
            return
        if not self.bytes:
            self.bytes = state_bytes(pl_module, trainer)
            share = self.bytes["own_shard"] / self.bytes["full_state"]
            if self.part == "model_parallel" and not 0.45 <= share <= 0.55:
                raise RuntimeError(f"rank 0 holds {share:.2f} of the state: FSDP2 did not shard it in halves")
        order = list(self.checkpoints) if number % 2 == 0 else list(reversed(self.checkpoints))
        for storage, variant in order:
            save = self.measure(trainer, self.checkpoints[storage, variant])
            self.saves.append({"round": number, "warmup": number == 0, "storage": storage, "variant": variant, **save})
            if number == 0 and self.is_rank_zero:
                self.checkpoint_bytes[f"{storage}/{variant}"] = storage_bytes(save["filepath"])

    def measure(self, trainer: pl.Trainer, checkpoint: ResumableCheckpoint) -> dict[str, Any]:
        filepath = checkpoint._get_metric_interpolated_filepath_name(checkpoint._monitor_candidates(trainer), trainer)
        checkpoint.last_save_seconds = None
        distributed.barrier()  # every rank starts the save together
        if self.sampler is not None:
            self.sampler.start()
        started = time.perf_counter()
        checkpoint._save_checkpoint(trainer, filepath)
        blocked = time.perf_counter() - started
        checkpoint._saving.forget_staged()  # as after any save of a step (see ResumableCheckpoint.save_now)
        checkpoint._saving.finish()  # the background write, outside the timed part: saves never overlap
        memory = self.sampler.stop() if self.sampler is not None else {}
        if checkpoint.failed_saves:
            raise RuntimeError(f"a background save to {filepath} failed (see the warning above)")
        ranks = distributed.all_gather_object((blocked, checkpoint.last_save_seconds))
        return {
            "filepath": filepath,
            "blocked_s": max(b for b, _ in ranks),
            "blocked_by_rank_s": [b for b, _ in ranks],
            "durable_s": max(d for _, d in ranks if d is not None),
            **memory,
        }


def strategy_for(part: str) -> Any:
    if part == "model_parallel":
        return ModelParallelStrategy()  # FSDP2 on each block of the ModuleList, then the root
    return DataParallelStrategy(zero_stage=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dir", action="append", required=True, help="LABEL=DIRPATH, one per storage")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    checkpoints = {}
    for storage, dirpath in (entry.split("=", 1) for entry in args.dir):
        for variant, kwargs in VARIANTS[args.part].items():
            checkpoints[storage, variant] = ResumableCheckpoint(
                dirpath=f"{dirpath.rstrip('/')}/{variant}", every_n_train_steps=10**6 + len(checkpoints),
                keep_last_k=1, auto_resume=False, **kwargs,
            )  # fmt: skip  # distinct every_n_train_steps: Lightning refuses callbacks with equal state keys
    rounds = Rounds(checkpoints, args.rounds, args.part)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy_for(args.part), max_steps=EVERY * (args.rounds + 1) + 1,
        callbacks=[*checkpoints.values(), rounds], logger=False, limit_val_batches=0, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Stack(args.width, args.layers))
    if len(rounds.saves) != (args.rounds + 1) * len(checkpoints):
        raise RuntimeError(f"{len(rounds.saves)} saves for {args.rounds + 1} rounds of {len(checkpoints)} variants")
    if distributed.rank() == 0:
        result = {"bytes": rounds.bytes, "checkpoint_bytes": rounds.checkpoint_bytes, "saves": rounds.saves}
        Path(args.out).write_text(json.dumps(result, indent=1))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
