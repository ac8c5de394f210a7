"""Train the char transformer with exact, automatic resume. Run it the same way after any interruption.

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 examples/train.py --ckpt-dir runs/job

Every rank's data position and RNG state are checkpointed; re-running the same command (or torchrun restarting the
workers) continues from the newest valid checkpoint in ``--ckpt-dir`` and ends bitwise identical to a run that was
never interrupted. SIGTERM or SIGUSR1 to any rank stops every rank at the same step, checkpoints and exits 143.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption
from lightning_scale.preemption import FileNotice, SignalNotice


def notice_sources(notice_file: str | None) -> list:
    """SIGTERM/SIGUSR1 always; a notice file when given (written by a SLURM trap or a Kubernetes preStop hook)."""
    return [SignalNotice(), *([FileNotice(notice_file)] if notice_file else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", required=True, help="checkpoint directory or fsspec URL")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps to train")
    parser.add_argument("--every-n-steps", type=int, default=25, help="checkpoint interval in steps")
    parser.add_argument("--num-workers", type=int, default=0, help="dataloader worker processes per rank")
    parser.add_argument("--save-weights", default=None, help="write the final weights here (rank 0)")
    parser.add_argument("--notice-file", default=None, help="also stop when this file appears (SLURM, Kubernetes)")
    args = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy="data_parallel" if world_size > 1 else "auto",  # DDP that survives torchrun restarts
        max_steps=args.steps,
        callbacks=[
            ResumableCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every_n_steps),
            SpotPreemption(sources=notice_sources(args.notice_file)),  # -> checkpoint, exit 143, restart
        ],
        val_check_interval=100,
        limit_val_batches=4,
        check_val_every_n_epoch=None,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = CharTransformer(vocab_size=64)
    trainer.fit(model, datamodule=CharDataModule(batch_size=8, num_workers=args.num_workers, augment=True))
    distributed.destroy_process_group()
    if args.save_weights and trainer.is_global_zero:
        torch.save(model.state_dict(), args.save_weights)
    loss = trainer.callback_metrics.get("train_loss")
    if trainer.is_global_zero and loss is not None:
        print(f"Finished at step {trainer.global_step}, train_loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
