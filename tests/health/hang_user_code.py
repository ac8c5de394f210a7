"""A user's model and data that hang once per job where the environment says: a DataLoader worker blocked in
``__getitem__`` and a rank stuck in ``training_step``. Both are the user-code matrix's kind of code (torch's
``DataLoader``, ``shuffle=True``, randomness in ``__getitem__``, a worker); nothing here knows about lightning-scale.

``HANG_CLAIMS`` is a folder shared by every attempt of the job: a hang happens only if it can create its claim file
there first, so the restarted attempt goes past it. ``HANG_WORKER="RANK:CALL,..."`` blocks rank RANK's worker at its
CALL-th ``__getitem__`` of an attempt; ``HANG_STEP="RANK:STEP,..."`` blocks rank RANK's ``training_step`` of
optimizer step STEP (1-based). Without them the code trains normally.
"""

from __future__ import annotations

import os
import time

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from tests.data.user_code import NoisyDataset, UserMLP

_calls = 0  # __getitem__ calls in this (worker) process


def _hang_once(setting: str, rank: int, count: int) -> None:
    """Block forever if the environment variable ``setting`` lists ``"rank:count"`` and no earlier attempt claimed
    it (the claim file is ``HANG_CLAIMS/SETTING=RANK:COUNT``)."""
    here = f"{rank}:{count}"
    if here not in os.environ.get(setting, "").split(","):
        return
    try:
        os.close(os.open(os.path.join(os.environ["HANG_CLAIMS"], f"{setting}={here}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    while True:
        time.sleep(1)


class BlockingDataset(NoisyDataset):
    def __getitem__(self, index: int) -> dict:
        global _calls
        _calls += 1
        _hang_once("HANG_WORKER", int(os.environ.get("RANK", "0")), _calls)
        return super().__getitem__(index)


class StallingMLP(UserMLP):
    def training_step(self, batch, batch_idx):
        _hang_once("HANG_STEP", self.global_rank, self.trainer.global_step + 1)
        return super().training_step(batch, batch_idx)


class WorkerData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(BlockingDataset(), batch_size=4, shuffle=True, num_workers=1)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(NoisyDataset(32), batch_size=4)
