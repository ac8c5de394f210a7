"""Shared memory too small for two memory snapshots: a warning at the first snapshot that names the sizes and the fix,
the run goes on without them, and nothing is left half written."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_scale import knobs
from lightning_scale.callbacks import ResumableCheckpoint
from tests import fitting


def _shared_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` as the node's shared memory."""
    disk = tmp_path / f"shm-{uuid.uuid4().hex[:6]}"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()})")
    monkeypatch.setattr(knobs, "SNAPSHOT_DIR", str(disk))
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def small_shared_memory(tmp_path, monkeypatch) -> Iterator[Path]:
    """1 MiB: two slots take at least 2 MiB."""
    yield from _shared_memory(tmp_path, monkeypatch, "1m")


@pytest.fixture
def shared_memory_for_two(tmp_path, monkeypatch) -> Iterator[Path]:
    """Room for the two slots of the example model's snapshots, and a little more."""
    yield from _shared_memory(tmp_path, monkeypatch, "3m")


def test_too_little_shared_memory_turns_snapshots_off_with_a_warning_before_any_copy(
    small_shared_memory, tmp_path, tiny_trainer_kwargs
):
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=2, snapshot_every_n_steps=1)
    with pytest.warns(UserWarning, match=r"memory snapshots are off for this run: 2 snapshots of \d+ MiB") as warned:
        trainer = fitting.fit([checkpoint], tiny_trainer_kwargs, max_steps=4)
    message = next(str(w.message) for w in warned if "memory snapshots are off" in str(w.message))
    assert "MiB free" in message and "--shm-size" in message and "LIGHTNING_SCALE_SNAPSHOT_DIR" in message
    assert trainer.global_step == 4 and checkpoint.newest_valid_checkpoint() is not None  # the run went on
    assert [p for p in small_shared_memory.rglob("*") if p.is_file()] == []  # nothing allocated, nothing left


def test_shared_memory_filled_up_later_costs_a_snapshot_and_a_warning_not_the_run(
    shared_memory_for_two, tmp_path, tiny_trainer_kwargs
):
    def fill(trainer) -> None:  # something else takes the room of the second slot
        (shared_memory_for_two / "other").write_bytes(b"x" * 2**20)

    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=2, snapshot_every_n_steps=1)
    with pytest.warns(UserWarning, match=r"a memory snapshot of rank 0 could not be written \(\[Errno 28\]") as warned:
        trainer = fitting.fit([checkpoint, fitting.AtStep(1, fill)], tiny_trainer_kwargs, max_steps=4)
    assert sum("could not be written" in str(w.message) for w in warned) == 1  # said once
    assert trainer.global_step == 4


def test_snapshot_arguments_are_checked_with_the_flag_that_fixes_them():
    with pytest.raises(ValueError, match=r"snapshot_every_n_steps=0 must be an integer >= 1, 'auto', or None"):
        ResumableCheckpoint(snapshot_every_n_steps=0)
    with pytest.raises(ValueError, match=r"--checkpoint.snapshot_max_overhead 0.01"):
        ResumableCheckpoint(snapshot_max_overhead=2.0)
