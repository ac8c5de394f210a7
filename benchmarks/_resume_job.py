"""One process of ``resume_time.py``: train with ``ResumableCheckpoint`` and note when the first step starts.

python -m benchmarks._resume_job DIRPATH STATE_MB MAX_STEPS OUT_JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from benchmarks.checkpoint_async import Heavy
from lightning_scale.callbacks import ResumableCheckpoint


class FirstStep(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx) -> None:
        if not self.out.exists():
            self.out.write_text(json.dumps({"first_step_unix": time.time(), "global_step": trainer.global_step}))


def main() -> None:
    dirpath, state_mb, max_steps, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=2, keep_last_k=1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, callbacks=[checkpoint, FirstStep(out)], logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out.parent),
    )  # fmt: skip
    trainer.fit(Heavy(state_mb, compute_s=0.0))


if __name__ == "__main__":
    main()
