"""Cost levers, measured in one run: what one epoch of the example model costs in fp32, in bf16-mixed, and as a
small-sample debug run (``limit_train_batches=0.1``), as ``CostTracker`` bills it.

Single-process CPU fits, the variants' order rotated every round; medians (min-max), and each variant's cost over
fp32's of the same round, paired (see ``_common.py``). The price is the shipped catalog's
AWS g5.xlarge on-demand row, only to express time in dollars: the ratios are what carries over. Writes
``benchmarks/results/cost_levers.json``.

    .venv/bin/python -m benchmarks.cost_levers [--quick]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch

from benchmarks._common import machine_info, paired_ratios, rotated, spread
from benchmarks._summary import (
    Row,
    md_s,
    md_table,
    span_of,
    summary_row,
)
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import CostTracker

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "fp32": {"precision": "32-true"},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "small sample (10%)": {"precision": "32-true", "limit_train_batches": 0.1},
}
PROVIDER, INSTANCE = "aws", "g5.xlarge"


def one_epoch(kwargs: dict[str, object], d_model: int, workdir: str) -> dict[str, float]:
    pl.seed_everything(0, verbose=False)
    tracker = CostTracker(provider=PROVIDER, instance_type=INSTANCE, rightsizing=False, progress_bar=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, callbacks=[tracker], logger=False, limit_val_batches=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=workdir,
        **kwargs,
    )  # fmt: skip
    trainer.fit(CharTransformer(vocab_size=64, d_model=d_model, n_heads=4, n_layers=4), CharDataModule(batch_size=16))
    report = tracker.report(trainer.global_step)
    return {"usd": report.usd_total, "seconds": report.hours * 3600, "steps": trainer.global_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of a small model (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "cost_levers.json"), help="where to write the JSON")
    args = parser.parse_args()
    repeats, d_model = (1, 64) if args.quick else (6, 256)
    torch.set_num_threads(1)

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for index in range(repeats):
            for name in rotated(list(VARIANTS), index):
                runs[name].append(one_epoch(VARIANTS[name], d_model, workdir))

    table = {name: {k: spread([r[k] for r in rs]) for k in ("usd", "seconds", "steps")} for name, rs in runs.items()}
    over_fp32 = {
        name: paired_ratios([r["usd"] / fp32["usd"] for r, fp32 in zip(rs, runs["fp32"], strict=True)])
        for name, rs in runs.items()
    }
    print(f"cost levers: one epoch, d_model={d_model}, {repeats} repeats, billed as {PROVIDER} {INSTANCE} on-demand")
    print(f"{'variant':<20} {'steps':>5} {'seconds':>20} {'USD':>26} {'vs fp32':>8}")
    for name, row in table.items():
        s, usd = row["seconds"], row["usd"]
        print(
            f"{name:<20} {row['steps']['median']:5.0f} {s['median']:8.2f} ({s['min']:.2f}-{s['max']:.2f})"
            f" {usd['median']:.6f} ({usd['min']:.6f}-{usd['max']:.6f}) {over_fp32[name]['median']:8.2f}"
        )
    result = {
        "machine": machine_info(),
        "config": {"repeats": repeats, "d_model": d_model, "price": f"{PROVIDER} {INSTANCE}", "quick": args.quick},
        "table": table,
        "over_fp32": over_fp32,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    return [summary_row("cost_levers", f"cost of one epoch, {name} / fp32", ratio["median"], span_of(ratio), "x")
            for name, ratio in result["over_fp32"].items() if name != "fp32"]  # fmt: skip


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    rows = [[name, str(int(entry["steps"]["median"])), md_s(entry["seconds"]), f"{entry['usd']['median']:.6f}"]
            for name, entry in result["table"].items()]  # fmt: skip
    return f"Billed as {result['config']['price']}:\n\n" + md_table(["variant", "steps", "seconds", "USD"], rows)


if __name__ == "__main__":
    main()
