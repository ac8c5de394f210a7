"""A full disk during a save: a clear error (synchronous) or a reported failure (asynchronous), earlier checkpoints
intact and no half-written file left taking the space.

The disk is a real size-limited tmpfs when this process may mount one (root with CAP_SYS_ADMIN, as on the
development machines), and otherwise an fsspec filesystem that raises ENOSPC the same way.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStorageError, CheckpointStore, find_newest_valid
from lightning_scale.checkpoint.journal import JOURNAL_DIR
from lightning_scale.checkpoint.progress import PROGRESS_NAME
from tests import fitting
from tests.faulty_fs import FaultyFileSystem


def fit(dirpath: str, trainer_kwargs: dict, max_steps: int, async_save: bool) -> ResumableCheckpoint:
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=2, keep_last_k=None, async_save=async_save)
    fitting.fit([checkpoint], trainer_kwargs, max_steps)
    return checkpoint


@pytest.fixture
def full_after_one_checkpoint(request, tmp_path, tiny_trainer_kwargs):
    """A dirpath with room for one checkpoint of ``fit`` (and its manifest) but not two."""
    if request.param == "faulty":
        FaultyFileSystem.reset()
        FaultyFileSystem.fail_names = ("step=4",)
        yield "faulty://full-disk"
        FaultyFileSystem.reset()
        return
    probe = tmp_path / "probe"
    fit(str(probe), tiny_trainer_kwargs, max_steps=2, async_save=False)
    size = (probe / "epoch=0-step=2.ckpt").stat().st_size
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5) // 4096 * 4096 + 8192}", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()}); the faulty:// variant covers ENOSPC")
    try:
        yield str(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def assert_step_2_intact_and_nothing_half_written(dirpath: str) -> None:
    store = CheckpointStore(dirpath)
    newest, skipped = find_newest_valid(store)
    assert newest is not None and newest.global_step == 2 and skipped == []
    assert [n for n in store.names() if not n.startswith(".write-probe") and n not in (PROGRESS_NAME, JOURNAL_DIR)] == [
        "epoch=0-step=2.ckpt",
        "epoch=0-step=2.ckpt.manifest.json",
    ]
    if not dirpath.startswith("faulty://"):
        assert Path(dirpath, "epoch=0-step=2.ckpt").stat().st_size == newest.size


@pytest.mark.parametrize("full_after_one_checkpoint", ["tmpfs", "faulty"], indirect=True)
def test_synchronous_save_on_a_full_disk_raises_naming_the_problem_and_keeps_the_earlier_checkpoint(
    full_after_one_checkpoint, tiny_trainer_kwargs
):
    dirpath = full_after_one_checkpoint
    with pytest.raises(CheckpointStorageError, match=r"step=4\.ckpt failed .*No space left on device.*untouched"):
        fit(dirpath, tiny_trainer_kwargs, max_steps=6, async_save=False)
    assert_step_2_intact_and_nothing_half_written(dirpath)


@pytest.mark.parametrize("full_after_one_checkpoint", ["tmpfs", "faulty"], indirect=True)
def test_asynchronous_save_on_a_full_disk_is_reported_and_training_finishes(
    full_after_one_checkpoint, tiny_trainer_kwargs
):
    dirpath = full_after_one_checkpoint
    with pytest.warns(UserWarning, match=r"background save of checkpoint epoch=0-step=4\.ckpt .*No space left"):
        checkpoint = fit(dirpath, tiny_trainer_kwargs, max_steps=4, async_save=True)
    assert checkpoint.failed_saves == 1
    assert_step_2_intact_and_nothing_half_written(dirpath)
