"""Data code written the way Lightning users write it (not through the example), for the user-code matrix.

Nothing here knows about lightning-scale. The cell to build is read from the ``USER_CELL`` environment variable
(JSON) so that one torchrun launch can train several cells: ``loader`` (``torch``: torch's ``DataLoader``;
``stateful``: torchdata's ``StatefulDataLoader``), ``shuffle`` (``shuffle_true``, ``random_sampler``: an explicit
``RandomSampler``, ``stateful_distributed``: a user-given ``StatefulDistributedSampler``), ``workers``, ``val``
(a validation loader), ``collate`` (randomness in ``collate_fn``) and ``worker_init`` (the usual NumPy re-seeding
recipe in ``worker_init_fn``, which draws from the worker's RNG).
"""

from __future__ import annotations

import json
import os
import random

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, default_collate
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

N_SAMPLES = 128  # 16 steps per epoch per rank at batch size 4 on 2 ranks


class NoisyDataset(Dataset):
    """A map-style dataset whose ``__getitem__`` draws augmentation from torch, NumPy and Python's ``random``."""

    def __init__(self, n: int = N_SAMPLES) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 16, generator=generator)
        self.y = torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:
        noise = 0.05 * torch.randn(16) + float(np.random.normal(0, 0.05)) + random.gauss(0, 0.05)
        return {"x": self.x[index] + noise, "y": self.y[index], "sample_id": index}


class OwnOrder(Sampler[int]):
    """A user's own sampler with no state and no ``set_epoch``: its order after a resume cannot be reproduced."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def jitter_collate(items: list[dict]) -> dict:
    batch = default_collate(items)
    batch["x"] = batch["x"] * (1 + 0.01 * torch.rand(1))
    return batch


def reseed_numpy(worker_id: int) -> None:
    np.random.seed((torch.initial_seed() + worker_id) % 2**32)
    random.seed(torch.initial_seed() + random.random())


class UserMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch["x"]), batch["y"]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class UserData(pl.LightningDataModule):
    def __init__(self, cell: dict) -> None:
        super().__init__()
        self.cell = cell

    def _loader(self, dataset: Dataset, **kwargs) -> DataLoader:
        cls = {"torch": DataLoader, "stateful": StatefulDataLoader}[self.cell["loader"]]
        workers = self.cell.get("workers", 0)
        if workers and self.cell.get("worker_init"):
            kwargs["worker_init_fn"] = reseed_numpy
        if self.cell.get("collate"):
            kwargs["collate_fn"] = jitter_collate
        return cls(dataset, batch_size=4, num_workers=workers, **kwargs)

    def train_dataloader(self) -> DataLoader:
        dataset = NoisyDataset()
        shuffle = self.cell["shuffle"]
        if shuffle == "shuffle_true":
            return self._loader(dataset, shuffle=True)
        if shuffle == "random_sampler":
            return self._loader(dataset, sampler=RandomSampler(dataset))
        return self._loader(dataset, sampler=StatefulDistributedSampler(dataset, shuffle=True, seed=5))

    def val_dataloader(self) -> DataLoader:
        return self._loader(NoisyDataset(32))


def model() -> UserMLP:
    return UserMLP()


def data() -> UserData:
    return UserData(json.loads(os.environ["USER_CELL"]))
