"""Checkpoint cost: ResumableCheckpoint vs stock ModelCheckpoint vs no checkpointing, measured in one run.

Single-process CPU fits of the example model (widened so a checkpoint weighs tens of MB). The three variants run in
the same process, their order rotated every round (see ``_common.py``); the table shows medians (min-max) of the time
per training step and of the time training is blocked per checkpoint save, and the ratio ours/stock of each round's
blocked time, paired. Writes ``benchmarks/results/checkpoint_cost.json``.

    .venv/bin/python -m benchmarks.checkpoint_cost [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from benchmarks._common import machine_info, paired_ratios, rotated, spread
from benchmarks._summary import (
    Row,
    md_ms,
    md_table,
    span_of,
    summary_row,
)
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import ResumableCheckpoint

VARIANTS = ("none", "stock", "ours")
RESULTS = Path(__file__).resolve().parent / "results"


def timed_saves(callback: ModelCheckpoint, durations: list[float]) -> None:
    original = callback._save_checkpoint

    def save(trainer: pl.Trainer, filepath: str) -> None:
        start = time.perf_counter()
        original(trainer, filepath)
        durations.append(time.perf_counter() - start)

    callback._save_checkpoint = save  # type: ignore[method-assign]


def one_fit(variant: str, steps: int, every: int, d_model: int, workdir: Path) -> dict[str, float]:
    pl.seed_everything(0, verbose=False)
    model = CharTransformer(vocab_size=64, d_model=d_model, n_heads=4, n_layers=4)
    saves: list[float] = []
    callbacks: list[pl.Callback] = []
    if variant == "stock":
        callbacks.append(ModelCheckpoint(dirpath=workdir, every_n_train_steps=every, save_top_k=-1))
    elif variant == "ours":
        callbacks.append(ResumableCheckpoint(dirpath=str(workdir), every_n_train_steps=every, keep_last_k=None))
    for callback in callbacks:
        timed_saves(callback, saves)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, callbacks=callbacks, logger=False, limit_val_batches=0,
        enable_checkpointing=variant != "none", enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(workdir),
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(model, datamodule=CharDataModule(batch_size=8))
    total = time.perf_counter() - start
    size = sum(f.stat().st_size for f in workdir.glob("*.ckpt")) / max(1, len(list(workdir.glob("*.ckpt"))))
    return {"step_s": total / steps, "save_s": statistics.median(saves) if saves else 0.0, "ckpt_mb": size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "checkpoint_cost.json"), help="where to write the JSON")
    args = parser.parse_args()
    repeats, steps, every, d_model = (1, 10, 5, 128) if args.quick else (6, 40, 10, 512)
    torch.set_num_threads(1)

    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for index in range(repeats):
        for variant in rotated(VARIANTS, index):
            workdir = Path(tempfile.mkdtemp(prefix=f"ckpt-bench-{variant}-"))
            try:
                results[variant].append(one_fit(variant, steps, every, d_model, workdir))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    table = {v: {k: spread([r[k] for r in results[v]]) for k in ("step_s", "save_s", "ckpt_mb")} for v in VARIANTS}
    ratio = paired_ratios([o["save_s"] / s["save_s"] for o, s in zip(results["ours"], results["stock"], strict=True)])
    print(f"checkpoint cost, {repeats} repeats, {steps} steps, a save every {every} steps, d_model={d_model}")
    print(f"{'variant':<8} {'ms/step':>22} {'ms blocked/save':>24} {'MB/ckpt':>8}")
    for variant in VARIANTS:
        row = table[variant]
        step, save = row["step_s"], row["save_s"]
        print(
            f"{variant:<8} {step['median'] * 1e3:9.1f} ({step['min'] * 1e3:.1f}-{step['max'] * 1e3:.1f})"
            f" {save['median'] * 1e3:11.1f} ({save['min'] * 1e3:.1f}-{save['max'] * 1e3:.1f})"
            f" {row['ckpt_mb']['median']:8.1f}"
        )
    print(f"ours/stock blocked time per save, paired: median {ratio['median']:.2f} ({ratio['min']:.2f}-"
          f"{ratio['max']:.2f}; atomic rename, fsync, sha256 read-back, manifest)")  # fmt: skip

    out = Path(args.out)
    machine = machine_info()
    config = {"repeats": repeats, "steps": steps, "every": every, "d_model": d_model, "quick": args.quick}
    out.write_text(json.dumps({"machine": machine, "config": config, "table": table, "ours_over_stock_save": ratio}))
    print(f"wrote {out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    ratio = result["ours_over_stock_save"]
    measure = "blocked time per save, ResumableCheckpoint / stock ModelCheckpoint (validated, atomic)"
    return [summary_row("checkpoint_cost", measure, ratio["median"], span_of(ratio), "x")]


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    table = result["table"]
    rows = [[variant, md_ms(entry["step_s"]), md_ms(entry["save_s"]) if variant != "none" else "-",
             f"{entry['ckpt_mb']['median']:.1f}" if variant != "none" else "-"]
            for variant, entry in table.items()]  # fmt: skip
    return md_table(["variant", "ms per step (saves included)", "ms blocked per save", "MB per checkpoint"], rows)


if __name__ == "__main__":
    main()
