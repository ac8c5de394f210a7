"""A plain Lightning script, made preemptible and exactly resumable by the two callbacks marked "lightning-scale".

The get-started page walks through it. Everything else is written as Lightning users write it: torch's
``DataLoader`` with ``shuffle=True`` and a worker, randomness in ``__getitem__``, dropout, ``seed_everything`` and
Lightning's own ``ddp``. Run it under torchrun, which restarts it after a preemption:

    torchrun --nproc-per-node 2 --max-restarts 3 examples/preemptible.py
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_scale.callbacks import ResumableCheckpoint, SpotPreemption  # lightning-scale


class NoisyPoints(Dataset):
    """Points on a line, with fresh noise drawn from the global RNG every time a sample is read."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([index / 256.0])
        return x + 0.01 * torch.randn(1), 3 * x + 1


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class NoisyPointsData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(NoisyPoints(), batch_size=16, shuffle=True, num_workers=1)


def main() -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_steps=200,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        callbacks=[
            ResumableCheckpoint(dirpath="runs/preemptible/checkpoints", every_n_train_steps=50),  # lightning-scale
            SpotPreemption(),  # lightning-scale
        ],
    )
    trainer.fit(Regressor(), datamodule=NoisyPointsData())  # no ckpt_path: a restart resumes by itself


if __name__ == "__main__":
    main()
