"""DataStateCheckpoint: what it stores, what it refuses, and exact resume beside Lightning's ModelCheckpoint."""

from __future__ import annotations

import time

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from examples.char_transformer import CharDataModule
from lightning_scale.callbacks import DataStateCheckpoint, ResumableCheckpoint
from lightning_scale.callbacks import _data_state_worker_watch as worker_watch_module
from lightning_scale.callbacks._data_state_format import RankDataState
from lightning_scale.callbacks._data_state_worker_watch import WorkerStartWatch
from lightning_scale.data import STUCK_WORKERS_EXIT_CODE, WorkerStartWatchdog
from lightning_scale.data.elastic import EpochPosition
from tests import fitting
from tests.data.user_code import OwnOrder


def rank_state(end_of_epoch: bool) -> dict:
    return {"epoch": 3, "end_of_epoch": end_of_epoch, "batches_consumed": 17, "loaders": [], "rng": None}


def set_up_for_fit(callback: DataStateCheckpoint) -> DataStateCheckpoint:
    callback.setup(Trainer(logger=False, enable_progress_bar=False), None, "fit")
    return callback


def test_mid_epoch_checkpoint_from_another_world_size_is_refused():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(False), "rank_1": rank_state(False)}
    with pytest.raises(ValueError, match=r"written by 2 processes in the middle of epoch 3.*Resume with 2 processes"):
        set_up_for_fit(DataStateCheckpoint()).load_state_dict(state)


def position(samples_per_step: int = 8, batch_size: int = 4) -> dict:
    return EpochPosition(
        epoch=3, consumed=136, end=200, batch_size=batch_size, drop_last=False, samples_per_step=samples_per_step,
        shuffle=True, seed=0,
    ).to_dict()  # fmt: skip


def two_ranks(end_of_epoch: bool, **position_kwargs) -> dict:
    ranks = [{**rank_state(end_of_epoch), "positions": [position(**position_kwargs)]} for _ in range(2)]
    return {"version": 1, "world_size": 2, "ranks": ranks}


def test_a_mid_epoch_resume_on_another_world_size_names_why_it_cannot_finish_the_epoch():
    callback = DataStateCheckpoint()
    callback.setup(Trainer(logger=False, enable_progress_bar=False, limit_train_batches=5), None, "fit")
    with pytest.raises(ValueError, match=r"cannot be finished on 1 processes: limit_train_batches=5 limits the epoch"):
        callback.load_state_dict(two_ranks(end_of_epoch=False))
    without = set_up_for_fit(DataStateCheckpoint(make_loaders_resumable=False))
    with pytest.raises(ValueError, match=r"make_loaders_resumable=False\) leaves the loaders as they are"):
        without.load_state_dict(two_ranks(end_of_epoch=False))


def test_keep_global_batch_sets_the_accumulation_that_keeps_the_samples_per_step():
    callback = set_up_for_fit(DataStateCheckpoint(keep_global_batch=True))
    with pytest.warns(UserWarning, match=r"accumulate_grad_batches 1 -> 2: 1 processes x 4 samples x 2 batches"):
        callback.load_state_dict(two_ranks(end_of_epoch=True))
    assert callback._trainer.accumulate_grad_batches == 2
    refused = set_up_for_fit(DataStateCheckpoint(keep_global_batch=True))
    with (
        pytest.raises(ValueError, match=r"12 samples, which 1 processes with batches of 8 cannot keep"),
        pytest.warns(),
    ):
        refused.load_state_dict(two_ranks(end_of_epoch=True, samples_per_step=12, batch_size=8))


def test_outside_fit_the_data_state_is_ignored():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(False), "rank_1": rank_state(False)}
    DataStateCheckpoint().load_state_dict(state)  # e.g. trainer.validate(ckpt_path=...) on another world size
    with pytest.raises(ValueError, match="written by 2 processes in the middle of epoch 3"):  # which fit refuses
        set_up_for_fit(DataStateCheckpoint()).load_state_dict(state)


def test_end_of_epoch_checkpoint_from_another_world_size_resumes_with_a_warning():
    state = {"version": 1, "world_size": 2, "rank_0": rank_state(True), "rank_1": rank_state(True)}
    callback = set_up_for_fit(DataStateCheckpoint())
    with pytest.warns(UserWarning, match=r"written by 2 processes with 1: the next epoch is split for 1"):
        callback.load_state_dict(state)
    assert callback._pending == RankDataState(epoch=3, end_of_epoch=True)  # no loader or RNG state of 2 processes


