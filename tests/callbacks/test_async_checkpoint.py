"""ResumableCheckpoint(async_save=True) in single-process fits: what training waits for, what lands, what fails."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from lightning.pytorch import Callback

from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.checkpoint.manifest import list_manifests
from tests import fitting
from tests.fitting import AtStep


def fit(dirpath, trainer_kwargs, max_steps, callbacks=(), **checkpoint_kwargs):
    checkpoint = ResumableCheckpoint(dirpath=dirpath, async_save=True, **checkpoint_kwargs)
    return fitting.fit([*callbacks, checkpoint], trainer_kwargs, max_steps), checkpoint


def steps_published(dirpath: str) -> list[int]:
    return sorted(m.global_step for m in list_manifests(CheckpointStore(dirpath))[0])


def test_training_goes_on_while_the_save_is_written_and_the_file_holds_the_state_at_the_save(
    faulty, tiny_trainer_kwargs
):
    dirpath = "faulty://async-run"
    faulty.gate.clear()  # every write waits until the test lets it through
    seen: dict[str, object] = {}

    def remember_state(trainer) -> None:
        seen["weights"] = {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()}

    def check_save_in_flight(trainer) -> None:
        seen["published_at_step_3"] = steps_published(dirpath)
        deadline = time.monotonic() + 10
        while not faulty.writes_started and time.monotonic() < deadline:  # the writer thread may not have run yet
            time.sleep(0.01)
        seen["writes_started"] = faulty.writes_started
        faulty.gate.set()

    _, checkpoint = fit(
        dirpath,
        tiny_trainer_kwargs,
        max_steps=6,
        callbacks=[AtStep(2, remember_state), AtStep(3, check_save_in_flight)],
        every_n_train_steps=2,
        keep_last_k=None,
    )
    assert seen["writes_started"] == 1 and seen["published_at_step_3"] == [], "step 3 ran before the save landed"
    assert steps_published(dirpath) == [2, 4, 6]
    assert checkpoint.failed_saves == 0
    assert checkpoint.last_blocked_seconds is not None and checkpoint.last_save_seconds is not None
    store = CheckpointStore(dirpath)
    with store.fs.open(store.path("epoch=0-step=2.ckpt"), "rb") as handle:
        saved = torch.load(handle, weights_only=False)["state_dict"]
    assert saved.keys() == seen["weights"].keys()
    for name, tensor in seen["weights"].items():
        assert torch.equal(saved[name], tensor), f"{name} in the step-2 file is not the step-2 state"


def test_a_failed_background_save_is_reported_never_published_and_training_goes_on(faulty, tiny_trainer_kwargs):
    dirpath = "faulty://async-failure"
    faulty.fail_names = ("step=4",)
    with pytest.warns(UserWarning, match=r"background save of checkpoint epoch=0-step=4.ckpt .* failed.*No space"):
        trainer, checkpoint = fit(dirpath, tiny_trainer_kwargs, max_steps=6, every_n_train_steps=2, keep_last_k=None)
    assert trainer.global_step == 6
    assert steps_published(dirpath) == [2, 6]
    assert checkpoint.failed_saves == 1
    store = CheckpointStore(dirpath)
    assert not [name for name in store.names() if "step=4" in name], "the failed save left files behind"
    newest, skipped = find_newest_valid(store)
    assert newest is not None and newest.global_step == 6 and skipped == []


class StagedAtTheEnd(Callback):
    """What the saver still holds in host memory once the last step's saves were queued."""

    staged: object = "unseen"

    def on_train_end(self, trainer, pl_module) -> None:  # before the checkpoint callback's own (it runs last)
        self.staged = ResumableCheckpoint.of(trainer, "test")._saver._staged


def test_save_last_writes_the_staged_state_twice_without_staging_it_again(faulty, tiny_trainer_kwargs):
    dirpath = "faulty://async-last"
    end = StagedAtTheEnd()
    fit(dirpath, tiny_trainer_kwargs, max_steps=4, callbacks=[end], every_n_train_steps=2, save_last=True)
    store = CheckpointStore(dirpath)
    assert sorted(n for n in store.names() if n.endswith(".ckpt")) == [
        "epoch=0-step=2.ckpt",
        "epoch=0-step=4.ckpt",
        "last.ckpt",
    ]
    assert store.sha256("last.ckpt") == store.sha256("epoch=0-step=4.ckpt")
    assert end.staged is None, "the host copy outlived its save"


def test_save_now_waits_for_the_save_in_flight_then_saves_this_step_durably(faulty, tiny_trainer_kwargs):
    dirpath = "faulty://async-preempted"
    seen: dict[str, object] = {}

    def save_now_while_in_flight(trainer) -> None:
        checkpoint = ResumableCheckpoint.of(trainer, "test")
        assert checkpoint.save_in_flight, "the step-4 save should still be in flight"
        threading.Timer(0.3, faulty.gate.set).start()
        started = time.monotonic()
        seen["path"] = checkpoint.save_now(trainer)
        seen["waited"] = time.monotonic() - started
        seen["published"] = steps_published(dirpath)

    fit(
        dirpath,
        tiny_trainer_kwargs,
        max_steps=6,
        callbacks=[AtStep(4, lambda trainer: faulty.gate.clear()), AtStep(5, save_now_while_in_flight)],
        every_n_train_steps=4,
        keep_last_k=None,
    )
    assert str(seen["path"]).endswith("epoch=0-step=5.ckpt")
    assert seen["waited"] >= 0.25
    assert seen["published"] == [4, 5], "save_now returned before both saves were durable"
    manifests = {m.global_step: m for m in list_manifests(CheckpointStore(dirpath))[0]}
    assert manifests[4].created_unix < manifests[5].created_unix
