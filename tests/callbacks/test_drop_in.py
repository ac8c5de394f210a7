"""Our callbacks in place of Lightning's stock ones (issue 20): they pickle and deep-copy as the stock ones do, run
under ``ddp_spawn`` and the Tuner, and ``BudgetedEarlyStopping`` takes every ``EarlyStopping`` argument."""

from __future__ import annotations

import copy
import inspect
import json
import pickle
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.multiprocessing.spawn import ProcessExitedException
from torch.utils.data import DataLoader, TensorDataset

from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DataStateCheckpoint,
    DivergenceRollback,
    ResumableCheckpoint,
    SpotPreemption,
    WandbResume,
)
from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.preemption import AWSSpotNotice, SignalNotice
from lightning_scale.report.wandb_offline import read_records
from tests.data.user_code import UserData, UserMLP

CALLBACKS = {
    "resumable-checkpoint": lambda d: ResumableCheckpoint(dirpath=str(d), every_n_train_steps=2),
    "resumable-checkpoint-async": lambda d: ResumableCheckpoint(dirpath=str(d), async_save=True, keep_last_k=2),
    "data-state": lambda d: DataStateCheckpoint(),
    "cost-tracker": lambda d: CostTracker(price_per_hour=1.5),
    "spot-preemption": lambda d: SpotPreemption([SignalNotice(), AWSSpotNotice()]),
    "budgeted-early-stopping": lambda d: BudgetedEarlyStopping(monitor="val_loss", max_cost_usd=5.0),
    "divergence-rollback": lambda d: DivergenceRollback(),
    "wandb-resume": lambda d: WandbResume(),
}


@pytest.mark.parametrize("name", CALLBACKS)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_each_callback_pickles_and_deep_copies_with_its_settings(tmp_path, name, how):
    callback = CALLBACKS[name](tmp_path)
    copied = pickle.loads(pickle.dumps(callback)) if how == "pickle" else copy.deepcopy(callback)
    assert type(copied) is type(callback) and copied.state_key == callback.state_key
    if isinstance(callback, ResumableCheckpoint):
        assert (copied.dirpath, copied.keep_last_k, copied.async_save) == (str(tmp_path), callback.keep_last_k,
                                                                           callback.async_save)  # fmt: skip
        assert copied._saver is None  # its own saver and writer thread, made in setup


def test_a_trainer_with_our_callbacks_pickles(tmp_path):
    callbacks = [make(tmp_path) for name, make in CALLBACKS.items() if name != "data-state"]
    trainer = Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    assert len(pickle.loads(pickle.dumps(trainer)).callbacks) == len(trainer.callbacks)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_ddp_spawn_trains_and_checkpoints_with_resumable_checkpoint(tmp_path):
    """Lightning pickles the Trainer, callbacks included, into each spawned process."""
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=2)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=4, callbacks=[checkpoint],
                      logger=False, enable_progress_bar=False, limit_val_batches=0,
                      default_root_dir=tmp_path)  # fmt: skip
    try:
        trainer.fit(UserMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    except ProcessExitedException as exit_:
        # pytorch#179291: a gloo group that a finished spawned process frees at interpreter exit can abort it
        # ("terminate called without an active exception", seen once in CI); an error in the run raises otherwise
        if exit_.signal_name != "SIGABRT":
            raise
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]


class TunableMLP(UserMLP):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_lr_find_and_then_fit_work_with_the_default_callbacks(tmp_path):
    seed_everything(0)
    callbacks = [ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=5), CostTracker(1.0)]
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=10, callbacks=callbacks, logger=False,
                      enable_progress_bar=False, limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    model, data = TunableMLP(), UserData({"loader": "torch", "shuffle": "shuffle_true"})
    finder = Tuner(trainer).lr_find(model, datamodule=data, num_training=20, early_stop_threshold=None)
    assert finder is not None and len(finder.results["lr"]) == 20 and model.lr == finder.suggestion()
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 10
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert names == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt"]


