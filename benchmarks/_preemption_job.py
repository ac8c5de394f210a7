"""One 2-process job for benchmarks/preemption_cost.py (run under torchrun); writes its measurements as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _step_times import StepEnds

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption
from lightning_scale.testing import Fault, FaultInjector

WARMUP_STEPS = 10


class StepTimer(StepEnds):
    """Median wall time per training step after a warm-up, written by rank 0 when training ends."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.out.write_text(json.dumps({"step_s": self.median_step_s(WARMUP_STEPS)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", choices=["none", "vote", "notice"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    pl.seed_everything(0, verbose=False)
    callbacks: list[pl.Callback] = [StepTimer(workdir / "steps.json")]
    if args.variant == "notice":  # a spot notice to rank 1 half-way
        callbacks.append(FaultInjector([Fault(step=args.steps // 2, rank=1, kind="SIGTERM")], record_dir=workdir))
    callbacks.append(ResumableCheckpoint(dirpath=str(workdir / "ckpt"), every_n_train_steps=args.steps // 4))
    if args.variant != "none":
        callbacks.append(SpotPreemption())
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps, callbacks=callbacks,
        logger=CSVLogger(str(workdir), name="log"), limit_val_batches=0, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    model = CharTransformer(vocab_size=64, d_model=args.d_model, n_heads=4, n_layers=4)
    trainer.fit(model, datamodule=CharDataModule(batch_size=8))
    distributed.destroy_process_group(process_ends=True)


if __name__ == "__main__":
    main()
