"""One rank's two snapshot slots: written in turn, the newest never overwritten, a torn write never read."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from lightning_scale.snapshot.codec import pack
from lightning_scale.snapshot.slots import SnapshotHeader, SnapshotSlots

HEADER = SnapshotHeader(0, 1, step=0, epoch=0, generation=0, run_id="run", nbytes=0, created_unix=0.0, tensor_shapes={})


def _write(slots: SnapshotSlots, step: int, value: float, generation: int = 0) -> int:
    header = dataclasses.replace(HEADER, step=step, generation=generation)
    return slots.write(header, pack({"w": torch.full((1000,), value), "step": step}))


def test_slots_alternate_and_the_newest_snapshot_is_never_overwritten(tmp_path):
    slots = SnapshotSlots(tmp_path / "rank0")
    assert [_write(slots, step, float(step)) for step in (1, 2, 3, 4)] == [0, 1, 0, 1]
    assert [header.step for _, header in slots.headers()] == [3, 4]
    header, state = slots.read(1)
    assert header.step == 4 and state["step"] == 4 and torch.equal(state["w"], torch.full((1000,), 4.0))
    assert header.nbytes == 4000
    _write(slots, 1, 9.0, generation=1)  # a newer generation outranks a later step
    assert [header.key for _, header in slots.headers()] == [(0, 4), (1, 1)]
    slots.discard(lambda header: header.generation == 1)
    assert [header.key for _, header in slots.headers()] == [(1, 1)]
    slots.clear()
    assert not (tmp_path / "rank0").exists()


def test_a_buffer_is_mapped_once_and_grows_when_the_state_does(tmp_path):
    slots = SnapshotSlots(tmp_path / "rank0")
    _write(slots, 1, 1.0)
    mapped = slots.mapped_bytes(0)
    assert mapped >= 4000
    buffer = slots.buffer(0, 4000)
    assert buffer.data_ptr() == slots.buffer(0, 4000).data_ptr()  # reused: no new pages to fault in
    assert slots.buffer(0, mapped + 1).numel() > mapped
    slots.close()
    slots.close()


_DIE_IN_THE_MIDDLE = """
import os, signal, sys, torch, dataclasses
sys.path[:0] = {path!r}
from lightning_scale.snapshot.codec import pack
from lightning_scale.snapshot.slots import SnapshotSlots
from tests.snapshot.test_slots import HEADER
slots = SnapshotSlots({directory!r})
packed = pack({{"w": torch.full((1000,), 2.0), "step": 2}})
slot = slots.begin()
slots.buffer(slot, packed.nbytes)[:2000].fill_(255)  # half of the new state copied
if {after_copy}:
    packed.copy_into(slots.buffer(slot, packed.nbytes))
    (slots.directory / f"slot{{slot}}.tmp").write_bytes(b"half a meta")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_while_writing(directory: Path, after_copy: bool) -> None:
    script = _DIE_IN_THE_MIDDLE.format(path=sys.path, directory=str(directory), after_copy=after_copy)
    process = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], timeout=60)
    assert process.returncode == -signal.SIGKILL


def test_a_process_killed_in_the_middle_of_a_snapshot_leaves_the_previous_one_as_the_newest(tmp_path):
    for after_copy in (False, True):
        directory = tmp_path / f"after_copy_{after_copy}"
        slots = SnapshotSlots(directory)
        _write(slots, 1, 1.0)
        _write(slots, 2, 1.5)
        slots.close()
        _killed_while_writing(directory, after_copy)  # it overwrote the older slot, step 1's
        fresh = SnapshotSlots(directory)
        assert [header.step for _, header in fresh.headers()] == [2]
        _, state = fresh.read(fresh.headers()[0][0])
        assert torch.equal(state["w"], torch.full((1000,), 1.5))
        assert fresh.slot_to_write() != fresh.headers()[0][0]


def test_a_meta_of_another_release_or_a_short_bulk_file_is_no_snapshot(tmp_path):
    slots = SnapshotSlots(tmp_path / "rank0")
    slot = _write(slots, 1, 1.0)
    slots.close()
    (tmp_path / "rank0" / f"slot{slot}.bulk").write_bytes(b"short")
    assert SnapshotSlots(tmp_path / "rank0").headers() == []
    (tmp_path / "rank0" / f"slot{slot}.meta").write_bytes(b"not a pickle")
    assert SnapshotSlots(tmp_path / "rank0").headers() == []
