"""Checkpoints without a manifest (a stock ModelCheckpoint's) are judged by their content: complete torch.save archives
holding a training checkpoint, the newest first; anything else is reported with the reason."""

from __future__ import annotations

import io
import time
import uuid

import torch

from lightning_scale.checkpoint.manifest import publish_checkpoint
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.checkpoint.unvouched import find_newest_unvouched

TRAINING = {"state_dict": {"w": torch.ones(3)}, "loops": {}, "optimizer_states": [], "global_step": 4}


def saved(checkpoint: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def test_the_newest_complete_training_checkpoint_is_chosen_and_newer_unusable_files_are_reported():
    store = CheckpointStore(f"memory://unvouched-{uuid.uuid4().hex[:8]}")
    store.write_bytes("a.ckpt", saved(TRAINING))
    time.sleep(0.01)
    store.write_bytes("b.ckpt", saved(TRAINING))
    time.sleep(0.01)
    store.write_bytes("c.ckpt", saved({"state_dict": {"w": torch.ones(3)}}))  # weights only
    time.sleep(0.01)
    store.write_bytes("d.ckpt", saved(TRAINING)[:100])  # cut short
    time.sleep(0.01)
    store.write_bytes("e.txt", b"not a checkpoint name")
    name, skipped = find_newest_unvouched(store)
    assert name == "b.ckpt"
    assert [line.split(": ", 1)[0].rsplit("/", 1)[-1] for line in skipped] == ["d.ckpt", "c.ckpt"]
    assert "not a complete torch.save archive" in skipped[0] and "weights only" in skipped[1]


def test_files_with_a_manifest_are_left_to_the_manifest():
    store = CheckpointStore(f"memory://unvouched-{uuid.uuid4().hex[:8]}")
    store.write_bytes(".x.partial", saved(TRAINING))
    publish_checkpoint(store, ".x.partial", "x.ckpt", global_step=4, epoch=0, run_id="r", generation=0, world_size=1,
                       tensor_shapes={})  # fmt: skip
    assert find_newest_unvouched(store) == (None, [])
