"""A user's model and data for the elastic job: torch's ``DataLoader`` with ``shuffle=True`` and a worker, under stock
``ddp``; nothing here knows about lightning-scale. The data and the model draw no random numbers, so that a run that
changes its number of processes can be compared with an uninterrupted one by its losses; each step sleeps 100 ms so
that the test can act between steps."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

N_SAMPLES = 96  # 12 optimizer steps of 8 samples per epoch (see the test for why the epoch divides evenly)
BATCH_SIZE = 4
STEP_SECONDS = 0.1


class Points(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N_SAMPLES, 16, generator=generator)
        self.y = torch.randn(N_SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, index: int) -> dict:
        return {"x": self.x[index], "y": self.y[index], "sample_id": index}


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_SECONDS)
        return nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class PointsData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(Points(), batch_size=BATCH_SIZE, shuffle=True, num_workers=1)