class Scored(LightningModule):
    """A validation score that follows a given sequence, one value per validation."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.layer, self.scores = nn.Linear(1, 1), scores

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("score", self.scores[min(self.trainer.current_epoch, len(self.scores) - 1)])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def stopped_epoch(stopper: BudgetedEarlyStopping, scores: list[float], tmp_path) -> int:
    loader = DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=1)
    trainer = Trainer(accelerator="cpu", max_epochs=len(scores), callbacks=[stopper], logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(Scored(scores), train_dataloaders=loader, val_dataloaders=loader)
    return trainer.current_epoch


@pytest.mark.parametrize(
    ("kwargs", "scores", "epochs"),
    [
        ({}, [1.0, 2.0, 2.0, 2.0, 2.0, 2.0], 4),  # EarlyStopping's default patience: 3 evaluations
        ({"stopping_threshold": 0.5}, [1.0, 0.8, 0.4, 0.3, 0.2], 3),
        ({"divergence_threshold": 5.0}, [1.0, 0.9, 6.0, 0.5, 0.4], 3),
    ],
    ids=["default-patience", "stopping-threshold", "divergence-threshold"],
)
def test_budgeted_early_stopping_without_a_budget_is_early_stopping_and_needs_no_cost_tracker(
    tmp_path, kwargs, scores, epochs
):
    assert stopped_epoch(BudgetedEarlyStopping(monitor="score", **kwargs), scores, tmp_path) == epochs


def test_a_cost_budget_still_needs_a_cost_tracker(tmp_path):
    with pytest.raises(ValueError, match="counts the cost with the Trainer's CostTracker"):
        stopped_epoch(BudgetedEarlyStopping(monitor="score", max_hours=1.0), [1.0, 2.0], tmp_path)


@pytest.mark.parametrize(
    ("ours", "stock"), [(ResumableCheckpoint, ModelCheckpoint), (BudgetedEarlyStopping, EarlyStopping)]
)
def test_every_argument_of_the_stock_class_is_accepted_by_name(ours, stock):
    mine = inspect.signature(ours.__init__).parameters
    assert set(inspect.signature(stock.__init__).parameters) - set(mine) == set()


def test_save_weights_only_is_refused_with_the_stock_class_as_the_way():
    with pytest.raises(ValueError, match=r"save_weights_only=True would make every checkpoint unresumable.*stock"):
        ResumableCheckpoint(save_weights_only=True)


def test_a_save_top_k_below_minus_one_is_refused_as_the_stock_class_does():
    with pytest.raises(ValueError, match=r"save_top_k=-3 must be >= -1"):
        ResumableCheckpoint(save_top_k=-3)


def test_train_time_interval_is_every_n_minutes():
    assert ResumableCheckpoint(train_time_interval=timedelta(minutes=30)).every_n_minutes == 30.0
    with pytest.raises(ValueError, match="not both"):
        ResumableCheckpoint(train_time_interval=timedelta(minutes=30), every_n_minutes=10)


class FailsAtStep3(TunableMLP):
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise RuntimeError("user code failed")
        return super().training_step(batch, batch_idx)


def test_save_on_exception_saves_when_fit_raises(tmp_path):
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path), save_on_exception=True, every_n_train_steps=100)
    trainer = Trainer(accelerator="cpu", max_steps=10, callbacks=[checkpoint], logger=False, limit_val_batches=0,
                      enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(RuntimeError, match="user code failed"):
        trainer.fit(FailsAtStep3(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    assert [p.name for p in tmp_path.glob("*.ckpt")] == ["epoch=0-step=3.ckpt"]


class SealedIO(TorchCheckpointIO):
    """A user's CheckpointIO: it seals every file it writes and refuses to load one it did not seal."""

    def __init__(self) -> None:
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.saved.append(str(path))
        super().save_checkpoint({**checkpoint, "sealed": True}, path, storage_options)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        self.loaded.append(str(path))
        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        assert checkpoint.pop("sealed"), path
        return checkpoint


