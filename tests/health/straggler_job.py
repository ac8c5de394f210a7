"""A user's 2-process DDP job (``python -m`` under torchrun) with ``StragglerDetector`` and ``CostTracker``, logging
to a CSV file; one rank can be made slow.

Config: ``{"out", "step_seconds", "slow_rank", "slow_seconds"}``: every rank's ``training_step`` sleeps
``step_seconds`` (a step of a known length, as a GPU step is, whatever the load on this CPU machine), rank
``slow_rank``'s ``slow_seconds`` more (``slow_rank`` null: a balanced run). Rank 0 writes ``result.json`` (the
detector's report, the ranks it named and what they cost), ``weights.pt`` and the logger's
``metrics.csv``/``hparams.yaml`` under ``out``.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy

from lightning_scale import distributed
from lightning_scale.callbacks import CostTracker, StragglerDetector
from tests.data.user_code import UserData, UserMLP
from tests.jobs import job_configs


class SometimesSlowMLP(UserMLP):
    def __init__(self, step_seconds: float, slow_rank: int | None, slow_seconds: float) -> None:
        super().__init__()
        self.step_seconds, self.slow_rank, self.slow_seconds = step_seconds, slow_rank, slow_seconds

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_seconds + (self.slow_seconds if self.global_rank == self.slow_rank else 0.0))
        return super().training_step(batch, batch_idx)


def run(config: dict) -> None:
    out = Path(config["out"])
    pl.seed_everything(0, verbose=False)
    detector = StragglerDetector(factor=1.5, patience=3)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(timeout=timedelta(seconds=120)),
        max_steps=24,
        log_every_n_steps=4,
        callbacks=[CostTracker(price_per_hour=36.0), detector],
        logger=CSVLogger(save_dir=str(out), name="", version=""),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    model = SometimesSlowMLP(config["step_seconds"], config["slow_rank"], config["slow_seconds"])
    trainer.fit(model, datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out / "weights.pt")
        result = {"report": detector.report(), "named": detector.named, "usd": detector.usd}
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    for config in job_configs(sys.argv[1]):
        run(config)
    distributed.destroy_process_group(process_ends=True)  # with the trainer out of scope
