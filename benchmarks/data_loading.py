"""Data-loading throughput: the loader ``DataStateCheckpoint`` builds from a user's ``DataLoader`` vs that loader.

The user's loader: torch's ``DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)`` over a map-style
dataset whose ``__getitem__`` makes a 3x64x64 image and augments it with torch, NumPy and ``random`` (about 0.3 ms an
item on this CPU). Ours: :func:`lightning_scale.data.make_resumable` of that loader, as a training run gets it: a
``StatefulDataLoader`` with an epoch-seeded sampler, ``WorkerRNGDataset`` (the workers' state, RNG included, sent
every 8 batches) and, for a distributed run (``world_size=2``), workers started from a forkserver instead of forked.
One epoch (workers started, every batch read, workers stopped) is timed per variant per round, both variants in this
process, their order swapped every round. The training process's CPU time per epoch is recorded beside: on 2 cores
its share is what the 2 workers lose, and torchdata's per-batch bookkeeping there is most of the difference. The
ratio is paired per round (plain epoch time / ours: throughput ours / plain); the verdict uses the lower quartile of
the rounds' ratios, so a median that noise lifts cannot pass it. Writes ``benchmarks/results/data_loading.json``.

    .venv/bin/python benchmarks/data_loading.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, meets, paired_ratios, rotated, spread

from lightning_scale.data import make_resumable

TARGET = 0.98  # throughput, ours / plain


class AugmentedImages(Dataset):
    """Images "decoded" from their index (as a dataset reading files holds only their names); each read flips,
    shifts and adds noise, drawing from torch, NumPy and ``random``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(index))
        if random.random() < 0.5:
            image = image.flip(-1)
        shift = int(np.random.randint(-4, 5))
        image = torch.roll(image, shift, dims=-2) + 0.05 * torch.randn_like(image)
        return image, index


def epoch_seconds(loader: DataLoader) -> tuple[float, float]:
    """Wall time of one epoch and the CPU time the training process spent in it."""
    started, cpu = time.perf_counter(), time.process_time()
    for _ in loader:
        pass
    return time.perf_counter() - started, time.process_time() - cpu


def measure(n: int, rounds: int, world_size: int) -> dict:
    dataset = AugmentedImages(n)

    def plain() -> DataLoader:
        return DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)

    ours = make_resumable(plain(), seed=0, world_size=world_size).loader
    plain_loader = plain()
    epoch_seconds(ours), epoch_seconds(plain_loader)  # warm-up: a forkserver starts on first use
    ratios, times, cpu = [], {"plain": [], "ours": []}, {"plain": [], "ours": []}
    for index in range(rounds):
        loaders = {"plain": plain_loader, "ours": ours}
        round_times = {name: epoch_seconds(loaders[name]) for name in rotated(list(loaders), index)}
        for name, (seconds, cpu_seconds) in round_times.items():
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
        ratios.append(round_times["plain"][0] / round_times["ours"][0])
    ratio = paired_ratios(ratios)
    return {
        "world_size": world_size,
        "workers": ours.multiprocessing_context.get_start_method() if ours.multiprocessing_context else "fork",
        "samples_per_s": {name: spread([n / s for s in seconds]) for name, seconds in times.items()},
        "training_process_cpu_s_per_epoch": {name: spread(seconds) for name, seconds in cpu.items()},
        "ours_over_plain_throughput": ratio,
        "holds": meets(ratio, TARGET, at_most=False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small epoch, 3 rounds")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "data_loading.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, rounds = (512, 3) if args.quick else (4096, 12)
    rows = [measure(n, rounds, world_size) for world_size in (1, 2)]
    header = f"{'workers':<11} {'plain samples/s':>16} {'ours samples/s':>15} {'main CPU s, plain/ours':>23}"
    print(f"{header}  ours/plain (lower quartile)")
    for entry in rows:
        ratio = entry["ours_over_plain_throughput"]
        main_cpu = entry["training_process_cpu_s_per_epoch"]
        print(
            f"{entry['workers']:<11} {entry['samples_per_s']['plain']['median']:>16.0f} "
            f"{entry['samples_per_s']['ours']['median']:>15.0f} "
            f"{main_cpu['plain']['median']:>11.3f} / {main_cpu['ours']['median']:.3f}  "
            f"{ratio['median']:>10.3f} ({ratio['lower_quartile']:.3f}) {'holds' if entry['holds'] else 'MISSED'}"
        )
    result = {"machine": machine_info(), "config": {"samples": n, "rounds": rounds}, "target": TARGET, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
