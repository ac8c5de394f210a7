"""One 2-process job for benchmarks/preemption_cost.py (run under torchrun); writes its measurements as JSON.

``--part=overhead``: ``--rounds`` rounds of one fit without and one with ``SpotPreemption`` (a vote every step) in the
same processes, the order swapped every round; rank 0 writes each fit's median step time to ``steps.json``.
``--part=notice``: one fit where rank 1 gets a SIGTERM half-way; ``SpotPreemption`` saves and the job exits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from benchmarks._common import rotated
from benchmarks._step_times import StepEnds
from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption
from lightning_scale.testing import Fault, FaultInjector

WARMUP_STEPS = 10


def fit(variant: str, steps: int, d_model: int, workdir: Path) -> float:
    pl.seed_everything(0, verbose=False)
    clock = StepEnds()
    callbacks: list[pl.Callback] = [clock]
    if variant == "notice":  # a spot notice to rank 1 half-way
        callbacks.append(FaultInjector([Fault(step=steps // 2, rank=1, kind="SIGTERM")], record_dir=workdir))
    callbacks.append(ResumableCheckpoint(dirpath=str(workdir / "ckpt"), every_n_train_steps=steps // 4))
    if variant != "none":
        callbacks.append(SpotPreemption())
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, callbacks=callbacks,
        logger=CSVLogger(str(workdir), name="log"), limit_val_batches=0, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    model = CharTransformer(vocab_size=64, d_model=d_model, n_heads=4, n_layers=4)
    trainer.fit(model, datamodule=CharDataModule(batch_size=8))
    return clock.median_step_s(WARMUP_STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=["overhead", "notice"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    if args.part == "notice":
        fit("notice", args.steps, args.d_model, workdir)  # exits with the preemption
    rounds = []
    for index in range(args.rounds):
        order = rotated(("none", "vote"), index)
        rounds.append({v: fit(v, args.steps, args.d_model, workdir / f"{index}-{v}") for v in order})
    if distributed.rank() == 0:
        (workdir / "steps.json").write_text(json.dumps(rounds))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
