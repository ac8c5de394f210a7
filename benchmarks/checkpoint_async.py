"""Asynchronous vs synchronous checkpoints: how long training is blocked per save, for 50 and 800 MB states.

Single-process CPU fits of a module whose state (weights + Adam moments) weighs the given size; each step computes
(matrix products) for a fixed wall time, then Adam updates every weight, and a save comes every 20 steps, so the
interval between saves exceeds the time a save takes to become durable. Variants, in the same process, their order
rotated every round: no checkpointing, ``ResumableCheckpoint`` synchronous, and with ``async_save=True``. Reported per
save: the time training waited inside the save (medians, min-max); the time the fit lost against the round's run
without checkpoints (wall-time difference, less the end-of-fit wait for the last save, per save before the end: this
includes the background writer's competition for CPU, memory bandwidth and the GIL); and the time until the
checkpoint was durable. Target: async blocked <= 0.1x sync, by the upper quartile of the per-round ratios (see
``_common.py``). Writes ``benchmarks/results/checkpoint_async.json``.

    .venv/bin/python -m benchmarks.checkpoint_async [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks._common import machine_info, meets, paired_ratios, rotated, spread
from benchmarks._summary import (
    Row,
    bound_text,
    md_ms,
    md_table,
    span_of,
    summary_row,
)
from lightning_scale.callbacks import ResumableCheckpoint

VARIANTS = ("none", "sync", "async")
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.1


class Heavy(pl.LightningModule):
    """``state_mb`` of checkpoint state (fp32 weights + Adam's two moments); each step multiplies a 384x384 slice of
    the weights for ``compute_s`` seconds of wall time, then updates every weight."""

    def __init__(self, state_mb: float, compute_s: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(int(state_mb * 1e6 / 12)) * 0.01)
        self.compute_s = compute_s

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        block = self.weight[: 384 * 384].view(384, 384)
        out, until = batch, time.perf_counter() + self.compute_s
        while True:
            out = torch.tanh(out @ block)
            if time.perf_counter() >= until:
                break
        return out.square().mean() + self.weight.square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> StatefulDataLoader:
        return StatefulDataLoader(torch.randn(10_000, 384), batch_size=64)


class SaveTimer:
    """Wall time spent inside each of the checkpoint callback's saves, in its end-of-fit wait for the save in flight,
    and each save's time to durable (as the callback measures it)."""

    def __init__(self, checkpoint: ResumableCheckpoint) -> None:
        self.blocked: list[float] = []
        self.durable: list[float] = []
        self.final_wait = 0.0
        save, train_end, durable = checkpoint._save_checkpoint, checkpoint.on_train_end, checkpoint._durable

        def timed_save(trainer: pl.Trainer, filepath: str) -> None:
            start = time.perf_counter()
            save(trainer, filepath)
            self.blocked.append(time.perf_counter() - start)

        def timed_train_end(trainer: pl.Trainer, module: pl.LightningModule) -> None:
            start = time.perf_counter()
            train_end(trainer, module)
            self.final_wait += time.perf_counter() - start

        def recorded_durable(seconds: float) -> None:
            self.durable.append(seconds)
            durable(seconds)

        checkpoint._save_checkpoint = timed_save  # type: ignore[method-assign]
        checkpoint.on_train_end = timed_train_end  # type: ignore[method-assign]
        checkpoint._durable = recorded_durable  # type: ignore[method-assign]


def one_fit(variant: str, state_mb: float, steps: int, every: int, compute_s: float, workdir: Path) -> dict[str, float]:
    pl.seed_everything(0, verbose=False)
    model = Heavy(state_mb, compute_s)
    callbacks: list[pl.Callback] = []
    timer = None
    if variant != "none":
        checkpoint = ResumableCheckpoint(
            dirpath=str(workdir), every_n_train_steps=every, keep_last_k=2, async_save=variant == "async"
        )
        timer = SaveTimer(checkpoint)
        callbacks.append(checkpoint)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, callbacks=callbacks, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=variant != "none", default_root_dir=str(workdir),
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(model)
    fit_s = time.perf_counter() - start
    if timer is None:
        return {"fit_s": fit_s, "saves": 0}
    return {
        "fit_s": fit_s,
        "saves": len(timer.blocked),
        "blocked_s": sum(timer.blocked) / len(timer.blocked),
        "blocked_max_s": max(timer.blocked),
        "end_wait_s": timer.final_wait,
        "durable_s": max(timer.durable) if timer.durable else sum(timer.blocked) / len(timer.blocked),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small state, 1 repeat (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "checkpoint_async.json"), help="where to write the JSON")
    args = parser.parse_args()
    sizes, rounds, steps, every, compute_s = ([5], 1, 6, 2, 0.01) if args.quick else ([50, 800], 6, 60, 20, 0.05)
    torch.set_num_threads(1)

    runs: dict[str, dict[str, list[dict[str, float]]]] = {str(s): {v: [] for v in VARIANTS} for s in sizes}
    for size in sizes:
        for index in range(rounds):
            for variant in rotated(VARIANTS, index):
                workdir = Path(tempfile.mkdtemp(prefix=f"ckpt-async-{variant}-"))
                try:
                    runs[str(size)][variant].append(one_fit(variant, size, steps, every, compute_s, workdir))
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)

    table: dict[str, dict[str, object]] = {}
    print(f"checkpoint blocking, {rounds} rounds, {steps} steps, a save every {every} steps, single process, CPU")
    header = f"{'MB':>5} {'variant':<6} {'ms blocked/save':>24} {'ms lost/save':>10} {'s to durable':>12}"
    print(header)
    for size in sizes:
        rows = runs[str(size)]
        entry: dict[str, object] = {}
        for variant in ("sync", "async"):
            blocked = spread([r["blocked_s"] for r in rows[variant]])
            lost = spread([(r["fit_s"] - r["end_wait_s"] - none["fit_s"]) / (r["saves"] - 1)
                           for r, none in zip(rows[variant], rows["none"], strict=True)])  # fmt: skip
            durable = spread([r["durable_s"] for r in rows[variant]])
            entry[variant] = {"blocked_s": blocked, "lost_s": lost, "durable_s": durable}
            print(
                f"{size:>5} {variant:<6} {blocked['median'] * 1e3:9.1f} ({blocked['min'] * 1e3:.1f}-"
                f"{blocked['max'] * 1e3:.1f}) {lost['median'] * 1e3:10.1f} {durable['median']:12.2f}"
            )
        pairs = zip(rows["async"], rows["sync"], strict=True)
        ratio = paired_ratios([mine["blocked_s"] / sync["blocked_s"] for mine, sync in pairs])
        entry["async_over_sync_blocked"] = ratio
        entry["holds"] = meets(ratio, TARGET)
        table[str(size)] = entry
        verdict = "holds" if entry["holds"] else "MISSED"
        print(f"{size:>5} async/sync blocked time, paired: median {ratio['median']:.3f}, upper quartile "
              f"{ratio['upper_quartile']:.3f} (target <= {TARGET}: {verdict})")  # fmt: skip

    out = Path(args.out)
    config = {
        "sizes_mb": sizes,
        "rounds": rounds,
        "steps": steps,
        "every": every,
        "compute_s": compute_s,
        "quick": args.quick,
    }
    out.write_text(json.dumps({"machine": machine_info(), "config": config, "table": table, "runs": runs}, indent=1))
    print(f"wrote {out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    rows = []
    for size, entry in result["table"].items():
        ratio = entry["async_over_sync_blocked"]
        rows.append(summary_row("checkpoint_async", f"blocked time per save, async / sync, {size} MB", ratio["median"],
                        span_of(ratio), "x", bound_text(ratio, 0.1), entry["holds"]))  # fmt: skip
        lost = {variant: entry[variant]["lost_s"]["median"] for variant in ("sync", "async")}
        rows.append(summary_row("checkpoint_async", f"fit time lost per save against no checkpoint, {size} MB, async "
                        f"(sync: {lost['sync']:.3g} s)", lost["async"], None, "s"))  # fmt: skip
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    rows = []
    for size, entry in result["table"].items():
        sync, mine = entry["sync"], entry["async"]
        rows.append([f"{size} MB", md_ms(sync["blocked_s"]), md_ms(mine["blocked_s"]),
                     f"{sync['durable_s']['median']:.2f} / {mine['durable_s']['median']:.2f}",
                     f"{sync['lost_s']['median'] * 1e3:.0f} / {mine['lost_s']['median'] * 1e3:.0f}"])  # fmt: skip
    header = ["state", "sync: ms blocked per save", "async: ms blocked per save", "s until durable (sync / async)",
              "ms of fit lost per save (sync / async)"]  # fmt: skip
    return md_table(header, rows)


if __name__ == "__main__":
    main()
