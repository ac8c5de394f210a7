"""One job for benchmarks/callback_overhead.py: 1 process, or 2 under torchrun (stock ``ddp``, gloo).

``--rounds`` rounds of one fit per variant in the same processes, the order swapped every round:

- ``stock``: what users run without lightning-scale: ``ModelCheckpoint`` and ``EarlyStopping`` (Lightning handles
  SIGTERM itself, in both variants);
- ``ours``: the callbacks ``lightning-scale fit`` adds by default, as it builds them (``lightning_scale.cli``:
  ``ResumableCheckpoint``, with its memory snapshots and here an ``every_n_minutes`` timer too, ``SpotPreemption``,
  ``CostTracker``, ``HangWatchdog``, ``StragglerDetector``), and ``BudgetedEarlyStopping`` with a cost budget in
  place of ``EarlyStopping``. No save falls inside the timed steps. (``DivergenceRollback``, added by hand, votes on
  every step's loss in that step's own collective: not in this row.)

Both log to CSV every 50 steps, as Lightning does by default. Then one more fit of ``ours`` under Lightning's
``SimpleProfiler`` gives each callback's hook time per step (the breakdown; the profiler's own cost is in it). Rank 0
writes each round's median step times and the breakdown to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.profilers import SimpleProfiler

from benchmarks._common import rotated
from benchmarks._step_times import StepEnds
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.callbacks import BudgetedEarlyStopping
from lightning_scale.cli import DEFAULT_CALLBACKS

VARIANTS = ("stock", "ours")
WARMUP = 10
NEVER = 10**9  # steps: no save inside the timed steps


def callbacks(variant: str, workdir: str) -> list[pl.Callback]:
    if variant == "stock":
        return [ModelCheckpoint(dirpath=workdir, every_n_train_steps=NEVER), EarlyStopping(monitor="train_loss")]
    arguments = {"checkpoint": {"dirpath": workdir, "every_n_train_steps": NEVER, "every_n_minutes": 600.0},
                 "cost": {"price_per_hour": 1.0}}  # fmt: skip
    command = [cls(**{**defaults, **arguments.get(key, {})}) for key, (cls, defaults) in DEFAULT_CALLBACKS.items()]
    return [*command, BudgetedEarlyStopping(monitor="train_loss", max_cost_usd=1e9)]


def fit(variant: str, steps: int, d_model: int, workdir: Path, profiler: SimpleProfiler | None = None) -> float:
    pl.seed_everything(0, verbose=False)
    clock = StepEnds()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", max_steps=steps,
        limit_val_batches=0, callbacks=[clock, *callbacks(variant, str(workdir / "ckpt"))],
        logger=CSVLogger(str(workdir)), enable_progress_bar=False, enable_model_summary=False, profiler=profiler,
        default_root_dir=str(workdir),
    )  # fmt: skip
    trainer.fit(CharTransformer(vocab_size=64, d_model=d_model), datamodule=CharDataModule(batch_size=8))
    return clock.median_step_s(WARMUP)


def breakdown(profiler: SimpleProfiler, steps: int) -> dict[str, float]:
    """Milliseconds per step in each callback's hooks, by callback."""
    per_callback: dict[str, float] = {}
    for action, durations in profiler.recorded_durations.items():
        if action.startswith("[Callback]"):
            name = action.removeprefix("[Callback]").split(".")[0].split("{")[0]
            per_callback[name] = per_callback.get(name, 0.0) + sum(durations) * 1e3 / steps
    return dict(sorted(per_callback.items(), key=lambda item: -item[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--workdir", required=True, help="a folder every process reaches")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workdir = Path(args.workdir)
    rounds = []
    for index in range(args.rounds):
        order = rotated(VARIANTS, index)
        rounds.append({v: fit(v, args.steps, args.d_model, workdir / f"{index}-{v}") for v in order})
    profiler = SimpleProfiler()
    fit("ours", args.steps, args.d_model, workdir / "profiled", profiler)
    if distributed.rank() == 0:
        Path(args.out).write_text(json.dumps({"rounds": rounds, "breakdown_ms": breakdown(profiler, args.steps)}))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