@pytest.mark.parametrize("mode", ["sync", "async", "cache"])
def test_a_users_checkpoint_io_plugin_writes_every_checkpoint_and_loads_the_resumed_one(tmp_path, mode):
    extra = {"sync": {}, "async": {"async_save": True}, "cache": {"local_cache_dir": str(tmp_path / "cache")}}[mode]
    for max_steps in (4, 6):
        seed_everything(0)
        plugin = SealedIO()
        checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=2, **extra)
        trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=[checkpoint], plugins=[plugin],
                          logger=False, enable_progress_bar=False, limit_val_batches=0,
                          default_root_dir=tmp_path)  # fmt: skip
        trainer.fit(TunableMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
        assert len(plugin.saved) == max_steps // 2 - (max_steps == 6) * 2  # the resumed run saves from step 6 on
        assert all(Path(path).name.endswith(".partial") for path in plugin.saved)  # published once complete
    assert [Path(path).name for path in plugin.loaded] == ["epoch=0-step=4.ckpt"]
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "ckpts")))
    assert manifest is not None and manifest.name == "epoch=0-step=6.ckpt"  # its hash is of the plugin's bytes
    assert torch.load(tmp_path / "ckpts" / manifest.name, weights_only=False)["sealed"]


def test_lightnings_async_checkpoint_io_is_refused_with_async_save_as_the_way(tmp_path):
    trainer = Trainer(accelerator="cpu", max_steps=2, plugins=[AsyncCheckpointIO()], logger=False,
                      callbacks=[ResumableCheckpoint(dirpath=str(tmp_path))], enable_progress_bar=False,
                      default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match=r"async_save=True"):
        trainer.fit(TunableMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").glob("*.ckpt"))


def fit_with(tmp_path, checkpoint: ResumableCheckpoint, max_steps: int = 8, **trainer_kwargs) -> Trainer:
    seed_everything(0)
    trainer_kwargs = {"logger": False, **trainer_kwargs}
    trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=[checkpoint], enable_progress_bar=False,
                      limit_val_batches=0, default_root_dir=tmp_path, **trainer_kwargs)  # fmt: skip
    trainer.fit(TunableMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    return trainer


@pytest.mark.parametrize(
    ("save_top_k", "save_last", "kept"),
    [
        (1, None, ["epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt"]),  # keep_last_k=3
        (-1, None, ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt"]),
        (0, True, ["last.ckpt"]),
    ],
)
def test_save_top_k_without_a_monitor_keeps_the_stock_meaning(tmp_path, save_top_k, save_last, kept):
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=2, save_top_k=save_top_k,
                                     save_last=save_last)  # fmt: skip
    fit_with(tmp_path, checkpoint)
    assert sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt")) == kept
    assert checkpoint.save_top_k == save_top_k  # as loggers see it


def test_save_top_k_above_one_without_a_monitor_is_refused_with_keep_last_k_as_the_way():
    with pytest.raises(ValueError, match=r"keep_last_k=3"):
        ResumableCheckpoint(save_top_k=3)


@pytest.mark.parametrize(("save_top_k", "uploaded"), [(1, [8]), (-1, [2, 4, 6, 8])])
def test_wandb_log_model_uploads_each_checkpoint_only_with_save_top_k_minus_one(
    tmp_path, monkeypatch, save_top_k, uploaded
):
    """As with the stock class: ``save_top_k=-1`` uploads every checkpoint as it is written, otherwise the logger
    uploads the newest at the end (read back from the run file; W&B runs offline, which the logger does not know)."""
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(save_dir=str(tmp_path), log_model=True)
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=2, save_top_k=save_top_k,
                                     keep_last_k=None)  # fmt: skip
    fit_with(tmp_path, checkpoint, logger=logger)
    logger.experiment.finish()
    uploaded = [f"epoch=0-step={step}.ckpt" for step in uploaded]
    # W&B's service may still be writing the run file when finish() returns (seen once in three runs): read it until
    # it holds what was uploaded, for a few seconds at most
    deadline = time.monotonic() + 10
    while True:
        records = read_records(next(tmp_path.glob("wandb/offline-run-*/run-*.wandb")))
        artifacts = [json.loads(r.artifact.metadata) for r in records if r.WhichOneof("record_type") == "artifact"]
        if [a["original_filename"] for a in artifacts] == uploaded or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [a["original_filename"] for a in artifacts] == uploaded
    assert {a["ResumableCheckpoint"]["save_top_k"] for a in artifacts} == {save_top_k}


