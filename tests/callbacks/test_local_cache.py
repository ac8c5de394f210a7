"""ResumableCheckpoint(local_cache_dir=...): saves land on local disk first, rank 0 uploads them to dirpath."""

from __future__ import annotations

import threading

import pytest

from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.manifest import list_manifests
from tests import fitting
from tests.fitting import AtStep, FirstStep


def fit(dirpath, cache, trainer_kwargs, max_steps, at_step=None, **kwargs):
    checkpoint = ResumableCheckpoint(
        dirpath=dirpath, local_cache_dir=str(cache), every_n_train_steps=2, keep_last_k=None, **kwargs
    )
    first = FirstStep()
    fitting.fit([first, *([at_step] if at_step else []), checkpoint], trainer_kwargs, max_steps)
    return checkpoint, first


def published(dirpath: str) -> list[int]:
    return sorted(m.global_step for m in list_manifests(CheckpointStore(dirpath))[0])


def test_training_waits_for_the_local_copy_only_and_every_checkpoint_reaches_dirpath(
    faulty, tmp_path, tiny_trainer_kwargs
):
    dirpath, cache = "faulty://cached-run", tmp_path / "cache"
    seen = {}

    def while_uploading(trainer) -> None:
        seen["remote"], seen["cache"] = published(dirpath), published(str(cache))
        faulty.gate.set()

    faulty.gate.clear()  # uploads wait until step 3
    checkpoint, _ = fit(dirpath, cache, tiny_trainer_kwargs, 6, AtStep(3, while_uploading))
    assert seen == {"remote": [], "cache": [2]}
    assert published(dirpath) == [2, 4, 6]
    assert published(str(cache)) == [] and checkpoint.failed_saves == 0  # uploaded copies are dropped
    _, probe = fit(dirpath, tmp_path / "other-cache", tiny_trainer_kwargs, 8)
    assert probe.first_step == 6  # resumed from dirpath


def test_a_failed_upload_is_reported_and_the_next_one_lands(faulty, tmp_path, tiny_trainer_kwargs):
    dirpath, cache = "faulty://cached-failure", tmp_path / "cache"
    faulty.fail_names = ("step=4",)
    with pytest.warns(UserWarning, match=r"Uploading checkpoint epoch=0-step=4\.ckpt to .* failed.*local copy stays"):
        checkpoint, _ = fit(dirpath, cache, tiny_trainer_kwargs, 6)
    assert published(dirpath) == [2, 6] and checkpoint.failed_saves == 1
    assert published(str(cache)) == []
    assert not [n for n in CheckpointStore(dirpath).names() if "step=4" in n]


def test_save_now_returns_once_the_checkpoint_is_in_dirpath(faulty, tmp_path, tiny_trainer_kwargs):
    dirpath, cache = "faulty://cached-preempted", tmp_path / "cache"
    seen = {}

    def preempt(trainer) -> None:
        faulty.gate.clear()
        threading.Timer(0.3, faulty.gate.set).start()
        seen["path"] = ResumableCheckpoint.of(trainer, "test").save_now(trainer)
        seen["remote"] = published(dirpath)

    fit(dirpath, cache, tiny_trainer_kwargs, 4, AtStep(3, preempt))
    assert str(seen["path"]).endswith("epoch=0-step=3.ckpt") and seen["remote"] == [2, 3]


def test_a_remote_cache_dir_is_refused_at_setup(tmp_path, tiny_trainer_kwargs):
    with pytest.raises(ValueError, match=r"local_cache_dir='memory://cache' must be a local directory"):
        fit(str(tmp_path / "ckpt"), "memory://cache", tiny_trainer_kwargs, 2)
