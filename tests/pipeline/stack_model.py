"""A LightningModule whose whole network is one nn.Sequential: the pipeline contract in a few lines."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

IN, OUT, VOCAB = 8, 4, 16


class StackModel(LightningModule):
    def __init__(self, width: int = 32, depth: int = 6, dropout: float = 0.0, lr: float = 0.05, adam: bool = False):
        super().__init__()
        self.save_hyperparameters()
        blocks: list[nn.Module] = [nn.Linear(IN, width)]
        for _ in range(depth):
            blocks += [nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(dropout))]
        self.model = nn.Sequential(*blocks, nn.Linear(width, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def pipeline_loss_fn(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.pipeline_loss_fn(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", self.pipeline_loss_fn(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", self.pipeline_loss_fn(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        if self.hparams.adam:
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr / 10)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def dataset(n: int = 256, seed: int = 0, tokens: bool = False) -> TensorDataset:
    """``n`` rows of IN features (or, with ``tokens``, IN token ids < VOCAB) and a class < OUT each."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=generator)
    y = (x[:, :OUT].argmax(dim=1) + (x[:, -1] > 1).long()) % OUT
    return TensorDataset(((x + 2) * VOCAB / 4).clamp(0, VOCAB - 1).long() if tokens else x, y)


def loader(batch_size: int = 16, drop_last: bool = True, n: int = 256, tokens: bool = False) -> StatefulDataLoader:
    return StatefulDataLoader(dataset(n, tokens=tokens), batch_size=batch_size, shuffle=False, drop_last=drop_last)


class StackData(LightningDataModule):
    """The same data as :func:`loader`, as a DataModule for the CLI."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> StatefulDataLoader:
        return loader(self.batch_size)

    def val_dataloader(self) -> StatefulDataLoader:
        return loader(self.batch_size, n=48)


class ListModel(StackModel):
    """The same network with its blocks in an nn.ModuleList that ``forward`` loops over (pipeline: module="blocks")."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.blocks = nn.ModuleList(self.model.children())
        del self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class MeanOverTokens(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class TokenModel(StackModel):
    """A language-model layout in one stack: an embedding first, the blocks, pooling and a head last (token ids in)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        width, blocks = self.hparams.width, list(self.model.children())[1:-1]
        self.model = nn.Sequential(nn.Embedding(VOCAB, width), *blocks, MeanOverTokens(), nn.Linear(width, OUT))
