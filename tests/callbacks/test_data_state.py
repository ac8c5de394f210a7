"""DataStateCheckpoint: what it stores, what it refuses, and exact resume beside Lightning's ModelCheckpoint."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import DataStateCheckpoint, ResumableCheckpoint
from lightning_scale.callbacks.data_state import _check_loaders


def rank_state(end_of_epoch: bool) -> dict:
    return {"epoch": 3, "end_of_epoch": end_of_epoch, "batches_consumed": 17, "loaders": [], "rng": None}


def fitting(callback: DataStateCheckpoint) -> DataStateCheckpoint:
    callback.setup(Trainer(logger=False, enable_progress_bar=False), None, "fit")
    return callback


def test_mid_epoch_checkpoint_from_another_world_size_is_refused():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(False), "rank_1": rank_state(False)}
    with pytest.raises(ValueError, match=r"written by 2 processes in the middle of epoch 3.*Resume with 2 processes"):
        fitting(DataStateCheckpoint()).load_state_dict(state)


def test_outside_fit_the_data_state_is_ignored():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(False), "rank_1": rank_state(False)}
    DataStateCheckpoint().load_state_dict(state)  # e.g. trainer.validate(ckpt_path=...) on another world size


def test_end_of_epoch_checkpoint_from_another_world_size_resumes_with_a_warning():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(True), "rank_1": rank_state(True)}
    callback = fitting(DataStateCheckpoint())
    with pytest.warns(UserWarning, match=r"written by 2 processes with 1: the next epoch is split for 1"):
        callback.load_state_dict(state)
    assert callback._pending == {"epoch": 3, "end_of_epoch": True, "loaders": None, "rng": None}


def test_unknown_state_version_is_refused():
    with pytest.raises(ValueError, match=r"version 99.*reads version 1"):
        fitting(DataStateCheckpoint()).load_state_dict({"version": 99, "world_size": 1})


def test_lightning_shuffle_wrapper_is_refused_with_the_fix():
    data = list(range(16))
    loader = StatefulDataLoader(data, sampler=DistributedSamplerWrapper(RandomSampler(data), num_replicas=2, rank=0))
    with pytest.raises(ValueError, match=r"DistributedSamplerWrapper.*StatefulDistributedSampler"):
        _check_loaders([loader])


def test_plain_dataloader_gets_a_warning_naming_statefuldataloader():
    with pytest.warns(UserWarning, match=r"no state_dict\(\).*StatefulDataLoader"):
        _check_loaders([DataLoader(list(range(8)))])


def test_workers_without_worker_rng_get_a_warning():
    loader = StatefulDataLoader(list(range(8)), num_workers=2)
    with pytest.warns(UserWarning, match=r"num_workers=2.*WorkerRNGDataset"):
        _check_loaders([loader])


def fit_with_model_checkpoint(dirpath, trainer_kwargs, max_steps, ckpt_path=None):
    seed_everything(0)
    model = CharTransformer(vocab_size=64)
    checkpoint = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=7, save_top_k=-1)
    trainer = Trainer(max_steps=max_steps, callbacks=[DataStateCheckpoint(), checkpoint], **trainer_kwargs)
    trainer.fit(model, datamodule=CharDataModule(batch_size=8, augment=True), ckpt_path=ckpt_path)
    return model


def test_stores_per_rank_state_and_drops_lightnings_rank0_loader_state(tmp_path, tiny_trainer_kwargs):
    fit_with_model_checkpoint(tmp_path, tiny_trainer_kwargs, max_steps=7)
    checkpoint = torch.load(tmp_path / "epoch=0-step=7.ckpt", weights_only=True)
    assert "combined_loader" not in checkpoint["loops"]["fit_loop"]["state_dict"]
    state = checkpoint["callbacks"]["DataStateCheckpoint"]
    assert state["version"] == 1 and state["world_size"] == 1
    rank0 = state["rank_0"]
    assert (rank0["epoch"], rank0["end_of_epoch"], rank0["batches_consumed"]) == (0, False, 7)
    assert rank0["loaders"][0]["state"]["_num_yielded"] == 7  # the batch consumed, not one fetched ahead
    assert set(rank0["rng"]) >= {"python", "numpy", "torch"}


def test_beside_plain_model_checkpoint_resume_is_bitwise_exact(tmp_path, tiny_trainer_kwargs):
    reference = fit_with_model_checkpoint(tmp_path / "reference", tiny_trainer_kwargs, max_steps=20)
    fit_with_model_checkpoint(tmp_path / "run", tiny_trainer_kwargs, max_steps=7)
    resumed = fit_with_model_checkpoint(
        tmp_path / "run", tiny_trainer_kwargs, max_steps=20, ckpt_path=str(tmp_path / "run" / "epoch=0-step=7.ckpt")
    )
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


class WindowStream(IterableDataset):
    """The example's training windows as a stream without a length (so Lightning fetches one batch ahead)."""

    def __init__(self, windows) -> None:
        self.windows = windows

    def __iter__(self):
        return (self.windows[i] for i in range(len(self.windows)))


class StreamData(CharDataModule):
    def train_dataloader(self):
        return StatefulDataLoader(WindowStream(self.train_set), batch_size=8)


class SeenIds(Callback):
    def __init__(self) -> None:
        self.ids: list[list[int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ids.append(batch["sample_id"].tolist())


def fit_stream(dirpath, trainer_kwargs, max_steps, stock=False):
    seed_everything(0)
    model, seen = CharTransformer(vocab_size=64), SeenIds()
    checkpoint = (
        ModelCheckpoint(dirpath=dirpath, every_n_train_steps=7, save_top_k=-1)
        if stock
        else ResumableCheckpoint(dirpath=str(dirpath), every_n_train_steps=7)
    )
    trainer = Trainer(max_steps=max_steps, callbacks=[checkpoint, seen], **trainer_kwargs)
    trainer.fit(model, datamodule=StreamData(batch_size=8))
    return model, seen.ids


def test_loader_without_length_saves_the_consumed_batch_not_the_one_fetched_ahead(tmp_path, tiny_trainer_kwargs):
    fit_stream(tmp_path / "stock", tiny_trainer_kwargs, max_steps=7, stock=True)
    stock = torch.load(tmp_path / "stock" / "epoch=0-step=7.ckpt", weights_only=True)
    assert stock["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["_num_yielded"] == 8  # one ahead
    fit_stream(tmp_path / "ours", tiny_trainer_kwargs, max_steps=7)
    ours = torch.load(tmp_path / "ours" / "epoch=0-step=7.ckpt", weights_only=True)
    assert ours["callbacks"]["DataStateCheckpoint"]["rank_0"]["loaders"][0]["state"]["_num_yielded"] == 7


def test_loader_without_length_resumes_bitwise_exactly(tmp_path, tiny_trainer_kwargs):
    reference, reference_ids = fit_stream(tmp_path / "reference", tiny_trainer_kwargs, max_steps=15)
    _, first_ids = fit_stream(tmp_path / "run", tiny_trainer_kwargs, max_steps=7)
    resumed, resumed_ids = fit_stream(tmp_path / "run", tiny_trainer_kwargs, max_steps=15)
    assert first_ids + resumed_ids == reference_ids
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