class CountsSteps(TunableMLP):
    def __init__(self) -> None:
        super().__init__()
        self.steps_run = 0

    def training_step(self, batch, batch_idx):
        self.steps_run += 1
        return super().training_step(batch, batch_idx)


def stock_run(tmp_path, **checkpoint_kwargs) -> Path:
    """Four steps of a project as it was before the switch: a stock ModelCheckpoint every 2 steps."""
    dirpath = tmp_path / "ckpts"
    stock = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, **checkpoint_kwargs)
    seed_everything(0)
    trainer = Trainer(accelerator="cpu", max_steps=4, callbacks=[stock], logger=False, enable_progress_bar=False,
                      limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(TunableMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))
    return dirpath


def switched_run(dirpath: Path, ckpt_path: str | None = None) -> CountsSteps:
    model = CountsSteps()
    trainer = Trainer(accelerator="cpu", max_steps=6, callbacks=[ResumableCheckpoint(dirpath=str(dirpath))],
                      logger=False, enable_progress_bar=False, limit_val_batches=0,
                      default_root_dir=dirpath.parent)  # fmt: skip
    trainer.fit(model, datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize("ckpt_path", [None, "last"])
def test_a_project_switching_from_model_checkpoint_resumes_from_its_newest_file_with_a_message(
    tmp_path, caplog, ckpt_path
):
    dirpath = stock_run(tmp_path)
    with caplog.at_level("INFO"):
        model = switched_run(dirpath, ckpt_path)
    assert model.steps_run == 2  # steps 5 and 6: it went on from step 4
    assert "Resuming from" in caplog.text and "epoch=0-step=4.ckpt, which has no manifest" in caplog.text
    manifest, _ = find_newest_valid(CheckpointStore(str(dirpath)))
    assert manifest is not None and manifest.global_step == 6
    assert {"epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"} <= {p.name for p in dirpath.iterdir()}  # never removed


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("truncate", "not a complete torch.save archive"), ("flip", "its entry .* fails the CRC check")],
)
def test_a_damaged_stock_file_is_skipped_with_its_reason_and_the_older_one_resumes(tmp_path, damage, reason):
    dirpath = stock_run(tmp_path)
    newest = dirpath / "epoch=0-step=4.ckpt"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:  # one byte inside the stored tensors: only the CRC check sees it
        data[len(data) // 3] ^= 0xFF
    newest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=rf"Not resuming from .*epoch=0-step=4.ckpt: {reason}"):
        model = switched_run(dirpath)
    assert model.steps_run == 4  # from step 2


def test_a_weights_only_stock_file_is_not_resumed_from(tmp_path):
    dirpath = stock_run(tmp_path, save_weights_only=True)
    with pytest.warns(UserWarning, match=r"epoch=0-step=4.ckpt: it holds weights only"):
        model = switched_run(dirpath)
    assert model.steps_run == 6  # from scratch


class BatchSized(TunableMLP):
    """A module that owns its loader and its batch size, as ``Tuner.scale_batch_size`` needs."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        samples = [{"x": torch.randn(16), "y": torch.randn(1)} for _ in range(256)]
        return DataLoader(samples, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader([{"x": torch.randn(16), "y": torch.randn(1)} for _ in range(8)], batch_size=4)


def test_scale_batch_size_and_then_fit_work_with_the_default_callbacks(tmp_path):
    seed_everything(0)
    callbacks = [ResumableCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=5), CostTracker(1.0)]
    trainer = Trainer(accelerator="cpu", max_steps=10, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    model = BatchSized()
    trials = {"mode": "power", "steps_per_trial": 2, "max_trials": 3}
    found = Tuner(trainer).scale_batch_size(model, **trials)
    stock = Trainer(accelerator="cpu", max_steps=10, callbacks=[ModelCheckpoint(dirpath=tmp_path / "stock")],
                    logger=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    assert found == model.batch_size == Tuner(stock).scale_batch_size(BatchSized(), **trials)
    trainer.fit(model)
    assert trainer.global_step == 10
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert names == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt"]