def test_unknown_state_version_is_refused():
    with pytest.raises(ValueError, match=r"version 99.*reads version 1"):
        set_up_for_fit(DataStateCheckpoint()).load_state_dict({"version": 99, "world_size": 1})


def fit_with_model_checkpoint(dirpath, trainer_kwargs, max_steps, ckpt_path=None):
    checkpoint = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=7, save_top_k=-1)
    data = CharDataModule(batch_size=8, augment=True)
    return fitting.fit(
        [DataStateCheckpoint(), checkpoint], trainer_kwargs, max_steps, ckpt_path=ckpt_path, datamodule=data
    ).lightning_module


def test_stores_per_rank_state_and_drops_lightnings_rank0_loader_state(tmp_path, tiny_trainer_kwargs):
    fit_with_model_checkpoint(tmp_path, tiny_trainer_kwargs, max_steps=7)
    checkpoint = torch.load(tmp_path / "epoch=0-step=7.ckpt", weights_only=True)
    assert "combined_loader" not in checkpoint["loops"]["fit_loop"]["state_dict"]
    state = checkpoint["callbacks"]["DataStateCheckpoint"]
    assert state["version"] == 1 and state["world_size"] == 1
    rank0 = state["ranks"][0]
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
    seen = SeenIds()
    checkpoint = (
        ModelCheckpoint(dirpath=dirpath, every_n_train_steps=7, save_top_k=-1)
        if stock
        else ResumableCheckpoint(dirpath=str(dirpath), every_n_train_steps=7)
    )
    trainer = fitting.fit([checkpoint, seen], trainer_kwargs, max_steps, datamodule=StreamData(batch_size=8))
    return trainer.lightning_module, seen.ids


