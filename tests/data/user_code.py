"""Data code written the way Lightning users write it (not through the example): the user-code matrix trains this.

The cell to build is read from the ``USER_CELL`` environment variable (JSON), so that one torchrun launch can
choose it without any lightning-scale helper in the user's code.
"""

from __future__ import annotations

import json
import os
import random

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

N_SAMPLES = 64 * 2  # 16 steps per epoch per rank at batch size 4 on 2 ranks


class NoisyDataset(Dataset):
    """A map-style dataset whose ``__getitem__`` draws augmentation from torch, NumPy and Python's ``random``."""

    def __init__(self, n: int = N_SAMPLES) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:
        noise = 0.05 * torch.randn(16) + float(np.random.normal(0, 0.05)) + random.gauss(0, 0.05)
        return {"x": self.x[index] + noise, "y": self.y[index], "sample_id": index}


class UserMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class UserData(pl.LightningDataModule):
    def __init__(self, cell: dict) -> None:
        super().__init__()
        self.cell = cell

    def train_dataloader(self):
        cell = self.cell
        dataset = NoisyDataset()
        loader_cls = {"torch": DataLoader, "stateful": StatefulDataLoader}[cell["loader"]]
        kwargs: dict = {"batch_size": 4, "num_workers": cell["workers"]}
        if cell["shuffle"] == "shuffle_true":
            kwargs["shuffle"] = True
        elif cell["shuffle"] == "random_sampler":
            kwargs["sampler"] = RandomSampler(dataset)
        elif cell["shuffle"] == "stateful_distributed":
            kwargs["sampler"] = StatefulDistributedSampler(dataset, shuffle=True, seed=5)
        return loader_cls(dataset, **kwargs)


def model() -> UserMLP:
    return UserMLP()


def data() -> UserData:
    return UserData(json.loads(os.environ["USER_CELL"]))
