"""A user's 2-process job with DataLoader workers and no multiprocessing_context chosen (``python -m`` under torchrun).

Config: ``{"out", "epochs", "stuck_from_epoch", "stuck_validation_from_epoch"}``. Every worker start appends
``rank pid parent-pid epoch`` to ``out/starts.txt``; with ``stuck_from_epoch`` set, workers of that epoch never start
(their ``worker_init_fn`` blocks), which ``DataStateCheckpoint``'s watchdog must turn into a report and exit 124. With
``stuck_validation_from_epoch`` set, the job also validates after every epoch through a loader with a worker and no
``multiprocessing_context``, as users write it, which from that epoch on never delivers (its ``__getitem__`` blocks):
the same report and exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

from lightning_scale import distributed
from lightning_scale.callbacks import ResumableCheckpoint
from tests.data.user_code import NoisyDataset, UserMLP


class StartRecorder:
    """The user's ``worker_init_fn``: records each start; blocks forever from ``stuck_from_epoch`` on."""

    def __init__(self, out: str, rank: int, stuck_from_epoch: int | None) -> None:
        self.out, self.rank, self.stuck_from_epoch = out, rank, stuck_from_epoch
        self.epoch = 0

    def __call__(self, worker_id: int) -> None:
        with open(Path(self.out) / "starts.txt", "a") as handle:
            handle.write(f"{self.rank} {os.getppid()} {self.epoch}\n")
        if self.stuck_from_epoch is not None and self.epoch >= self.stuck_from_epoch:
            never_starts()


def never_starts() -> None:
    while True:
        time.sleep(1)


class Epochs(pl.Callback):
    def __init__(self, recorder: StartRecorder, validation: Validation | None) -> None:
        self.recorder, self.validation = recorder, validation

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.recorder.epoch = trainer.current_epoch  # copied into the workers of the epoch starting now
        if self.validation is not None:
            self.validation.epoch = trainer.current_epoch  # into those of the validation after it


class Validation(Dataset):
    """The user's validation set; from ``stuck_from_epoch`` on (copied into the workers each validation starts) a
    worker blocks in ``__getitem__``, as one deadlocked at start-up would. Each item read appends
    ``rank pid parent-pid`` to ``out/validation_reads.txt``."""

    def __init__(self, stuck_from_epoch: int, out: str, rank: int) -> None:
        self.data, self.stuck_from_epoch, self.epoch = NoisyDataset(8), stuck_from_epoch, 0
        self.out, self.rank = out, rank

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict:
        if self.epoch >= self.stuck_from_epoch:
            never_delivers()
        with open(Path(self.out) / "validation_reads.txt", "a") as handle:
            handle.write(f"{self.rank} {os.getpid()} {os.getppid()}\n")
        return self.data[index]


def never_delivers() -> None:
    while True:
        time.sleep(1)


class UserDataWithWorkers(pl.LightningDataModule):
    def __init__(self, recorder: StartRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def train_dataloader(self) -> DataLoader:
        return DataLoader(NoisyDataset(32), batch_size=4, shuffle=True, num_workers=2, worker_init_fn=self.recorder)


class UserDataWithValidation(UserDataWithWorkers):
    def __init__(self, recorder: StartRecorder, validation: Validation) -> None:
        super().__init__(recorder)
        self.validation = validation

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.validation, batch_size=4, num_workers=1)


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    pl.seed_everything(0, verbose=False)
    rank = int(os.environ["RANK"])
    (Path(config["out"]) / f"rank{rank}.pid").write_text(str(os.getpid()))
    recorder = StartRecorder(config["out"], rank, config.get("stuck_from_epoch"))
    stuck_validation = config.get("stuck_validation_from_epoch")
    validation = None if stuck_validation is None else Validation(stuck_validation, config["out"], rank)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(timeout=timedelta(seconds=120)),
        max_epochs=config["epochs"],
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[Epochs(recorder, validation), ResumableCheckpoint(dirpath=str(Path(config["out"]) / "ckpt"))],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = UserDataWithWorkers(recorder) if validation is None else UserDataWithValidation(recorder, validation)
    trainer.fit(UserMLP(), datamodule=data)
    (Path(config["out"]) / "result.json").write_text(json.dumps({"epochs": trainer.current_epoch}))


if __name__ == "__main__":
    main(sys.argv[1])
    distributed.destroy_process_group(process_ends=True)