def test_loader_without_length_saves_the_consumed_batch_not_the_one_fetched_ahead(tmp_path, tiny_trainer_kwargs):
    fit_stream(tmp_path / "stock", tiny_trainer_kwargs, max_steps=7, stock=True)
    stock = torch.load(tmp_path / "stock" / "epoch=0-step=7.ckpt", weights_only=True)
    assert stock["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["_num_yielded"] == 8  # one ahead
    fit_stream(tmp_path / "ours", tiny_trainer_kwargs, max_steps=7)
    ours = torch.load(tmp_path / "ours" / "epoch=0-step=7.ckpt", weights_only=True)
    assert ours["callbacks"]["DataStateCheckpoint"]["ranks"][0]["loaders"][0]["state"]["_num_yielded"] == 7


def test_loader_without_length_resumes_bitwise_exactly(tmp_path, tiny_trainer_kwargs):
    reference, reference_ids = fit_stream(tmp_path / "reference", tiny_trainer_kwargs, max_steps=15)
    _, first_ids = fit_stream(tmp_path / "run", tiny_trainer_kwargs, max_steps=7)
    resumed, resumed_ids = fit_stream(tmp_path / "run", tiny_trainer_kwargs, max_steps=15)
    assert first_ids + resumed_ids == reference_ids
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


class StepCounter(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps += 1


class UnsupportedStream(IterableDataset):
    def __iter__(self):
        for index in range(16):
            yield {"x": torch.randn(16), "y": torch.randn(1), "sample_id": index}


def fit_on(
    loader, tmp_path, tiny_trainer_kwargs, counter: StepCounter | None = None, **checkpoint_kwargs
) -> StepCounter:
    from tests.data.user_code import UserMLP

    counter = counter or StepCounter()
    checkpoint = ResumableCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, **checkpoint_kwargs)
    trainer = Trainer(max_steps=3, callbacks=[counter, checkpoint], **tiny_trainer_kwargs)
    trainer.fit(UserMLP(), train_dataloaders=loader)
    return counter


def batches_from_a_generator():
    for index in range(8):
        yield {"x": torch.randn(2, 16), "y": torch.randn(2, 1), "sample_id": torch.tensor([index, index])}


UNSUPPORTED = {  # what cannot resume exactly, and the words that name it
    "iterable-without-state": (
        lambda: DataLoader(UnsupportedStream(), batch_size=4),
        r"UnsupportedStream, which has no state_dict\(\)",
    ),
    "sampler-without-state": (
        lambda: DataLoader(list(UnsupportedStream()), sampler=OwnOrder(16), batch_size=4),
        r"OwnOrder, which has no state_dict\(\) and no set_epoch",
    ),
    "generator-stream": (batches_from_a_generator, r"is a generator, not a DataLoader, and has no state_dict\(\)"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_what_cannot_resume_exactly_is_named_at_the_start_of_the_first_run(case, tmp_path, tiny_trainer_kwargs):
    make_loader, message = UNSUPPORTED[case]
    with pytest.warns(UserWarning, match=message):
        counter = fit_on(make_loader(), tmp_path, tiny_trainer_kwargs)
    assert counter.steps == 3  # a warning, and training goes on


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_strict_resume_refuses_to_train_before_the_first_step(case, tmp_path, tiny_trainer_kwargs):
    make_loader, message = UNSUPPORTED[case]
    counter = StepCounter()
    with pytest.raises(ValueError, match=r"(?s)cannot resume exactly \(DataStateCheckpoint\(strict=True\).*" + message):
        fit_on(make_loader(), tmp_path, tiny_trainer_kwargs, counter=counter, strict_resume=True)
    assert counter.steps == 0


def test_opting_out_leaves_the_users_loader_as_given(tmp_path, tiny_trainer_kwargs):
    from tests.data.user_code import NoisyDataset, UserMLP

    seen = []

    class Sees(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            seen.append(trainer.train_dataloader)

    loader = DataLoader(NoisyDataset(16), batch_size=4, shuffle=True)
    callbacks = [Sees(), DataStateCheckpoint(make_loaders_resumable=False), ResumableCheckpoint(dirpath=tmp_path)]
    Trainer(max_steps=2, callbacks=callbacks, **tiny_trainer_kwargs).fit(UserMLP(), train_dataloaders=loader)
    assert type(seen[0]) is DataLoader


class FailsInItsFirstStep(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        raise RuntimeError("the user's bug")


def test_an_error_before_the_first_batch_stops_the_worker_start_watchdog(tmp_path, tiny_trainer_kwargs, monkeypatch):
    from tests.data.user_code import NoisyDataset, UserMLP

    data_state = DataStateCheckpoint(worker_start_timeout_s=600)
    loader = DataLoader(NoisyDataset(16), batch_size=4, num_workers=1)
    callbacks = [FailsInItsFirstStep(), data_state, ResumableCheckpoint(dirpath=tmp_path)]
    watchdogs = []
    original = WorkerStartWatch._arm

    def record(self, loaders, what):
        original(self, loaders, what)
        watchdogs.append(self._watchdog)

    monkeypatch.setattr(WorkerStartWatch, "_arm", record)
    with pytest.raises(RuntimeError, match="the user's bug"):
        Trainer(max_steps=2, callbacks=callbacks, **tiny_trainer_kwargs).fit(UserMLP(), train_dataloaders=loader)
    assert watchdogs and not watchdogs[0].running  # closed: it cannot end this process 10 minutes from now
    assert data_state._workers._watchdog is None


class BlocksInGetitem(torch.utils.data.Dataset):
    """A validation set whose worker never delivers: its ``__getitem__`` blocks (as a worker deadlocked at start-up)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        blocks_forever()


def blocks_forever() -> None:
    while True:
        time.sleep(0.1)


@pytest.mark.timeout(60)  # without the watchdog the fit waits for the worker forever
def test_a_validation_loader_whose_workers_never_deliver_is_reported_and_the_process_exits(
    tmp_path, tiny_trainer_kwargs, monkeypatch, capfd
):
    from tests.data.user_code import NoisyDataset, UserMLP

    exits: list[int] = []

    class ExitRecorded(WorkerStartWatchdog):
        def __init__(self, timeout_s: float) -> None:
            super().__init__(timeout_s, exit_fn=exits.append)

    monkeypatch.setattr(worker_watch_module, "WorkerStartWatchdog", ExitRecorded)
    train = DataLoader(NoisyDataset(16), batch_size=4)
    stuck = DataLoader(BlocksInGetitem(), batch_size=4, num_workers=1, multiprocessing_context="fork")
    data_state = DataStateCheckpoint(worker_start_timeout_s=1)
    trainer_kwargs = {**tiny_trainer_kwargs, "limit_val_batches": 1, "num_sanity_val_steps": 0, "val_check_interval": 2}
    trainer = Trainer(max_steps=4, callbacks=[data_state], **trainer_kwargs)
    started = time.monotonic()
    # the watchdog stops the workers and, instead of ending this process, records the exit code: the loader then
    # finds its worker gone
    with pytest.raises(RuntimeError, match=r"DataLoader worker .* exited unexpectedly"):
        trainer.fit(UserMLP(), train_dataloaders=train, val_dataloaders=stuck)
    assert exits == [STUCK_WORKERS_EXIT_CODE] and time.monotonic() - started < 20
    err = capfd.readouterr().err
    assert (
        "rank 0, validation dataloader(s) of epoch 0, step 2: no batch 1 s after its DataLoader workers started" in err
    )
    assert "in blocks_forever" in err and "in __getitem__" in err  # the worker's own stack
    assert data_state._workers._watchdog is None  # stopped with the fit's error


class RecordsSamples(Callback):
    def __init__(self) -> None:
        self.ids: dict[int, list[int]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ids[trainer.global_step] = batch["sample_id"].tolist()


def test_an_unseeded_single_process_run_resumes_its_own_order_and_dropout(tmp_path, tiny_trainer_kwargs):
    """No seed_everything and torch's DataLoader(shuffle=True): the run draws a seed, keeps it in the checkpoint, and a
    resume in a process whose RNG is elsewhere reads the same samples and ends with the same weights."""
    from tests.data.user_code import NoisyDataset, UserMLP

    def fit(max_steps: int, ckpt_path=None, run: str = "ckpt") -> tuple[RecordsSamples, UserMLP]:
        torch.manual_seed(torch.seed())  # whatever state an unseeded process is in
        model, recorder = UserMLP(), RecordsSamples()
        checkpoint = ResumableCheckpoint(dirpath=tmp_path / run, every_n_train_steps=4, keep_last_k=None)
        loader = DataLoader(NoisyDataset(32), batch_size=4, shuffle=True)  # 8 steps per epoch
        trainer = Trainer(max_steps=max_steps, callbacks=[recorder, checkpoint], **tiny_trainer_kwargs)
        trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
        return recorder, model

    first, first_model = fit(20)
    resumed, resumed_model = fit(20, ckpt_path=str(tmp_path / "ckpt" / "epoch=1-step=12.ckpt"))
    assert sorted(resumed.ids) == list(range(13, 21))
    assert all(resumed.ids[step] == first.ids[step] for step in resumed.ids)  # epoch 1 and 2 orders, epoch-seeded
    assert first.ids[1] != first.ids[9]  # a new order every epoch
    for name, tensor in first_model.state_dict().items():
        assert torch.equal(tensor, resumed_model.state_dict()[name]), name
    another, _ = fit(4, run="another")
    assert [another.ids[step] for step in range(1, 5)] != [first.ids[step] for step in range(1, 5)]  # not seed 0


# One process without a parallel strategy (what Lightning picks when an elastic job shrinks to one process): it must
# draw the global order a DDP run draws, so that it finishes an epoch begun on more processes and hands its own on.
POINTS, BATCH = 32, 4  # 8 batches per epoch on one process, 4 on two


class Points(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(POINTS, 4, generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return POINTS

    def __getitem__(self, index: int) -> dict:
        return {"x": self.x[index], "sample_id": index}


class Mean(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SamplesPerStep(Callback):
    def __init__(self) -> None:
        self.ids: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        self.ids[step] = sorted(self.ids.get(step, []) + batch["sample_id"].tolist())


def ddp_order(epoch: int, seed: int = 0) -> list[int]:
    """The global order of ``epoch`` under Lightning's DDP (its DistributedSampler), whatever the world size."""
    return torch.randperm(POINTS, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def per_step(order: list[int], samples: int) -> list[list[int]]:
    return [sorted(order[i : i + samples]) for i in range(0, len(order), samples)]


def fit_points(tmp_path, trainer_kwargs, max_steps, ckpt_path=None, data_state=None, **overrides) -> SamplesPerStep:
    recorder, data_state = SamplesPerStep(), data_state or DataStateCheckpoint()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "one", every_n_train_steps=3, save_top_k=-1)
    callbacks = [recorder, data_state, checkpoint]
    trainer = Trainer(max_steps=max_steps, callbacks=callbacks, **{**trainer_kwargs, **overrides})
    loader = DataLoader(Points(), batch_size=BATCH, shuffle=True)
    trainer.fit(Mean(), train_dataloaders=loader, ckpt_path=ckpt_path)
    return recorder


def written_by_two_processes(tmp_path, trainer_kwargs, seed: int = 0) -> str:
    """A checkpoint of step 3 in epoch 0 as 2 DDP processes write it (3 batches of 4 each: the first 24 samples of
    the epoch's global order taken): a 1-process fit's, with both ranks' data state as DDP records it."""
    fit_points(tmp_path / "first", trainer_kwargs, max_steps=3)
    path = tmp_path / "two.ckpt"
    checkpoint = torch.load(tmp_path / "first" / "one" / "epoch=0-step=3.ckpt", weights_only=False)
    at = EpochPosition(epoch=0, consumed=24, end=POINTS, batch_size=BATCH, drop_last=False, samples_per_step=8,
                       shuffle=True, seed=seed)  # fmt: skip
    rank = {**rank_state(False), "epoch": 0, "batches_consumed": 3, "positions": [at.to_dict()]}
    checkpoint["callbacks"]["DataStateCheckpoint"] = {"version": 1, "world_size": 2, "ranks": [rank, rank]}
    torch.save(checkpoint, path)
    return str(path)


def test_one_process_finishes_the_epoch_of_two_and_then_draws_their_global_batches(
    tmp_path, tiny_trainer_kwargs, monkeypatch
):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # Lightning's DistributedSampler takes seed 0 then
    path = written_by_two_processes(tmp_path, tiny_trainer_kwargs)
    with pytest.warns(UserWarning, match=r"Resuming epoch 0 on 1 processes.*after 24 of its 32 samples"):
        data_state = DataStateCheckpoint(keep_global_batch=True)
        resumed = fit_points(tmp_path, tiny_trainer_kwargs, max_steps=8, ckpt_path=path, data_state=data_state)
    expected = per_step(ddp_order(0), 8)[3:] + per_step(ddp_order(1), 8)  # the 2-process run's steps 4 to 8
    assert resumed.ids == dict(zip(range(4, 9), expected, strict=True))


def test_a_refused_epoch_names_what_differs_from_the_checkpoints_order_and_the_fix(
    tmp_path, tiny_trainer_kwargs, monkeypatch
):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    path = written_by_two_processes(tmp_path, tiny_trainer_kwargs, seed=5)
    seed = r"seed=0 here, seed=5 in the run that wrote the checkpoint\. .*seed_everything\(5\) .*--seed_everything 5\)"
    with pytest.raises(ValueError, match=seed):
        fit_points(tmp_path, tiny_trainer_kwargs, max_steps=8, ckpt_path=path)
    path = written_by_two_processes(tmp_path, tiny_trainer_kwargs)
    sampler = r"EpochSeededSampler here, through a DistributedSampler in the run .*\. Give it a DistributedSampler"
    with pytest.raises(ValueError, match=sampler):
        fit_points(tmp_path, tiny_trainer_kwargs, max_steps=8, ckpt_path=path, use_distributed_sampler=False)


def test_the_one_process_of_a_torchrun_job_draws_the_order_of_ddp_and_records_its_position(
    tmp_path, tiny_trainer_kwargs, monkeypatch
):
    """An elastic job that starts on one node: the epoch it is in can be handed to more processes when a node joins."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    torchrun = {"TORCHELASTIC_RUN_ID": "job", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": "1"}
    for name, value in {**torchrun, "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    seen = fit_points(tmp_path, tiny_trainer_kwargs, max_steps=10)
    assert seen.ids == dict(zip(range(1, 11), per_step(ddp_order(0), 4) + per_step(ddp_order(1), 4)[:2], strict=True))
    checkpoint = torch.load(tmp_path / "one" / "epoch=0-step=6.ckpt", weights_only=False)
    position = checkpoint["callbacks"]["DataStateCheckpoint"]["ranks"][0]["positions"][0]
    assert (position["consumed"], position["shuffle"], position["seed"]) == (24, True, 0)


def test_the_per_rank_state_round_trips_and_an_older_layout_reads_with_defaults():
    loaders = [{"state": {"_num_yielded": 5}, "generators": {}}]
    full = {"epoch": 2, "end_of_epoch": False, "batches_consumed": 5, "rng": {"python": 1}, "drawn_seed": 7,
            "loaders": loaders, "positions": [None], "rest_start": None}  # fmt: skip
    state = RankDataState.from_dict(full)
    assert state.to_dict() == full and state.loaders is not None and state.loaders[0].state == {"_num_yielded": 5}
    older = RankDataState.from_dict({"epoch": 1, "end_of_epoch": True, "loaders": [], "rng": None})  # no position yet
    assert (older.batches_consumed, older.loaders, older.positions, older.rest_start, older.drawn_seed) == (
        0, None, [], None, None
    )  # fmt: skip


@pytest.mark.parametrize("timeout_s", [0, -5.0])
def test_a_worker_start_timeout_that_is_not_positive_is_refused_naming_the_argument(timeout_s):
    from lightning_scale.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=rf"worker_start_timeout_s={timeout_s} must be > 0"):
        DataStateCheckpoint(worker_start_timeout_s=timeout_s)
