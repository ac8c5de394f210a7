"""Data-loading throughput: the loader ``DataStateCheckpoint`` builds from a user's ``DataLoader`` vs that loader.

The user's loader: torch's ``DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)`` over a map-style
dataset whose ``__getitem__`` makes a 3x64x64 image and augments it with torch, NumPy and ``random`` (about 0.3 ms an
item on this CPU). Ours: :func:`lightning_scale.data.make_resumable` of that loader, as a training run gets it: a
``StatefulDataLoader`` with an epoch-seeded sampler, ``WorkerRNGDataset`` (the workers' state, RNG included, sent
every 8 batches) and, for a distributed run (``world_size=2``), workers started from a forkserver instead of forked.
One epoch (workers started, every batch read, workers stopped) is timed per variant per round, every variant in this
process, their order rotated every round. Where ours picks a forkserver, the user's loader is also timed with that
same forkserver context (and nothing else changed): ours' loss splits into what starting workers from a forkserver
costs and what torchdata's bookkeeping and the workers' RNG snapshots cost. Then the same with
``persistent_workers=True``, where workers start once and not at every epoch. The training process's CPU time per
epoch and the time to the first batch are recorded beside. The ratio is paired per round (plain epoch time / ours:
throughput ours / plain); the verdict uses the lower quartile of the rounds' ratios, so a median that noise lifts
cannot pass it. Writes ``benchmarks/results/data_loading.json``.

    .venv/bin/python -m benchmarks.data_loading [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import machine_info, meets, paired_ratios, rotated, spread
from benchmarks._summary import (
    Row,
    md_table,
    span_of,
    summary_row,
)
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


def epoch_seconds(loader: DataLoader) -> tuple[float, float, float]:
    """Wall time of one epoch, of its first batch, and the CPU time the training process spent in it."""
    started, cpu = time.perf_counter(), time.process_time()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter() - started
    for _ in batches:
        pass
    return time.perf_counter() - started, first, time.process_time() - cpu


def measure(n: int, rounds: int, world_size: int, persistent: bool) -> dict:
    dataset = AugmentedImages(n)

    def plain(**changed: object) -> DataLoader:
        return DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2, persistent_workers=persistent, **changed)

    ours = make_resumable(plain(), seed=0, world_size=world_size).loader
    loaders = {"plain": plain(), "ours": ours}
    if ours.multiprocessing_context is not None:  # the user's loader on ours' forkserver: that choice's own cost
        loaders["plain_forkserver"] = plain(multiprocessing_context=ours.multiprocessing_context)
    for loader in loaders.values():
        epoch_seconds(loader)  # warm-up: a forkserver starts on first use, persistent workers start
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in loaders}
    for index in range(rounds):
        for name in rotated(list(loaders), index):
            times[name].append(epoch_seconds(loaders[name]))
    del loaders  # persistent workers stop

    def throughput_ratio(name: str, over: str) -> dict[str, float]:  # throughput name / over, paired per round
        return paired_ratios([base[0] / mine[0] for base, mine in zip(times[over], times[name], strict=True)])

    ratio = throughput_ratio("ours", "plain")
    entry = {
        "world_size": world_size,
        "workers": ours.multiprocessing_context.get_start_method() if ours.multiprocessing_context else "fork",
        "persistent_workers": persistent,
        "samples_per_s": {name: spread([n / t[0] for t in runs]) for name, runs in times.items()},
        "first_batch_s": {name: spread([t[1] for t in runs]) for name, runs in times.items()},
        "training_process_cpu_s_per_epoch": {name: spread([t[2] for t in runs]) for name, runs in times.items()},
        "ours_over_plain_throughput": ratio,
        "holds": meets(ratio, TARGET, at_most=False),
    }
    if "plain_forkserver" in times:
        entry["plain_forkserver_over_plain_throughput"] = throughput_ratio("plain_forkserver", "plain")
        entry["ours_over_plain_forkserver_throughput"] = throughput_ratio("ours", "plain_forkserver")
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small epoch, 1 round")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "data_loading.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, rounds = (512, 1) if args.quick else (4096, 12)
    rows = [measure(n, rounds, world_size, persistent) for persistent in (False, True) for world_size in (1, 2)]
    header = f"{'workers':<22} {'plain samples/s':>16} {'ours samples/s':>15} {'main CPU s, plain/ours':>23}"
    print(f"{header}  ours/plain (lower quartile)  plain on ours' forkserver / plain")
    for entry in rows:
        ratio = entry["ours_over_plain_throughput"]
        main_cpu = entry["training_process_cpu_s_per_epoch"]
        forkserver = entry.get("plain_forkserver_over_plain_throughput")
        print(
            f"{entry['workers'] + (', persistent' if entry['persistent_workers'] else ''):<22} "
            f"{entry['samples_per_s']['plain']['median']:>16.0f} {entry['samples_per_s']['ours']['median']:>15.0f} "
            f"{main_cpu['plain']['median']:>11.3f} / {main_cpu['ours']['median']:.3f}  "
            f"{ratio['median']:>10.3f} ({ratio['lower_quartile']:.3f}) {'holds' if entry['holds'] else 'MISSED'}"
            + (f"  {forkserver['median']:.3f} ({forkserver['lower_quartile']:.3f})" if forkserver else "")
        )
    result = {"machine": machine_info(), "config": {"samples": n, "rounds": rounds}, "target": TARGET, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    rows = []
    for entry in result["rows"]:
        ratio = entry["ours_over_plain_throughput"]
        workers = entry["workers"] + (" persistent" if entry.get("persistent_workers") else "")
        label = f"data-loading throughput, resumable loader ({workers} workers) / plain DataLoader"
        target = f"≥ {result['target']} (lower quartile {ratio['lower_quartile']:.3f})"
        rows.append(summary_row("data_loading", label, ratio["median"], span_of(ratio), "x", target, entry["holds"]))
        for key, what in (("plain_forkserver_over_plain", "plain DataLoader on the resumable loader's forkserver / "
                           "plain DataLoader"), ("ours_over_plain_forkserver", "resumable loader / plain DataLoader, "
                           "both on that forkserver")):  # fmt: skip
            if f"{key}_throughput" in entry:
                part = entry[f"{key}_throughput"]
                rows.append(summary_row("data_loading", f"data-loading throughput ({workers} workers), {what}",
                                part["median"], span_of(part), "x"))  # fmt: skip
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    rows = []
    for r in result["rows"]:
        rate, first, cpu = r["samples_per_s"], r.get("first_batch_s"), r["training_process_cpu_s_per_epoch"]
        rows.append([
            str(r["world_size"]), r["workers"] + (", persistent" if r.get("persistent_workers") else ""),
            f"{rate['plain']['median']:.0f}",
            f"{rate['plain_forkserver']['median']:.0f}" if "plain_forkserver" in rate else "-",
            f"{rate['ours']['median']:.0f}",
            f"{first['plain']['median'] * 1e3:.0f} / {first['ours']['median'] * 1e3:.0f}" if first else "-",
            f"{cpu['plain']['median']:.2f} / {cpu['ours']['median']:.2f}",
        ])  # fmt: skip
    header = ["processes", "workers", "plain samples/s", "plain on ours' forkserver", "resumable samples/s",
              "ms to the first batch (plain / resumable)",
              "training process CPU s per epoch (plain / resumable)"]  # fmt: skip
    return md_table(header, rows)


if __name__ == "__main__":
    main()
