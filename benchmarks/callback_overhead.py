"""Per-step overhead of every lightning-scale callback at once (checkpoint saves excluded) vs none.

Single-process CPU fits of the example transformer (1 thread). "all": ``ResumableCheckpoint`` (with its
``DataStateCheckpoint``; no save inside the timed steps), ``SpotPreemption`` (SIGTERM/SIGUSR1, a vote every step: a
no-op at world size 1, measured on 2 processes by ``preemption_cost.py``), ``CostTracker``, ``BudgetedEarlyStopping``
(a cost budget checked every step) and ``DivergenceRollback`` (reads the loss every step). Both variants log to CSV.
A step is the wall time between the ends of consecutive training batches (data loading, the step, every hook);
each fit's median step after a warm-up, variants interleaved, medians (min-max) over repeats, the ratio paired within
each repeat. Writes ``benchmarks/results/callback_overhead.json``.

    .venv/bin/python benchmarks/callback_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, spread
from _step_times import StepEnds

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DivergenceRollback,
    ResumableCheckpoint,
    SpotPreemption,
)

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 1.01  # all / none step time
WARMUP = 10


def callbacks(variant: str, workdir: str) -> list[pl.Callback]:
    if variant == "none":
        return []
    return [
        ResumableCheckpoint(dirpath=f"{workdir}/checkpoints", every_n_train_steps=10**9),  # no save while timed
        SpotPreemption(),
        CostTracker(price_per_hour=1.0, rightsizing=False),
        BudgetedEarlyStopping(max_cost_usd=1e9),
        DivergenceRollback(),
    ]


def fit(variant: str, steps: int) -> float:
    pl.seed_everything(0, verbose=False)
    timer = StepEnds()
    with tempfile.TemporaryDirectory() as workdir:
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0,
            callbacks=[timer, *callbacks(variant, workdir)], logger=CSVLogger(workdir),
            enable_checkpointing=variant != "none", enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=workdir,
        )  # fmt: skip
        trainer.fit(CharTransformer(vocab_size=64), CharDataModule(batch_size=8, augment=True))
    return timer.median_step_s(WARMUP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats of 40 steps (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "callback_overhead.json"), help="where to write the JSON")
    args = parser.parse_args()
    repeats, steps = (2, 40) if args.quick else (7, 300)
    torch.set_num_threads(1)

    runs: dict[str, list[float]] = {"none": [], "all": []}
    for _ in range(repeats):
        for variant in runs:  # interleaved: drift on a shared machine hits both alike
            runs[variant].append(fit(variant, steps))
    ratios = [a / n for a, n in zip(runs["all"], runs["none"], strict=True)]
    result = {
        "machine": machine_info(),
        "config": {"repeats": repeats, "steps": steps, "warmup": WARMUP, "quick": args.quick},
        "step_s": {variant: spread(times) for variant, times in runs.items()},
        "all_over_none": spread(ratios),
        "target": TARGET,
        "holds": statistics.median(ratios) <= TARGET,
    }
    print(f"callback overhead: example transformer, 1 process, {repeats} repeats of {steps} steps; medians")
    for variant, s in result["step_s"].items():
        print(f"{variant:>5}: {s['median'] * 1e3:7.3f} ms/step ({s['min'] * 1e3:.3f}-{s['max'] * 1e3:.3f})")
    verdict = "holds" if result["holds"] else "MISSED"
    print(f"all / none: {result['all_over_none']['median']:.3f} (target <= {TARGET}: {verdict})")
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
